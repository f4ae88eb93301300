"""WebSocket writes coalesced per event-loop iteration.

A grouped transaction answers dozens of Starts or reports of one session at the
same moment, and each reply frame used to be its own `send()` system call (a
fifth of a node's CPU per frame in `bench/ws_frames.py`). The corked transport
collects what one loop iteration writes to a connection and hands it to the
socket once, in order, before the loop next waits for I/O.
"""

from __future__ import annotations

import asyncio
from typing import Any

try:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
except ImportError:  # uvicorn < 0.35
    WebSocketsSansIOProtocol = None  # type: ignore[assignment,misc]


class CorkedTransport:
    """Proxy of an asyncio transport whose `write`s are joined and flushed once per loop iteration."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled = False

    def write(self, data: bytes) -> None:
        self._pending.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def websocket_protocol() -> Any:
    """The `ws` setting of the uvicorn config that serves worker sessions."""
    if WebSocketsSansIOProtocol is None:
        return "auto"

    class CorkedWebSocketProtocol(WebSocketsSansIOProtocol):
        """uvicorn's sans-I/O WebSocket protocol writing through a `CorkedTransport`."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            super().connection_made(CorkedTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]

    return CorkedWebSocketProtocol
