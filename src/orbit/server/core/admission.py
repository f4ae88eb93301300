"""Time rules of a submit, evaluated against the database clock (pure: `now` is given)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .timefmt import parse_rfc3339

AVAILABLE_AT_PAST = timedelta(minutes=5)
AVAILABLE_AT_FUTURE = timedelta(days=366)


class TimeRuleError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class TaskTimes:
    available_at: datetime
    start_deadline_at: datetime | None
    deadline_at: datetime | None


def _instant(field: str, value: str) -> datetime:
    """A request's timestamp as naive UTC; one the model let through that still has no UTC
    instant (year 1 with a positive offset, say) is the field's error, not the server's."""
    try:
        return parse_rfc3339(value)
    except ValueError as exc:
        raise TimeRuleError(field, str(exc)) from None


def resolve_times(
    now: datetime,
    *,
    available_at: str | None,
    start_deadline_at: str | None,
    deadline_at: str | None,
    deadline_seconds: int | None,
) -> TaskTimes:
    """Check a task's time windows (availability, start deadline, deadline) and turn the inputs
    into naive-UTC instants."""
    if available_at is None and start_deadline_at is None and deadline_at is None and deadline_seconds is None:
        return TaskTimes(now, None, None)  # most tasks: nothing to check
    if deadline_at is not None and deadline_seconds is not None:
        raise TimeRuleError("deadline_seconds", "give deadline_at or deadline_seconds, not both")
    avail = now
    if available_at is not None:
        avail = _instant("available_at", available_at)
        if avail < now - AVAILABLE_AT_PAST:
            raise TimeRuleError("available_at", "must not be more than 5 minutes in the past")
        if avail > now + AVAILABLE_AT_FUTURE:
            raise TimeRuleError("available_at", "must not be more than 366 days in the future")
    start_deadline = None
    if start_deadline_at is not None:
        start_deadline = _instant("start_deadline_at", start_deadline_at)
        if start_deadline <= now:
            raise TimeRuleError("start_deadline_at", "has already passed")
        if start_deadline <= avail:
            raise TimeRuleError("start_deadline_at", "must be after available_at")
    deadline = None
    if deadline_at is not None:
        deadline = _instant("deadline_at", deadline_at)
        if deadline <= now:
            raise TimeRuleError("deadline_at", "has already passed")
    elif deadline_seconds is not None:
        deadline = now + timedelta(seconds=deadline_seconds)
    return TaskTimes(avail, start_deadline, deadline)
