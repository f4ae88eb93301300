"""Trigger points of schedules, and what becomes of each due point: pure functions of naive
UTC datetimes (the database clock) and the schedule's fields.

Cron expressions are matched against *local wall-clock times* of the schedule's IANA zone
(croniter iterates naive wall times), and each wall time is placed on the UTC line here:
one that does not exist (the skipped hour of a spring-forward) never fires, and one that
exists twice (the repeated hour of a fall-back) fires once, at its first occurrence.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

MAX_INTERVAL_S = 31_622_400
MAX_CATCH_UP_WINDOW_S = 604_800
DEFAULT_CATCH_UP_WINDOW_S = 60
MAX_POINTS_PER_BATCH = 1000
# A point the scheduler reaches within this of its time is on time, not missed: the loop
# runs about once a second, so even a zero catch-up window must not skip every point.
ON_TIME_S = 5

SUBMIT, SKIP = "SUBMIT", "SKIP"
MISFIRE, OVERLAP = "MISFIRE", "OVERLAP"
CATCH_UP, LATEST = "catch_up", "latest"
ALLOW = "allow"

_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,\-]+$")
_MONTH_ORDER = "jan feb mar apr may jun jul aug sep oct nov dec".split()
_DAY_ORDER = "sun mon tue wed thu fri sat".split()
_MONTHS = frozenset(_MONTH_ORDER)
_DAYS = frozenset(_DAY_ORDER)


class Timing(NamedTuple):
    """When a schedule fires: a cron expression in a zone, or a fixed interval from an anchor."""

    cron: str | None
    interval_seconds: int | None
    timezone: str
    start_at: datetime | None
    end_at: datetime | None
    anchor_at: datetime


def cron_error(expr: str) -> str | None:
    """Why a cron expression is not a standard 5-field one (None when it is)."""
    fields = expr.split()
    if len(fields) != 5:
        return "cron: must have 5 fields (minute hour day-of-month month day-of-week)"
    if not all(_CRON_FIELD.match(f) for f in fields):
        return "cron: fields take numbers, names, *, ranges (a-b), steps (/n) and lists (a,b) only"
    for i, f in enumerate(fields):
        names = {3: _MONTHS, 4: _DAYS}.get(i, frozenset())
        for word in re.findall(r"[A-Za-z]+", f):
            if word.lower() not in names:
                return f"cron: {word!r} is not a {'month' if i == 3 else 'day' if i == 4 else 'number'} in field {i + 1}"
        for low, high in re.findall(r"([0-9A-Za-z]+)-([0-9A-Za-z]+)", f):
            top = 7 if names is _DAYS and high.lower() == "sun" else _rank(high, names)  # sat-sun: 6-7
            if _rank(low, names) > top:
                return f"cron: the range {low}-{high} in field {i + 1} runs backwards"
    if not croniter.is_valid(" ".join(fields)):
        return f"cron: {expr!r} is not a valid expression"
    return None


_NOT_ZONES = ("localtime", "posixrules", "Factory")  # host links and placeholders, not IANA zones


def timezone_error(name: str) -> str | None:
    if name in ("UTC", "Etc/UTC"):
        return None
    if name in _NOT_ZONES or name.startswith(("posix/", "right/")):
        return f"timezone: {name!r} is not an IANA time zone"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"timezone: {name!r} is not an IANA time zone"
    return None if name in _zones() else f"timezone: {name!r} is not an IANA time zone"


def _rank(token: str, names: frozenset[str]) -> int:
    """A range bound's position: a number, or a name's place in its field (jan=1, sun=0)."""
    if token.isdigit():
        return int(token)
    order = _MONTH_ORDER if names is _MONTHS else _DAY_ORDER
    return order.index(token.lower()) + (1 if names is _MONTHS else 0)


_ZONES: set[str] | None = None


def _zones() -> set[str]:
    global _ZONES
    if _ZONES is None:
        _ZONES = available_timezones() | {"UTC"}
    return _ZONES


def _utc_of_wall(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """The UTC instant of a local wall time (its first occurrence), or None if the zone skips it."""
    local = wall.replace(tzinfo=zone, fold=0)
    utc = local.astimezone(timezone.utc)
    if utc.astimezone(zone).replace(tzinfo=None) != wall:
        return None  # in a gap: the clock jumped over this wall time
    return utc.replace(tzinfo=None)


def _next_cron(expr: str, zone_name: str, after: datetime) -> datetime:
    """The first cron point strictly after `after` (naive UTC)."""
    zone = ZoneInfo(zone_name)
    wall_after = after.replace(tzinfo=timezone.utc).astimezone(zone).replace(tzinfo=None)
    # From `after`'s wall time: a point fires at its first occurrence, so no point after
    # `after` has an earlier wall time (in a repeated hour, the second pass is passed over below).
    it = croniter(expr, wall_after)
    while True:
        wall = it.get_next(datetime)
        utc = _utc_of_wall(wall, zone)
        if utc is not None and utc > after:
            return utc


def next_point(t: Timing, after: datetime) -> datetime | None:
    """The first trigger point strictly after `after` (naive UTC) within the schedule's bounds,
    or None when there is none before `end_at`. A cron expression that never matches a real
    date (`0 0 30 2 *`) raises ValueError (croniter's `CroniterBadDateError`)."""
    if t.start_at is not None and after < t.start_at:
        after = t.start_at - timedelta(microseconds=1)
    if t.interval_seconds is not None:
        step = timedelta(seconds=t.interval_seconds)
        k = (after - t.anchor_at) // step + 1 if after >= t.anchor_at else 0
        point = t.anchor_at + k * step
    else:
        assert t.cron is not None
        point = _next_cron(t.cron, t.timezone, after)
    if t.end_at is not None and point > t.end_at:
        return None
    return point


def first_point(t: Timing) -> datetime | None:
    """The schedule's first trigger point: an interval's anchor is its first point when the
    schedule has a `start_at`, otherwise one interval after it (the creation time)."""
    if t.interval_seconds is not None and t.start_at is None:
        return next_point(t, t.anchor_at)
    return next_point(t, t.anchor_at - timedelta(microseconds=1))


def due_points(t: Timing, cursor: datetime, now: datetime, limit: int = MAX_POINTS_PER_BATCH) -> list[datetime]:
    """The trigger points from `cursor` (included) up to `now`, at most `limit`."""
    points: list[datetime] = []
    point: datetime | None = cursor
    while point is not None and point <= now and len(points) < limit:
        points.append(point)
        point = next_point(t, point)
    return points


class Decision(NamedTuple):
    trigger_at: datetime
    action: str  # SUBMIT or SKIP
    reason: str | None = None  # MISFIRE or OVERLAP when skipped


def decide(points: list[datetime], now: datetime, *, policy: str, window_s: int, overlap: str,
           previous_unfinished: bool, more_due: bool = False) -> list[Decision]:
    """What becomes of each due point, in order. A point later than `ON_TIME_S` is missed:
    `catch_up` generates every missed point still inside the window and skips older ones;
    `latest` generates only the most recent point inside the window (or an on-time one) and
    skips the others. With overlap `skip`, a point is skipped while the schedule's previous
    task is unfinished — a task generated earlier in the same batch counts. `more_due`: the
    batch stopped at its limit with later points due, so under `latest` none of it runs."""
    horizon = now - timedelta(seconds=max(window_s, ON_TIME_S))
    inside = [p for p in points if p >= horizon]
    keep = set(inside) if policy == CATCH_UP else set() if more_due else set(inside[-1:])
    out: list[Decision] = []
    busy = previous_unfinished
    for p in points:
        if p not in keep:
            out.append(Decision(p, SKIP, MISFIRE))
        elif overlap != ALLOW and busy:
            out.append(Decision(p, SKIP, OVERLAP))
        else:
            out.append(Decision(p, SUBMIT))
            busy = True
    return out


def relative_deadline(trigger_at: datetime, seconds: int | None) -> datetime | None:
    """A template's `deadline_seconds` / `start_deadline_seconds`, counted from the trigger point."""
    return None if seconds is None else trigger_at + timedelta(seconds=seconds)
