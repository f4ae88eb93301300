"""The database-held one-second Start window (the rate window).

The first successful Start opens a window; the first Start after it ends opens
the next. Claims reserve window space for leased-but-not-started tasks, so
`room = rate - used - reserved`. Pure functions: the caller passes `now` from
the database clock and writes the result back in the same transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

WINDOW = timedelta(seconds=1)


class RateWindow(NamedTuple):
    """A one-second window: when it opened, Starts counted in it, Starts reserved by claims.
    A named tuple: one is built per Start and per layer on the hot path."""

    start: datetime | None
    used: int
    reserved: int

    def is_open(self, now: datetime) -> bool:
        return self.start is not None and self.start <= now < self.start + WINDOW

    def used_now(self, now: datetime) -> int:
        """Starts counted against `now`'s window; an ended window counts nothing."""
        return self.used if self.is_open(now) else 0


def claim_room(window: RateWindow, rate: int, now: datetime) -> int:
    """How many more leases may reserve Start space right now."""
    return max(0, rate - window.used_now(now) - window.reserved)


class StartDecision(NamedTuple):
    allowed: bool
    window: RateWindow
    retry_after_ms: int = 0


def authorize_start(window: RateWindow, rate: int, now: datetime, *, reserved: bool) -> StartDecision:
    """Count one Start, consuming the caller's reservation; refuse past the rate.

    A refusal changes nothing: the caller writes nothing and answers RATE_LIMITED.
    """
    if window.is_open(now):
        start, used = window.start, window.used
    else:
        start, used = now, 0
    if used + 1 > rate:
        assert start is not None
        remaining = (start + WINDOW) - now
        return StartDecision(False, window, max(1, -(-remaining // timedelta(milliseconds=1))))
    new_reserved = window.reserved - 1 if reserved and window.reserved > 0 else window.reserved
    return StartDecision(True, RateWindow(start, used + 1, new_reserved))
