"""Bounded waiting: slots taken in arrival order, each wait for one bounded in time.

A node that takes every request it is offered only queues them: past what its event loop, its
database pools and its group commits can serve, each extra request adds to every other's wait
(one node under a client offering 2,000 concurrent submits answered them after up to 46 s).
`Slots` bounds such a queue. A caller takes a slot at once while fewer than `limit` are taken;
otherwise it waits, in arrival order, at most `wait_s` for one, and at most `max_waiting` callers
wait at a time; the others are refused at once. The node's admission of HTTP requests
(`http/admission.py`) and the store's connection pools (`store/db.py`) are built on it; a refusal
costs no I/O and becomes UNAVAILABLE with a retry hint, which the client may resend with the
same identity.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterator
from contextvars import ContextVar

# How long the waits of one admitted request (for database connections, SQLite's writer, its
# turn in a group commit) may last together; a wait that would end later is refused instead.
WAIT_BUDGET_S = 2.0

# When the current request's waits must be over (time.monotonic()); None outside a request.
_deadline: ContextVar[float | None] = ContextVar("orbit_wait_deadline", default=None)


def deadline() -> float | None:
    return _deadline.get()


@contextlib.contextmanager
def waits_until(at: float | None) -> Iterator[None]:
    """Within this block, `time_left` is bounded by `at` (None: by nothing)."""
    token = _deadline.set(at)
    try:
        yield
    finally:
        _deadline.reset(token)


def set_deadline(at: float | None) -> None:
    """Move the current deadline (inside `waits_until`, which restores the previous one)."""
    _deadline.set(at)


def time_left(longest: float) -> float:
    """How long a wait may last now: `longest`, or less when the current deadline comes sooner."""
    at = _deadline.get()
    return longest if at is None else min(longest, at - time.monotonic())


class Slots:
    """`limit` slots; `refused` counts the callers that got none."""

    def __init__(self, limit: int, wait_s: float, max_waiting: int | None = None) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.wait_s = max(0.0, wait_s)
        self.max_waiting = limit if max_waiting is None else max(0, max_waiting)
        self.taken = 0
        self.refused = 0
        # Each waiter's future: True once a leaving holder handed it its slot, False once its
        # wait is over; it leaves this queue either way.
        self._waiters: deque[asyncio.Future[bool]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_enter(self) -> bool:
        """Take a free slot without waiting (never ahead of a waiter)."""
        if self.taken < self.limit and not self._waiters:
            self.taken += 1
            return True
        return False

    async def enter(self, wait_s: float | None = None) -> bool:
        """Take a slot, waiting at most `wait_s` (default: the slots' own) for one; False (counted
        in `refused`) when none came."""
        if self.try_enter():
            return True
        wait_s = self.wait_s if wait_s is None else wait_s
        if len(self._waiters) >= self.max_waiting or wait_s <= 0:
            self.refused += 1
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(fut)
        timer = loop.call_later(wait_s, self._expire, fut)
        try:
            granted = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result():
                self.leave()  # handed a slot just as the waiter went away: pass it on
            else:
                self._forget(fut)
            raise
        finally:
            timer.cancel()
        if not granted:
            self.refused += 1
        return granted

    def leave(self) -> None:
        """Give a slot back: to the longest waiter, or to the free ones."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(True)  # the slot changes hands: `taken` stays
                return
        self.taken -= 1

    def _expire(self, fut: asyncio.Future[bool]) -> None:
        if not fut.done():
            fut.set_result(False)
            self._forget(fut)

    def _forget(self, fut: asyncio.Future[bool]) -> None:
        try:
            self._waiters.remove(fut)
        except ValueError:
            pass
