"""Counter changes of one transaction, applied to the usage rows in one fixed order.

Rows are written sorted, queues before applications, so that any two
transactions touching the same usage rows take their locks in the same order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from ..core.rate_window import RateWindow
from ..store.db import Database, Tx

T = TypeVar("T")


@dataclass
class Delta:
    unfinished: int = 0
    permits: int = 0
    reserved: int = 0

    def is_zero(self) -> bool:
        return not (self.unfinished or self.permits or self.reserved)

    def add(self, other: Delta) -> None:
        self.unfinished += other.unfinished
        self.permits += other.permits
        self.reserved += other.reserved


class UsageChanges:
    def __init__(self) -> None:
        self.queues: dict[str, Delta] = defaultdict(Delta)
        self.apps: dict[str, Delta] = defaultdict(Delta)
        self.windows: dict[str, RateWindow] = {}
        self.starts: dict[str, tuple[int, int, datetime]] = {}

    def add(self, queue_id: str, application_id: str, *, unfinished: int = 0, permits: int = 0, reserved: int = 0) -> None:
        for d in (self.queues[queue_id], self.apps[application_id]):
            d.unfinished += unfinished
            d.permits += permits
            d.reserved += reserved

    def merge(self, other: UsageChanges) -> None:
        for qid, d in other.queues.items():
            self.queues[qid].add(d)
        for aid, d in other.apps.items():
            self.apps[aid].add(d)
        self.windows.update(other.windows)

    def set_window(self, queue_id: str, window: RateWindow) -> None:
        """The queue's rate window after this transaction (its `reserved` is not written here)."""
        self.windows[queue_id] = window

    def count_starts(self, queue_id: str, n: int, rate: int, now: datetime) -> None:
        """Count `n` Starts at `now` on the queue's rate window *in the UPDATE itself* (MySQL, strict
        mode), instead of writing a window computed from a read: the window as the row holds it when
        the UPDATE locks it gets them, exactly as `rate_window.authorize_start` would, or the
        statement fails on a NULL (`BAD_NULL`) when they no longer fit, before the COMMIT runs."""
        self.windows.pop(queue_id, None)
        self.starts[queue_id] = (n, rate, now)

    async def apply(self, tx: Tx) -> None:
        for qid in sorted(set(self.queues) | set(self.windows) | set(self.starts)):
            d = self.queues.get(qid, Delta())
            sets, params = _delta_sets(d)
            if d.permits < 0:
                # A claim that planned before locking this row checks it: see dispatch.claim_many.
                now = await tx.now()
                sets.append("permits_freed_at = CASE WHEN permits_freed_at IS NULL OR permits_freed_at < ? "
                            "THEN ? ELSE permits_freed_at END")
                params += [now, now]
            w = self.windows.get(qid)
            if w is not None:
                sets += ["rate_window_start = ?", "rate_window_used = ?"]
                params += [w.start, w.used]
            counted = self.starts.get(qid)
            if counted is not None:
                n, rate, now = counted
                sets += [_COUNT_STARTS_USED, _COUNT_STARTS_START]  # in this order: the first reads the old start
                params += [now, now, n, rate, n, n, rate, n, now, now]
            if sets:
                await tx.defer(f"UPDATE queue_usage SET {', '.join(sets)} WHERE queue_id = ?", [*params, qid])
        for aid in sorted(self.apps):
            sets, params = _delta_sets(self.apps[aid])
            if sets:
                await tx.defer(f"UPDATE application_usage SET {', '.join(sets)} WHERE application_id = ?", [*params, aid])


# The window is open at `now` when it started at most a second before; one opened by a transaction
# with a later clock cannot take these Starts (NULL); a window that ended gives way to one at `now`.
_COUNT_STARTS_USED = (
    "rate_window_used = CASE WHEN rate_window_start > ? THEN NULL "
    "WHEN rate_window_start + INTERVAL 1 SECOND > ? THEN "
    "CASE WHEN rate_window_used + ? <= ? THEN rate_window_used + ? END "
    "WHEN ? <= ? THEN ? END")
_COUNT_STARTS_START = "rate_window_start = CASE WHEN rate_window_start + INTERVAL 1 SECOND > ? THEN rate_window_start ELSE ? END"


def _delta_sets(d: Delta) -> tuple[list[str], list[int]]:
    sets: list[str] = []
    params: list[int] = []
    for col, value in (("unfinished", d.unfinished), ("permits_in_use", d.permits), ("rate_reserved", d.reserved)):
        if value:
            sets.append(f"{col} = {col} + ?")
            params.append(value)
    return sets, params


class PlanNoLongerHolds(Exception):
    """The usage row moved between the unlocked plan and the lock in a way the plan did not allow."""


async def lock_last(db: Database, body: Callable[[Tx, bool], Awaitable[T]]) -> T:
    """Run `body(tx, optimistic=True)`, which plans on unlocked reads and locks the hot usage rows
    last (held only until the commit); if the plan no longer holds under the lock, it raises
    `PlanNoLongerHolds` and runs again as `body(tx, False)` with the usage rows locked first."""
    try:
        return await db.fast_transaction(lambda tx: body(tx, True))
    except PlanNoLongerHolds:
        return await db.fast_transaction(lambda tx: body(tx, False))
