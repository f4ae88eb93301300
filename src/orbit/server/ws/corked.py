"""The server's WebSocket protocol, writing through a `CorkedTransport` (`orbit._cork`).

A grouped transaction answers dozens of Starts or reports of one session at the
same moment; rather than a `send()` system call per reply frame, the corked
transport collects what one loop iteration writes to a connection and hands it
to the socket once, in order, before the loop next waits for I/O.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..._cork import CorkedTransport

try:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
except ImportError:  # uvicorn < 0.35
    WebSocketsSansIOProtocol = None  # type: ignore[assignment,misc]


# The ASGI scope extension through which a session writes text frames without the ASGI send chain.
SEND_TEXT_NOW = "orbit.websocket.send_text_now"


def websocket_protocol() -> Any:
    """The `ws` setting of the uvicorn config that serves worker sessions."""
    if WebSocketsSansIOProtocol is None:
        return "auto"

    class CorkedWebSocketProtocol(WebSocketsSansIOProtocol):
        """uvicorn's sans-I/O WebSocket protocol writing through a `CorkedTransport`, which also
        offers the application a synchronous text-frame write (`SEND_TEXT_NOW` in the scope's
        extensions): a session answers a grouped command from the transaction's callback,
        without a task and three `await` layers per reply frame."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            super().connection_made(CorkedTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]

        def handle_connect(self, event: Any) -> None:
            super().handle_connect(event)
            scope = getattr(self, "scope", None)
            if scope is not None:
                scope["extensions"][SEND_TEXT_NOW] = self.send_text_now

        def send_receive_event_to_app(self) -> None:
            """A text message that is not UTF-8 closes the socket with 1008, as any frame that is
            not JSON text does (the session's rule), and quietly: uvicorn would close it with
            1007 and a traceback at error level, which any client could then write at will."""
            if self.curr_msg_data_type == "text" and not self.close_sent:
                data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
                if not data.isascii():
                    try:
                        data.decode()
                    except UnicodeDecodeError:
                        self.frames = []
                        self.conn.send_close(1008, "frames must be UTF-8 JSON text")
                        self.handle_parser_exception()
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
