"""The server's WebSocket protocol, writing through a `CorkedTransport` (`orbit._cork`).

A grouped transaction answers dozens of Starts or reports of one session at the
same moment; rather than a `send()` system call per reply frame, the corked
transport collects what one loop iteration writes to a connection and hands it
to the socket once, in order, before the loop next waits for I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from websockets.frames import apply_mask
from websockets.protocol import State

from ..._cork import CorkedTransport
from ..._frames import at_frame_boundary, frame_head

try:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
except ImportError:  # uvicorn < 0.35
    WebSocketsSansIOProtocol = None  # type: ignore[assignment,misc]


# The ASGI scope extension through which a session writes text frames without the ASGI send chain.
SEND_TEXT_NOW = "orbit.websocket.send_text_now"
# The one through which it takes text messages as they are parsed, without the ASGI receive chain.
RECEIVE_TEXT_NOW = "orbit.websocket.receive_text_now"


def websocket_protocol() -> Any:
    """The `ws` setting of the uvicorn config that serves worker sessions."""
    if WebSocketsSansIOProtocol is None:
        return "auto"

    class CorkedWebSocketProtocol(WebSocketsSansIOProtocol):
        """uvicorn's sans-I/O WebSocket protocol writing through a `CorkedTransport`, which also
        offers the application a synchronous text-frame write (`SEND_TEXT_NOW` in the scope's
        extensions): a session answers a grouped command from the transaction's callback,
        without a task and three `await` layers per reply frame."""

        _on_text: Callable[[bytes], None] | None = None
        _held = False  # the session stopped reading: too many of its frames are in flight
        _own: bytearray | None = None  # bytes of frames not whole yet, once frames are cut here
        _owned = False  # frames were cut here, and no longer are (the connection is closing)
        _limit: int | None = None  # the largest frame the library takes

        def data_received(self, data: bytes) -> None:
            """Once the session takes its text frames here and the library's parser rests between
            two frames, frames are cut here: a final, masked text frame without extension bits
            goes to the session, any other frame, whole, to the library (handshake, pings,
            close, fragments, compression, the size limit and every refusal stay the library's)."""
            own = self._own
            if own is None:
                super().data_received(data)
                if (self._on_text is not None and not self._owned and not self.frames
                        and self.conn.state is State.OPEN and at_frame_boundary(self.conn)):
                    self._own = bytearray()
                    limits = [getattr(self.conn, name, None) for name in ("max_message_size", "max_fragment_size")]
                    self._limit = min((n for n in limits if n is not None), default=None)
                return
            own += data
            if self.conn.state is not State.OPEN:  # closing: what follows is the library's
                self._give_back(bytes(own))
                return
            pos, end = 0, len(own)
            limit = self._limit
            while (head := frame_head(own, pos, end)) is not None:
                head1, head2, at, stop = head
                if limit is not None and stop - at > limit:
                    self._give_back(bytes(own[pos:]))  # the library refuses it from its head
                    return
                if stop > end:
                    break
                if head1 == 0x81 and head2 & 0x80 and not self.frames:
                    if not self._text_now(apply_mask(own[at:stop], own[at - 4:at])):
                        self._own, self._owned = None, True
                        return
                else:
                    super().data_received(bytes(own[pos:stop]))
                    if self.conn.state is not State.OPEN:
                        self._give_back(bytes(own[stop:]))
                        return
                pos = stop
            del own[:pos]

        def _give_back(self, rest: bytes) -> None:
            """Frames are no longer cut here: the library reads from here on."""
            self._own, self._owned = None, True
            if rest:
                super().data_received(rest)

        def _text_now(self, data: bytes) -> bool:
            """A whole text message to the session; False when it is not UTF-8 (`_utf8`)."""
            if not self._utf8(data):
                return False
            assert self._on_text is not None
            self._on_text(data)
            return True

        def _utf8(self, data: bytes) -> bool:
            """Whether a text message is UTF-8; if not, the socket closes with 1008, as for any
            frame that is not JSON text."""
            if not data.isascii():
                try:
                    data.decode()
                except UnicodeDecodeError:
                    self.conn.send_close(1008, "frames must be UTF-8 JSON text")
                    self.handle_parser_exception()
                    return False
            return True

        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            super().connection_made(CorkedTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]

        def handle_connect(self, event: Any) -> None:
            super().handle_connect(event)
            scope = getattr(self, "scope", None)
            if scope is not None:
                scope["extensions"][SEND_TEXT_NOW] = self.send_text_now
                scope["extensions"][RECEIVE_TEXT_NOW] = self.receive_text_now

        def receive_text_now(self, on_text: Callable[[bytes], None]) -> Callable[[bool], None]:
            """From now on, hand every whole text message (UTF-8 checked) to `on_text` as it is
            parsed, in order: no queue, no task to wake, and no pause of the socket after each
            message as the ASGI path makes. Text messages already queued go first. Other messages
            (binary, the disconnect) still come through `receive`. Returns `hold`: `hold(True)`
            stops reading the socket, `hold(False)` reads again (the session's flow control)."""
            self._on_text = on_text
            queued = []
            while not self.queue.empty():
                queued.append(self.queue.get_nowait())
            for message in queued:
                if message.get("type") == "websocket.receive" and message.get("text") is not None:
                    on_text(message["text"].encode())
                else:
                    self.queue.put_nowait(message)
            self._read_on()
            return self._hold

        def _read_on(self) -> None:
            """The queue that paused the socket is empty: read again, unless the session holds it."""
            if self.read_paused and self.queue.empty():
                self.read_paused = False
                if not self._held:
                    self.transport.resume_reading()

        def _hold(self, held: bool) -> None:
            if held == self._held:
                return
            self._held = held
            if self.transport.is_closing():
                return
            if held:
                self.transport.pause_reading()
            elif not self.read_paused:
                self.transport.resume_reading()

        async def receive(self) -> Any:
            """As uvicorn's, except that a socket the session holds stays paused."""
            message = await self.queue.get()
            self._read_on()
            return message

        def send_receive_event_to_app(self) -> None:
            """A text message that is not UTF-8 closes the socket with 1008, as any frame that is
            not JSON text does (the session's rule), and quietly: uvicorn would close it with
            1007 and a traceback at error level, which any client could then write at will."""
            if self.curr_msg_data_type == "text" and not self.close_sent:
                data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
                if self._on_text is not None:
                    self.frames = []
                    self._text_now(data)
                    return
                if not self._utf8(data):
                    self.frames = []
                    return
            super().send_receive_event_to_app()

        def send_text_now(self, text: str) -> bool:
            """Write one text frame if the accepted connection is open and writable; False when
            the caller must use the ASGI send (which waits for the socket to drain)."""
            if (not self.handshake_complete or self.close_sent or self.disconnected
                    or self.initial_response is not None or not self.writable.is_set()):
                return False
            self.conn.send_text(text.encode())
            self.transport.write(b"".join(self.conn.data_to_send()))
            return True

    return CorkedWebSocketProtocol
