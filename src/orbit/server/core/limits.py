"""The cluster-wide limits as pure rules: backlog admission, claim grants, Start counting.

Each rule has its one Python home here. Where the store must also decide a rule inside
SQL for speed (a guarded `UPDATE … CASE` that travels with the COMMIT), that SQL is
tested against the function here over generated cases (tests/integration/test_usage_guards.py).
The caller passes rows and the database clock; nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .rate_window import RateWindow, authorize_start, claim_room

QUEUE_FULL, APPLICATION_FULL = "QUEUE_FULL", "APPLICATION_FULL"


# ---------------------------------------------------------------- backlog (unfinished tasks)


def backlog_fits(unfinished: int, n: int, limit: int) -> bool:
    """Whether `n` more unfinished tasks fit under `limit` (the guarded UPDATE's rule)."""
    return unfinished + n <= limit


@dataclass(frozen=True)
class Backlog:
    """A queue's and its application's unfinished counts and limits."""

    queue_unfinished: int
    queue_limit: int
    app_unfinished: int
    app_limit: int

    def room(self) -> int:
        """How many more tasks both limits admit: the largest n that `backlog_fits` both."""
        return max(0, min(self.queue_limit - self.queue_unfinished, self.app_limit - self.app_unfinished))


def admit_in_order(n: int, backlog: Backlog) -> list[str | None]:
    """For `n` tasks in submission order: None (admitted) or the limit that refuses it. Once a
    limit refuses, every later task is refused too, so admission never reorders a batch."""
    out: list[str | None] = []
    admitted = 0
    refused: str | None = None
    for _ in range(n):
        if refused is None and not backlog_fits(backlog.queue_unfinished, admitted + 1, backlog.queue_limit):
            refused = QUEUE_FULL
        elif refused is None and not backlog_fits(backlog.app_unfinished, admitted + 1, backlog.app_limit):
            refused = APPLICATION_FULL
        if refused is None:
            admitted += 1
        out.append(refused)
    return out


# ---------------------------------------------------------------- claims (permits and rate space)


@dataclass(frozen=True)
class QueueLimits:
    """A queue's controls and the usage row they are checked against."""

    paused: bool
    max_concurrency: int
    rate_per_second: int
    permits_in_use: int
    window: RateWindow


def grant_size(wanted: int, q: QueueLimits, now: datetime) -> int:
    """How many leases a claim may grant: free permits and free rate space, at most `wanted`."""
    if q.paused:
        return 0
    return max(0, min(wanted, q.max_concurrency - q.permits_in_use, claim_room(q.window, q.rate_per_second, now)))


def may_lease(q: QueueLimits, waiting: int, now: datetime) -> bool:
    """Whether a claim on the queue could lease anything now: a task waits (`unfinished` beyond
    the permits in use) and the queue's own limits grant one. Necessary, not sufficient (the task
    may not be due, the application or a resource key may have no room): a node's poll asks it
    before it wakes the claims waiting there."""
    return waiting > 0 and grant_size(1, q, now) > 0


def grant_still_fits(leases: int, q: QueueLimits, now: datetime) -> bool:
    """Whether `leases` granted on an unlocked snapshot still fit the usage row as locked."""
    if q.paused or (q.window.start is not None and q.window.start > now):
        return False  # a window opened by a transaction with a later clock: only the locked order is exact
    return (q.permits_in_use + leases <= q.max_concurrency
            and claim_room(q.window, q.rate_per_second, now) >= leases)


# ---------------------------------------------------------------- Starts (rate window)


def count_starts(window: RateWindow, rate: int, now: datetime, reserved: list[bool]) -> RateWindow | None:
    """The window after counting these Starts (each consuming its reservation if it holds one),
    or None if one of them no longer fits; the guarded UPDATE of the store decides the same."""
    if window.start is not None and window.start > now:
        return None
    for r in reserved:
        decision = authorize_start(window, rate, now, reserved=r)
        if not decision.allowed:
            return None
        window = decision.window
    return window
