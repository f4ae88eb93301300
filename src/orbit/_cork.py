"""Writes coalesced per event-loop iteration, for the server's and the SDK's WebSocket connections.

Whoever answers or sends many frames at the same moment (a group commit's replies, a worker's
Starts and reports) would otherwise make a `send()` system call per frame on both ends; the
corked transport collects what one loop iteration writes to a connection and hands it to the
socket once, in order, before the loop next waits for I/O.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["CorkedTransport"]


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
