"""A pool of driver connections whose every wait is bounded.

asyncmy's own pool queues its waiters on one lock and opens new connections while holding it: a
burst that finds the pool small waits for one connect after another (each slow when the database
is busy), and a waiter that gives up must take the lock again before it can leave. Under overload
a wait for a connection was seen to last 31 s although it was "bounded" at 10 s. Here the wait
is for one of `maxsize` slots (`Slots`: in arrival order, bounded in time); whoever holds a slot
takes a free connection or opens one itself, beside the others, without a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from ..overload import Slots


def _usable(conn: Any) -> bool:
    """Open, and its stream neither closed by the server nor failed (what asyncmy's pool checks
    before handing a connection out: the server may have closed an idle one)."""
    return conn.connected and not getattr(conn, "_stream_broken", False)


class DriverPool:
    """At most `maxsize` connections, opened on demand by `connect` and kept while healthy; one
    idle for more than `recycle_s` is closed instead of being handed out."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], *, maxsize: int, recycle_s: float) -> None:
        self._connect = connect
        self.maxsize = maxsize
        self._recycle_s = recycle_s
        self._free: deque[Any] = deque()
        self._slots = Slots(maxsize, 0.0, max_waiting=sys.maxsize)
        self.size = 0  # open connections: idle, handed out, or being opened
        self._closing = False

    @property
    def freesize(self) -> int:
        return len(self._free)

    @property
    def waiting(self) -> int:
        return self._slots.waiting

    async def acquire(self, wait_s: float) -> Any | None:
        """A connection, after waiting at most `wait_s` for a slot; None when none came in time.
        Errors of opening one (the database unreachable) are raised."""
        if self._closing:
            raise RuntimeError("the pool is closed")
        if not self._slots.try_enter() and not await self._slots.enter(wait_s):
            return None
        try:
            now = asyncio.get_running_loop().time()
            while self._free:
                conn = self._free.popleft()
                if _usable(conn) and now - conn.last_usage <= self._recycle_s:
                    return conn
                self._discard(conn)
            self.size += 1
            try:
                return await self._connect()
            except BaseException:
                self.size -= 1
                raise
        except BaseException:
            self._slots.leave()
            raise

    def release(self, conn: Any) -> None:
        """Take a connection back: kept if it is open and outside a transaction, else closed."""
        try:
            if not self._closing and _usable(conn) and not conn.get_transaction_status():
                self._free.append(conn)
            else:
                self._discard(conn)
        finally:
            self._slots.leave()

    def _discard(self, conn: Any) -> None:
        self.size -= 1
        with contextlib.suppress(Exception):
            conn.close()

    async def clear(self) -> None:
        """Close the idle connections (after an outage they are dead)."""
        while self._free:
            conn = self._free.popleft()
            self.size -= 1
            try:
                await conn.ensure_closed()
            except Exception:
                conn.close()

    def close(self) -> None:
        """Close the idle connections now and the others as they come back."""
        self._closing = True
        while self._free:
            self._discard(self._free.popleft())

    async def wait_closed(self) -> None:
        await self.clear()
