"""When the deadline sweep must next look at a task (its total and start deadlines).

The sweep finds its work through one indexed column, `tasks.sweep_at`, set when
a task is accepted and afterwards moved on only by the sweep itself. The hot
dispatch path (claim, Start, complete) never touches it, so a state change costs
no deadline-index maintenance. Pure functions: the caller passes the row and the
database clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from . import states


def start_deadline_applies(state: str, attempts: int) -> bool:
    """A start deadline bounds the first start only: a waiting or leased task never started."""
    return state in (states.WAITING, states.LEASED) and attempts == 0


def next_sweep(state: str, attempts: int, deadline_at: datetime | None, start_deadline_at: datetime | None,
               cancel_requested: bool) -> datetime | None:
    """The earliest deadline still able to act on the task, or None when none can."""
    if deadline_at is None and start_deadline_at is None:
        return None  # most tasks have none
    if state in (states.WAITING, states.LEASED):
        times = [deadline_at]
        if start_deadline_applies(state, attempts):
            times.append(start_deadline_at)
    elif state == states.RUNNING and not cancel_requested:
        times = [deadline_at]
    else:
        return None  # finished, under review, or a running task already asked to stop
    present = [t for t in times if t is not None]
    return min(present) if present else None


@dataclass(frozen=True)
class SweepAction:
    """What the sweep does with a task whose `sweep_at` has come: `fail` (with a code),
    `cancel` (a running task past its total deadline), or only move `sweep_at` on."""

    kind: str  # "fail" | "cancel" | "reschedule"
    code: str | None = None
    message: str | None = None
    next_sweep_at: datetime | None = None


def sweep_action(state: str, attempts: int, deadline_at: datetime | None, start_deadline_at: datetime | None,
                 cancel_requested: bool, now: datetime) -> SweepAction:
    total_passed = deadline_at is not None and deadline_at <= now
    if state in (states.WAITING, states.LEASED):
        start_passed = (start_deadline_applies(state, attempts) and start_deadline_at is not None
                        and start_deadline_at <= now)
        if total_passed and not (start_passed and start_deadline_at < deadline_at):  # type: ignore[operator]
            return SweepAction("fail", "DEADLINE_EXCEEDED", "the total deadline passed")
        if start_passed:
            return SweepAction("fail", "START_DEADLINE_EXCEEDED", "the start deadline passed before any start")
    elif state == states.RUNNING and total_passed and not cancel_requested:
        return SweepAction("cancel", message="the total deadline passed")
    return SweepAction("reschedule", next_sweep_at=next_sweep(state, attempts, deadline_at, start_deadline_at,
                                                              cancel_requested))
