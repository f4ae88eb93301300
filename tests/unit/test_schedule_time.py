"""Trigger points and misfire/overlap decisions of schedules (orbit.server.core.schedule_time).

Pure functions of naive UTC datetimes: no database, no network. Expected instants are worked
out by hand from the zones' published rules for 2026-2028:

- Europe/Berlin: CET (+1) / CEST (+2); 2026-03-29 02:00 -> 03:00 at 01:00 UTC,
  2026-10-25 03:00 -> 02:00 at 01:00 UTC (02:00-03:00 happens twice).
- America/New_York: EST (-5) / EDT (-4); 2026-03-08 02:00 -> 03:00 at 07:00 UTC,
  2026-11-01 02:00 -> 01:00 at 06:00 UTC (01:00-02:00 happens twice).
- Australia/Sydney: AEST (+10) / AEDT (+11); 2026-04-05 03:00 -> 02:00 at 2026-04-04 16:00 UTC
  (02:00-03:00 happens twice), 2026-10-04 02:00 -> 03:00 at 2026-10-03 16:00 UTC.
"""

from __future__ import annotations

from collections import Counter
from datetime import date, datetime, time, timedelta, timezone
from typing import NamedTuple
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orbit.server.core.schedule_time import (
    ALLOW,
    CATCH_UP,
    DEFAULT_CATCH_UP_WINDOW_S,
    LATEST,
    MAX_INTERVAL_S,
    MAX_POINTS_PER_BATCH,
    MISFIRE,
    ON_TIME_S,
    OVERLAP,
    SKIP,
    SUBMIT,
    Decision,
    Timing,
    cron_error,
    decide,
    due_points,
    first_point,
    next_point,
    relative_deadline,
    timezone_error,
)

UTC = timezone.utc
US = timedelta(microseconds=1)
ANCHOR = datetime(2026, 1, 1)  # creation time of the cron schedules below (naive UTC)


def cron(expr: str, tz: str = "UTC", *, start_at: datetime | None = None, end_at: datetime | None = None,
         anchor: datetime = ANCHOR) -> Timing:
    return Timing(expr, None, tz, start_at, end_at, anchor)


def every(seconds: int, anchor: datetime, *, start_at: datetime | None = None,
          end_at: datetime | None = None) -> Timing:
    return Timing(None, seconds, "UTC", start_at, end_at, anchor)


def walk(t: Timing, after: datetime, n: int) -> list[datetime]:
    """The next n points after `after` (fewer if the schedule ends)."""
    out: list[datetime] = []
    p: datetime | None = after
    while len(out) < n:
        p = next_point(t, p)
        if p is None:
            break
        out.append(p)
    return out


def walk_until(t: Timing, after: datetime, until: datetime) -> list[datetime]:
    """The points p with after < p <= until."""
    out: list[datetime] = []
    p = next_point(t, after)
    while p is not None and p <= until:
        out.append(p)
        p = next_point(t, p)
    return out


def local(utc: datetime, tz: str) -> datetime:
    """The aware local time of a naive UTC instant (fold=1 marks the second pass of a repeated time)."""
    return utc.replace(tzinfo=UTC).astimezone(ZoneInfo(tz))


def strictly_increasing(xs: list[datetime]) -> bool:
    return all(a < b for a, b in zip(xs, xs[1:]))


# --------------------------------------------------------------------------- cron_error


@pytest.mark.parametrize(
    "expr",
    [
        "* * * * *",
        "*/15 * * * *",
        "*/1 */2 */3 */4 */5",
        "0 9-17 * * *",
        "0 9-17/2 * * *",
        "0,15,30,45 * * * *",
        "5,10-20/5,50 0-23/6 1,15 * *",
        "0 0 1 jan *",
        "0 0 1 JAN,Jul *",
        "0 0 1 Jan-Mar *",
        "0 0 1 jan-dec/3 *",
        "0 9 * * mon",
        "0 9 * * MON-FRI",
        "0 9 * * Mon,wEd,FRI",
        "0 9 * * mon-fri/2",
        "0 0 * * Sat-Sun",
        "0 0 * * 7",
        "0 0 * * 0-7",
        "0 0 * * 5-7",
        "0 0 13 * fri",
        "0 0 31 * *",
        "0 0 29 2 *",
        "59 23 31 12 6",
        "00 00 01 01 *",
        "0  0  *  *  *",
        "\t0 0 * * *\n",
    ],
)
def test_cron_error_accepts_standard_expressions(expr):
    assert cron_error(expr) is None


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        # field count
        ("* * * *", "5 fields"),
        ("0 0 * * * *", "5 fields"),
        ("0 0 0 * * * 2026", "5 fields"),
        ("", "5 fields"),
        ("   ", "5 fields"),
        ("garbage", "5 fields"),
        # macros and non-standard characters
        ("@daily", "5 fields"),
        ("@hourly", "5 fields"),
        ("@reboot", "5 fields"),
        ("0 0 L * *", "'L'"),
        ("0 0 * * 5L", "'L'"),
        ("0 0 15W * *", "'W'"),
        ("0 0 LW * *", "'LW'"),
        ("0 0 * * 5#2", "fields take"),
        ("0 0 ? * *", "fields take"),
        ("0 0 * * ?", "fields take"),
        ("0 0 H * *", "'H'"),
        ("H * * * *", "'H'"),
        ("0 0 * * mon;tue", "fields take"),
        ("0 0 * * mon.", "fields take"),
        # out of range
        ("60 * * * *", "not a valid"),
        ("-1 * * * *", "not a valid"),
        ("0 24 * * *", "not a valid"),
        ("0 0 32 * *", "not a valid"),
        ("0 0 0 * *", "not a valid"),
        ("0 0 * 13 *", "not a valid"),
        ("0 0 * 0 *", "not a valid"),
        ("0 0 * * 8", "not a valid"),
        ("0-60 * * * *", "not a valid"),
        # malformed steps and lists
        ("*/0 * * * *", "not a valid"),
        ("*/ * * * *", "not a valid"),
        ("0 0 1-31/0 * *", "not a valid"),
        ("1,,2 * * * *", "not a valid"),
        # words that are not names of the field
        ("0 0 * mon *", "not a month"),
        ("0 0 * * jan", "not a day"),
        ("0 0 mon * *", "not a number"),
        ("mon * * * *", "not a number"),
        ("0 jan * * *", "not a number"),
        ("0 0 * january *", "not a month"),
        ("0 0 * * sunday", "not a day"),
        ("0 0 * * monday-friday", "not a day"),
        ("a-b * * * *", "not a number"),
        ("x y z w v", "not a number"),
    ],
)
def test_cron_error_rejects(expr, why):
    err = cron_error(expr)
    assert err is not None and err.startswith("cron:")
    assert why in err


@pytest.mark.parametrize("expr", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"])
def test_cron_that_can_never_fire_passes_the_syntax_check_and_raises_value_error(expr):
    # cron_error checks the syntax only; a date that never comes (Feb 30, Apr 31) surfaces as a
    # ValueError (croniter.CroniterBadDateError) from the point computation, which
    # services/schedules.py turns into a 400 on create and configure.
    assert cron_error(expr) is None
    with pytest.raises(ValueError):
        first_point(cron(expr))
    with pytest.raises(ValueError):
        next_point(cron(expr), datetime(2026, 6, 1))


def test_names_mean_the_same_as_numbers_in_any_case():
    after = datetime(2026, 1, 1)
    for a, b in [
        ("0 12 1 jan,jul *", "0 12 1 1,7 *"),
        ("0 12 1 JAN,JUL *", "0 12 1 1,7 *"),
        ("0 12 1 Jan-Mar *", "0 12 1 1-3 *"),
        ("0 12 1 jan-dec/3 *", "0 12 1 1,4,7,10 *"),
        ("0 9 * * mon-fri", "0 9 * * 1-5"),
        ("0 9 * * MON,Wed,fri", "0 9 * * 1,3,5"),
        ("0 9 * * sun", "0 9 * * 0"),
        ("0 9 * * 7", "0 9 * * 0"),
        ("0 9 * * SUN", "0 9 * * 7"),
    ]:
        assert walk(cron(a), after, 12) == walk(cron(b), after, 12), (a, b)


def test_sunday_is_0_and_7():
    # 2026-01-01 is a Thursday: Sundays are Jan 4, 11, 18.
    want = [datetime(2026, 1, 4), datetime(2026, 1, 11), datetime(2026, 1, 18)]
    assert walk(cron("0 0 * * 7"), datetime(2026, 1, 1), 3) == want
    assert walk(cron("0 0 * * 0"), datetime(2026, 1, 1), 3) == want


def test_month_names_and_step_over_month_range():
    got = walk(cron("0 12 1 jan-dec/3 *"), datetime(2026, 1, 1), 5)
    assert got == [datetime(2026, 1, 1, 12), datetime(2026, 4, 1, 12), datetime(2026, 7, 1, 12),
                   datetime(2026, 10, 1, 12), datetime(2027, 1, 1, 12)]


def test_step_minutes():
    got = walk(cron("*/20 * * * *"), datetime(2026, 1, 1, 23, 0), 5)
    assert got == [datetime(2026, 1, 1, 23, 20), datetime(2026, 1, 1, 23, 40), datetime(2026, 1, 2, 0, 0),
                   datetime(2026, 1, 2, 0, 20), datetime(2026, 1, 2, 0, 40)]


def test_hour_range_with_step_on_weekdays():
    # 2026-01-02 is a Friday, 2026-01-05 a Monday.
    got = walk(cron("0 9-17/2 * * mon-fri"), datetime(2026, 1, 2), 7)
    assert got == [datetime(2026, 1, 2, h) for h in (9, 11, 13, 15, 17)] + [
        datetime(2026, 1, 5, 9), datetime(2026, 1, 5, 11)]
    # Local hours in a zone: Berlin is UTC+1 in January.
    got = walk(cron("0 9-17/2 * * mon-fri", "Europe/Berlin"), datetime(2026, 1, 2), 6)
    assert got == [datetime(2026, 1, 2, h) for h in (8, 10, 12, 14, 16)] + [datetime(2026, 1, 5, 8)]


def test_whitespace_between_fields_is_not_significant_for_points():
    after = datetime(2026, 1, 1)
    assert walk(cron("0  9  *  *  mon"), after, 3) == walk(cron("0 9 * * mon"), after, 3)


# --------------------------------------------------------------------------- timezone_error


@pytest.mark.parametrize(
    "name",
    ["UTC", "Etc/UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata",
     "Australia/Lord_Howe", "Asia/Kathmandu", "Pacific/Chatham", "America/Santiago"],
)
def test_timezone_error_accepts_iana_names(name):
    assert timezone_error(name) is None


@pytest.mark.parametrize(
    "name",
    ["Mars/Base", "", " ", "europe/berlin", "EUROPE/BERLIN", "utc", "Europe/Berlin ", " Europe/Berlin",
     "Europe//Berlin", "Europe/Berlin/", "../etc/passwd", "/etc/localtime", "/usr/share/zoneinfo/UTC",
     "./UTC", "Europe/../UTC", "posix/Europe/Berlin", "right/UTC", "Berlin", "CEST", "+02:00",
     "Europe/Berlin\x00"],
)
def test_timezone_error_rejects(name):
    err = timezone_error(name)
    assert err is not None and err.startswith("timezone:")


@pytest.mark.skipif("localtime" not in available_timezones(),
                    reason="this host's zoneinfo has no 'localtime' entry")
def test_host_localtime_alias_is_not_an_iana_name():
    assert timezone_error("localtime") is not None


# --------------------------------------------------------------------------- cron across DST

SPRING_FORWARD_0230 = [
    # (zone, after, expected next three points): the day of the gap has no 02:30.
    ("Europe/Berlin", datetime(2026, 3, 27, 12),
     [datetime(2026, 3, 28, 1, 30), datetime(2026, 3, 30, 0, 30), datetime(2026, 3, 31, 0, 30)]),
    ("America/New_York", datetime(2026, 3, 6, 12),
     [datetime(2026, 3, 7, 7, 30), datetime(2026, 3, 9, 6, 30), datetime(2026, 3, 10, 6, 30)]),
    ("Australia/Sydney", datetime(2026, 10, 2),
     [datetime(2026, 10, 2, 16, 30), datetime(2026, 10, 4, 15, 30), datetime(2026, 10, 5, 15, 30)]),
]


@pytest.mark.parametrize(("tz", "after", "want"), SPRING_FORWARD_0230)
def test_daily_in_the_spring_forward_gap_skips_that_day(tz, after, want):
    t = cron("30 2 * * *", tz)
    got = walk(t, after, 3)
    assert got == want
    assert [local(p, tz).strftime("%H:%M") for p in got] == ["02:30"] * 3
    # Asking from anywhere inside the skipped day gives the next day's point.
    assert next_point(t, got[0] + timedelta(hours=12)) == got[1]
    assert next_point(t, got[0] + US) == got[1]


def test_every_30_minutes_across_berlin_spring_forward_is_continuous_in_utc():
    # 02:00 and 02:30 CET do not exist; UTC sees a point every 30 minutes regardless.
    got = walk_until(cron("*/30 * * * *", "Europe/Berlin"), datetime(2026, 3, 29, 0, 0), datetime(2026, 3, 29, 2, 0))
    assert got == [datetime(2026, 3, 29, 0, 30), datetime(2026, 3, 29, 1, 0), datetime(2026, 3, 29, 1, 30),
                   datetime(2026, 3, 29, 2, 0)]
    assert [local(p, "Europe/Berlin").strftime("%H:%M") for p in got] == ["01:30", "03:00", "03:30", "04:00"]


FALL_BACK_DAILY = [
    # (zone, cron, after, expected points): the repeated wall time fires at its first occurrence.
    ("Europe/Berlin", "30 2 * * *", datetime(2026, 10, 23, 12),
     [datetime(2026, 10, 24, 0, 30), datetime(2026, 10, 25, 0, 30), datetime(2026, 10, 26, 1, 30),
      datetime(2026, 10, 27, 1, 30)]),
    # New York repeats 01:00-02:00, so 02:30 is not ambiguous there ...
    ("America/New_York", "30 2 * * *", datetime(2026, 10, 30, 12),
     [datetime(2026, 10, 31, 6, 30), datetime(2026, 11, 1, 7, 30), datetime(2026, 11, 2, 7, 30)]),
    # ... but 01:30 is: first at 01:30 EDT (05:30 UTC), not again at 01:30 EST (06:30 UTC).
    ("America/New_York", "30 1 * * *", datetime(2026, 10, 30, 12),
     [datetime(2026, 10, 31, 5, 30), datetime(2026, 11, 1, 5, 30), datetime(2026, 11, 2, 6, 30)]),
    ("Australia/Sydney", "30 2 * * *", datetime(2026, 4, 3),
     [datetime(2026, 4, 3, 15, 30), datetime(2026, 4, 4, 15, 30), datetime(2026, 4, 5, 16, 30),
      datetime(2026, 4, 6, 16, 30)]),
]


@pytest.mark.parametrize(("tz", "expr", "after", "want"), FALL_BACK_DAILY)
def test_daily_across_fall_back_fires_once_at_first_occurrence(tz, expr, after, want):
    got = walk(cron(expr, tz), after, len(want))
    assert got == want
    assert strictly_increasing(got)
    assert all(local(p, tz).fold == 0 for p in got)  # never the second pass


FALL_BACK_HALF_HOURLY = [
    # (zone, after, until, expected points): the second pass of the repeated hour is silent.
    ("Europe/Berlin", datetime(2026, 10, 24, 23, 0), datetime(2026, 10, 25, 3, 0),
     [datetime(2026, 10, 24, 23, 30), datetime(2026, 10, 25, 0, 0), datetime(2026, 10, 25, 0, 30),
      datetime(2026, 10, 25, 2, 0), datetime(2026, 10, 25, 2, 30), datetime(2026, 10, 25, 3, 0)]),
    ("America/New_York", datetime(2026, 11, 1, 4, 0), datetime(2026, 11, 1, 8, 0),
     [datetime(2026, 11, 1, 4, 30), datetime(2026, 11, 1, 5, 0), datetime(2026, 11, 1, 5, 30),
      datetime(2026, 11, 1, 7, 0), datetime(2026, 11, 1, 7, 30), datetime(2026, 11, 1, 8, 0)]),
    ("Australia/Sydney", datetime(2026, 4, 4, 14, 0), datetime(2026, 4, 4, 18, 0),
     [datetime(2026, 4, 4, 14, 30), datetime(2026, 4, 4, 15, 0), datetime(2026, 4, 4, 15, 30),
      datetime(2026, 4, 4, 17, 0), datetime(2026, 4, 4, 17, 30), datetime(2026, 4, 4, 18, 0)]),
]


@pytest.mark.parametrize(("tz", "after", "until", "want"), FALL_BACK_HALF_HOURLY)
def test_every_30_minutes_across_fall_back(tz, after, until, want):
    t = cron("*/30 * * * *", tz)
    got = walk_until(t, after, until)
    assert got == want
    walls = [local(p, tz).replace(tzinfo=None) for p in got]
    assert len(set(walls)) == len(walls)  # each wall time once
    assert all(local(p, tz).fold == 0 for p in got)


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York", "Australia/Sydney"])
@pytest.mark.parametrize("expr", ["* * * * *", "*/30 * * * *", "*/7 * * * *", "0,59 * * * *", "30 2 * * *"])
def test_no_point_twice_across_a_year_of_transitions(tz, expr):
    # Around both 2026 transitions of the zone (see _transitions below): strictly increasing, each
    # wall time once, never a second pass.
    t = cron(expr, tz)
    for center in _transitions(tz, 2026, 2027):
        if expr == "30 2 * * *":
            pts = walk(t, center - timedelta(days=2), 5)
        else:
            pts = walk_until(t, center - timedelta(hours=4), center + timedelta(hours=4))
        assert strictly_increasing(pts)
        walls = [local(p, tz).replace(tzinfo=None) for p in pts]
        assert len(set(walls)) == len(walls)
        assert all(local(p, tz).fold == 0 for p in pts)


SECOND_PASS = [
    # (zone, cron, after inside the second pass of the repeated hour, expected next point)
    ("Europe/Berlin", "*/30 * * * *", datetime(2026, 10, 25, 1, 15), datetime(2026, 10, 25, 2, 0)),
    ("Europe/Berlin", "*/30 * * * *", datetime(2026, 10, 25, 1, 0), datetime(2026, 10, 25, 2, 0)),
    ("Europe/Berlin", "*/30 * * * *", datetime(2026, 10, 25, 1, 30), datetime(2026, 10, 25, 2, 0)),
    ("Europe/Berlin", "*/30 * * * *", datetime(2026, 10, 25, 1, 59, 59, 999999), datetime(2026, 10, 25, 2, 0)),
    ("Europe/Berlin", "0 * * * *", datetime(2026, 10, 25, 0, 0), datetime(2026, 10, 25, 2, 0)),
    ("Europe/Berlin", "30 2 * * *", datetime(2026, 10, 25, 1, 15), datetime(2026, 10, 26, 1, 30)),
    ("Europe/Berlin", "15 2 * * *", datetime(2026, 10, 25, 1, 15), datetime(2026, 10, 26, 1, 15)),
    ("Europe/Berlin", "45 2 * * *", datetime(2026, 10, 25, 1, 15), datetime(2026, 10, 26, 1, 45)),
    # first pass, after the first occurrence: not again in the second pass
    ("Europe/Berlin", "45 2 * * *", datetime(2026, 10, 25, 0, 45), datetime(2026, 10, 26, 1, 45)),
    ("America/New_York", "*/30 * * * *", datetime(2026, 11, 1, 6, 10), datetime(2026, 11, 1, 7, 0)),
    ("America/New_York", "30 1 * * *", datetime(2026, 11, 1, 6, 10), datetime(2026, 11, 2, 6, 30)),
    ("America/New_York", "30 1 * * *", datetime(2026, 11, 1, 5, 30), datetime(2026, 11, 2, 6, 30)),
    ("Australia/Sydney", "*/30 * * * *", datetime(2026, 4, 4, 16, 45), datetime(2026, 4, 4, 17, 0)),
    ("Australia/Sydney", "30 2 * * *", datetime(2026, 4, 4, 16, 45), datetime(2026, 4, 5, 16, 30)),
]


@pytest.mark.parametrize(("tz", "expr", "after", "want"), SECOND_PASS)
def test_from_inside_the_repeated_hour_time_does_not_go_back(tz, expr, after, want):
    got = next_point(cron(expr, tz), after)
    assert got == want
    assert got > after


@pytest.mark.parametrize(
    ("tz", "spring", "fall", "skipped_hour"),
    [
        ("Europe/Berlin", date(2026, 3, 29), date(2026, 10, 25), 2),
        ("America/New_York", date(2026, 3, 8), date(2026, 11, 1), 2),
        ("Australia/Sydney", date(2026, 10, 4), date(2026, 4, 5), 2),
    ],
)
def test_hourly_fires_once_per_existing_wall_hour(tz, spring, fall, skipped_hour):
    t = cron("0 * * * *", tz)
    for day, hours in [(spring, 23), (fall, 25)]:
        # Walk from two local days before to two after, and count fires per local date.
        start = datetime.combine(day - timedelta(days=2), time()).replace(tzinfo=ZoneInfo(tz))
        start = start.astimezone(UTC).replace(tzinfo=None)
        pts = walk(t, start - US, 24 * 5)
        assert strictly_increasing(pts)
        per_day = Counter(local(p, tz).date() for p in pts)
        # The day really has `hours` hours ...
        z = ZoneInfo(tz)
        length = (datetime.combine(day + timedelta(days=1), time(), z).astimezone(UTC)
                  - datetime.combine(day, time(), z).astimezone(UTC))
        assert length == timedelta(hours=hours)
        # ... and every existing wall-clock hour fires once: 23 on the short day, 24 on the others.
        assert per_day[day] == (23 if hours == 23 else 24)
        for d in (day - timedelta(days=2), day - timedelta(days=1), day + timedelta(days=1)):
            assert per_day[d] == 24
        wall_hours = sorted(local(p, tz).hour for p in pts if local(p, tz).date() == day)
        if hours == 23:
            assert wall_hours == [h for h in range(24) if h != skipped_hour]
        else:
            assert wall_hours == list(range(24))


# --------------------------------------------------------------------------- day-of-month, names, OR


def test_31st_skips_months_without_one():
    got = walk(cron("0 0 31 * *"), datetime(2026, 1, 1), 8)
    assert got == [datetime(2026, m, 31) for m in (1, 3, 5, 7, 8, 10, 12)] + [datetime(2027, 1, 31)]


def test_31st_in_a_zone_is_the_local_31st():
    # Midnight of the 31st in Berlin is 23:00 UTC on the 30th (CET) or 22:00 (CEST).
    got = walk(cron("0 0 31 * *", "Europe/Berlin"), datetime(2026, 1, 1), 3)
    assert got == [datetime(2026, 1, 30, 23), datetime(2026, 3, 30, 22), datetime(2026, 5, 30, 22)]


def test_feb_29_fires_only_on_leap_days():
    got = walk(cron("0 0 29 2 *"), datetime(2026, 1, 1), 2)
    assert got == [datetime(2028, 2, 29), datetime(2032, 2, 29)]
    assert next_point(cron("0 0 29 2 *"), datetime(2028, 2, 29)) == datetime(2032, 2, 29)


def test_last_day_of_month_syntax_is_rejected():
    assert cron_error("0 0 L * *") is not None
    assert cron_error("0 0 L-1 * *") is not None


def test_day_of_month_and_day_of_week_both_restricted_is_or():
    # 2026-01-01 is a Thursday: Fridays Jan 2, 9, 16, 23, 30, Feb 6, 13; the 13th is Jan 13 (Tue), Feb 13 (Fri).
    got = walk(cron("0 0 13 * fri"), datetime(2026, 1, 1), 9)
    assert got == [datetime(2026, 1, d) for d in (2, 9, 13, 16, 23, 30)] + [
        datetime(2026, 2, 6), datetime(2026, 2, 13), datetime(2026, 2, 20)]


def test_only_one_of_day_fields_restricted_is_and():
    # Mondays only (day-of-month '*'); the 1st of months only (day-of-week '*').
    assert walk(cron("0 0 * * mon"), datetime(2026, 1, 1), 2) == [datetime(2026, 1, 5), datetime(2026, 1, 12)]
    assert walk(cron("0 0 1 * *"), datetime(2026, 1, 1), 2) == [datetime(2026, 2, 1), datetime(2026, 3, 1)]
    # Month restricted too: Mondays of February.
    assert walk(cron("0 0 * feb mon"), datetime(2026, 1, 1), 5) == [
        datetime(2026, 2, d) for d in (2, 9, 16, 23)] + [datetime(2027, 2, 1)]


def test_kolkata_half_hour_offset():
    # IST is UTC+5:30 with no DST: local 09:00 is 03:30 UTC every day of the year.
    got = walk(cron("0 9 * * *", "Asia/Kolkata"), datetime(2026, 3, 28), 400)
    assert all(p.time() == time(3, 30) for p in got)
    assert all(b - a == timedelta(days=1) for a, b in zip(got, got[1:]))


# --------------------------------------------------------------------------- bounds (cron)


def test_cron_start_at_in_the_future():
    # Berlin 09:00 in June (CEST) is 07:00 UTC; start_at at 08:07 UTC is after that day's point.
    start = datetime(2027, 6, 15, 8, 7)
    t = cron("0 9 * * *", "Europe/Berlin", start_at=start)
    assert first_point(t) == datetime(2027, 6, 16, 7)
    assert next_point(t, datetime(2026, 1, 1)) == datetime(2027, 6, 16, 7)
    assert next_point(t, datetime(2027, 6, 16, 7)) == datetime(2027, 6, 17, 7)


def test_cron_start_at_on_a_point_includes_it():
    start = datetime(2027, 6, 16, 7)
    t = cron("0 9 * * *", "Europe/Berlin", start_at=start)
    assert first_point(t) == start
    assert next_point(t, start - timedelta(days=30)) == start


def test_cron_start_at_in_the_past_changes_nothing():
    t = cron("0 9 * * *", "UTC", start_at=datetime(2020, 1, 1), anchor=datetime(2026, 5, 5, 12, 34, 56))
    assert first_point(t) == datetime(2026, 5, 6, 9)


def test_cron_first_point_is_at_or_after_the_anchor():
    assert first_point(cron("0 9 * * *", anchor=datetime(2026, 5, 5, 12, 34, 56, 789))) == datetime(2026, 5, 6, 9)
    # a point exactly at the anchor (creation time) is the first one
    assert first_point(cron("0 9 * * *", anchor=datetime(2026, 5, 5, 9))) == datetime(2026, 5, 5, 9)


def test_cron_end_at_stops():
    end = datetime(2026, 1, 3, 9)
    t = cron("0 9 * * *", end_at=end)
    assert walk(t, datetime(2026, 1, 1), 10) == [datetime(2026, 1, 1, 9), datetime(2026, 1, 2, 9), end]
    assert next_point(t, end) is None
    assert next_point(t, end - US) == end
    assert first_point(cron("0 9 * * *", end_at=datetime(2025, 12, 31))) is None


def test_cron_points_have_no_seconds_even_from_odd_instants():
    t = cron("*/5 * * * *", "Asia/Kolkata")
    p = next_point(t, datetime(2026, 6, 1, 10, 2, 59, 999999))
    assert p == datetime(2026, 6, 1, 10, 5)
    assert next_point(t, datetime(2026, 6, 1, 10, 5)) == datetime(2026, 6, 1, 10, 10)
    assert next_point(t, datetime(2026, 6, 1, 10, 4, 59, 999999)) == datetime(2026, 6, 1, 10, 5)


# --------------------------------------------------------------------------- intervals

IA = datetime(2026, 2, 3, 10, 0, 0, 250000)  # an anchor with a fraction of a second


def test_interval_first_point_is_one_interval_after_the_anchor_without_start_at():
    assert first_point(every(90, IA)) == IA + timedelta(seconds=90)


def test_interval_first_point_is_the_anchor_when_start_at_is_the_anchor():
    assert first_point(every(90, IA, start_at=IA)) == IA


def test_interval_first_point_with_start_at_before_the_anchor_is_the_anchor():
    # Points never precede the anchor, even when start_at allows earlier ones.
    assert first_point(every(90, IA, start_at=IA - timedelta(days=1))) == IA


@pytest.mark.parametrize("k", [1, 2, 1000])
def test_interval_start_at_on_the_anchor_grid_is_the_first_point(k):
    start = IA + k * timedelta(seconds=90)
    assert first_point(every(90, IA, start_at=start)) == start


@pytest.mark.parametrize(
    ("offset", "want_k"),
    [(timedelta(microseconds=1), 1), (timedelta(seconds=45), 1), (timedelta(seconds=89, microseconds=999999), 1),
     (timedelta(seconds=91), 2), (timedelta(days=1, seconds=1), 961)],
)
def test_interval_start_at_off_the_grid_takes_the_next_grid_point(offset, want_k):
    # start_at only bounds the points: they stay on the anchor's grid (anchor + k * interval),
    # and the first one is the earliest at or after start_at.
    start = IA + offset
    t = every(90, IA, start_at=start)
    fp = first_point(t)
    assert fp == IA + want_k * timedelta(seconds=90)
    assert fp >= start and fp - timedelta(seconds=90) < start
    assert next_point(t, IA - timedelta(days=3)) == fp


def test_interval_points_are_anchor_plus_multiples():
    step = timedelta(seconds=7)
    t = every(7, IA)
    pts = walk(t, IA, 500)
    assert pts[0] == IA + step
    assert all((p - IA) % step == timedelta(0) for p in pts)
    assert all(b - a == step for a, b in zip(pts, pts[1:]))


@pytest.mark.parametrize(
    ("after", "want"),
    [
        (IA, IA + timedelta(seconds=90)),
        (IA + timedelta(seconds=90), IA + timedelta(seconds=180)),  # strictly after a point
        (IA + timedelta(seconds=90) - US, IA + timedelta(seconds=90)),
        (IA + timedelta(seconds=90) + US, IA + timedelta(seconds=180)),
        (IA + 1000 * timedelta(seconds=90) + timedelta(seconds=3), IA + 1001 * timedelta(seconds=90)),
        (IA - US, IA),  # the anchor itself is a point of the grid
        (IA - timedelta(days=400), IA),  # nothing before the anchor
    ],
)
def test_interval_next_point(after, want):
    assert next_point(every(90, IA), after) == want


def test_interval_ignores_zones_and_dst():
    # A day of 3600 s steps across Berlin's fall-back is 24 UTC hours: intervals live on the UTC line.
    t = Timing(None, 3600, "Europe/Berlin", None, None, datetime(2026, 10, 24, 22))
    pts = walk(t, datetime(2026, 10, 24, 22), 24)
    assert pts == [datetime(2026, 10, 24, 22) + timedelta(hours=h) for h in range(1, 25)]


def test_interval_end_at_stops():
    end = IA + timedelta(seconds=270)
    t = every(90, IA, end_at=end)
    assert walk(t, IA, 10) == [IA + timedelta(seconds=s) for s in (90, 180, 270)]
    assert next_point(t, end) is None
    assert next_point(t, end - US) == end
    # end_at between points: the last point is the one before it
    t = every(90, IA, end_at=end - US)
    assert walk(t, IA, 10) == [IA + timedelta(seconds=s) for s in (90, 180)]
    # end_at before the first point: nothing at all
    assert first_point(every(90, IA, end_at=IA + timedelta(seconds=89))) is None


def test_interval_start_and_end_together():
    t = every(60, IA, start_at=IA + timedelta(seconds=150), end_at=IA + timedelta(seconds=300))
    assert first_point(t) == IA + timedelta(seconds=180)
    assert walk(t, IA - timedelta(days=1), 10) == [IA + timedelta(seconds=s) for s in (180, 240, 300)]


def test_interval_limits():
    t = every(MAX_INTERVAL_S, IA)
    assert first_point(t) == IA + timedelta(seconds=31_622_400)
    assert next_point(t, first_point(t)) == IA + timedelta(seconds=2 * 31_622_400)
    t = every(1, IA)
    assert walk(t, IA, 3) == [IA + timedelta(seconds=s) for s in (1, 2, 3)]


# --------------------------------------------------------------------------- due_points


def test_due_points_from_cursor_up_to_now_inclusive():
    t = every(10, IA)
    cursor = IA + timedelta(seconds=10)
    assert due_points(t, cursor, IA + timedelta(seconds=55)) == [IA + timedelta(seconds=s) for s in (10, 20, 30, 40, 50)]
    assert due_points(t, cursor, IA + timedelta(seconds=50)) == [IA + timedelta(seconds=s) for s in (10, 20, 30, 40, 50)]
    assert due_points(t, cursor, IA + timedelta(seconds=50) - US) == [IA + timedelta(seconds=s) for s in (10, 20, 30, 40)]
    assert due_points(t, cursor, cursor) == [cursor]


def test_due_points_nothing_before_the_cursor_is_due():
    t = every(10, IA)
    assert due_points(t, IA + timedelta(seconds=10), IA + timedelta(seconds=10) - US) == []
    assert due_points(t, IA + timedelta(seconds=10), IA) == []


def test_due_points_limit():
    t = every(1, IA)
    now = IA + timedelta(days=1)
    pts = due_points(t, IA + timedelta(seconds=1), now)
    assert len(pts) == MAX_POINTS_PER_BATCH == 1000
    assert pts[-1] == IA + timedelta(seconds=1000)
    assert due_points(t, IA + timedelta(seconds=1), now, limit=3) == [IA + timedelta(seconds=s) for s in (1, 2, 3)]
    assert due_points(t, IA + timedelta(seconds=1), now, limit=0) == []


def test_due_points_stop_at_end_at():
    t = every(10, IA, end_at=IA + timedelta(seconds=30))
    assert due_points(t, IA + timedelta(seconds=10), IA + timedelta(days=1)) == [
        IA + timedelta(seconds=s) for s in (10, 20, 30)]


@pytest.mark.parametrize(
    ("tz", "cursor", "now"),
    [
        ("Europe/Berlin", datetime(2026, 10, 24, 22, 0), datetime(2026, 10, 25, 4, 0)),
        ("Europe/Berlin", datetime(2026, 3, 28, 22, 0), datetime(2026, 3, 29, 4, 0)),
        ("America/New_York", datetime(2026, 11, 1, 3, 0), datetime(2026, 11, 1, 9, 0)),
        ("Australia/Sydney", datetime(2026, 4, 4, 13, 0), datetime(2026, 4, 4, 19, 0)),
    ],
)
def test_due_points_chain_next_point_in_zones(tz, cursor, now):
    for expr in ("*/30 * * * *", "* * * * *", "0 * * * *"):
        t = cron(expr, tz)
        pts = due_points(t, cursor, now)
        assert pts[0] == cursor and pts[-1] <= now
        assert strictly_increasing(pts)
        assert all(next_point(t, a) == b for a, b in zip(pts, pts[1:]))
        assert next_point(t, pts[-1]) > now
        assert pts == [cursor] + walk_until(t, cursor, now)


def test_due_points_berlin_fall_back_half_hourly():
    t = cron("*/30 * * * *", "Europe/Berlin")
    pts = due_points(t, datetime(2026, 10, 24, 23, 30), datetime(2026, 10, 25, 3, 0))
    assert pts == FALL_BACK_HALF_HOURLY[0][3]


# --------------------------------------------------------------------------- decide

NOW = datetime(2026, 5, 1, 12, 0, 0)


def ago(*seconds: float) -> list[datetime]:
    return [NOW - timedelta(seconds=s) for s in seconds]


def actions(ds: list[Decision]) -> list[tuple[str, str | None]]:
    return [(d.action, d.reason) for d in ds]


S, MF, OV = (SUBMIT, None), (SKIP, MISFIRE), (SKIP, OVERLAP)


def test_decide_catch_up_window():
    pts = ago(120, 90, 61, 60, 30, 1, 0)
    ds = decide(pts, NOW, policy=CATCH_UP, window_s=60, overlap=ALLOW, previous_unfinished=False)
    assert [d.trigger_at for d in ds] == pts
    assert actions(ds) == [MF, MF, MF, S, S, S, S]


def test_decide_catch_up_window_boundary_to_the_microsecond():
    edge = NOW - timedelta(seconds=60)
    ds = decide([edge - US, edge, edge + US], NOW, policy=CATCH_UP, window_s=60, overlap=ALLOW,
                previous_unfinished=False)
    assert actions(ds) == [MF, S, S]


def test_default_window_is_60():
    assert DEFAULT_CATCH_UP_WINDOW_S == 60


@pytest.mark.parametrize("policy", [CATCH_UP, LATEST])
def test_decide_window_zero_still_runs_a_point_a_second_or_two_late(policy):
    assert ON_TIME_S == 5
    for late in (0, 1, 2, ON_TIME_S):
        ds = decide(ago(late), NOW, policy=policy, window_s=0, overlap=ALLOW, previous_unfinished=False)
        assert actions(ds) == [S], late
    ds = decide(ago(ON_TIME_S + 1), NOW, policy=policy, window_s=0, overlap=ALLOW, previous_unfinished=False)
    assert actions(ds) == [MF]
    ds = decide([NOW - timedelta(seconds=ON_TIME_S) - US], NOW, policy=policy, window_s=0, overlap=ALLOW,
                previous_unfinished=False)
    assert actions(ds) == [MF]


def test_decide_window_below_the_grace_is_the_grace():
    ds = decide(ago(10, 5, 4, 2), NOW, policy=CATCH_UP, window_s=2, overlap=ALLOW, previous_unfinished=False)
    assert actions(ds) == [MF, S, S, S]


def test_decide_catch_up_all_late_points_outside_window():
    ds = decide(ago(300, 200, 100), NOW, policy=CATCH_UP, window_s=60, overlap=ALLOW, previous_unfinished=False)
    assert actions(ds) == [MF, MF, MF]


def test_decide_latest_runs_only_the_most_recent_inside_the_window():
    pts = ago(120, 90, 50, 40, 30)
    ds = decide(pts, NOW, policy=LATEST, window_s=60, overlap=ALLOW, previous_unfinished=False)
    assert [d.trigger_at for d in ds] == pts
    assert actions(ds) == [MF, MF, MF, MF, S]


def test_decide_latest_nothing_inside_the_window_runs_nothing():
    ds = decide(ago(300, 200, 100), NOW, policy=LATEST, window_s=60, overlap=ALLOW, previous_unfinished=False)
    assert actions(ds) == [MF, MF, MF]


def test_decide_latest_single_on_time_point():
    ds = decide(ago(1), NOW, policy=LATEST, window_s=3600, overlap=ALLOW, previous_unfinished=False)
    assert actions(ds) == [S]


def test_decide_overlap_skip_with_previous_unfinished():
    pts = ago(120, 50, 40, 0)
    ds = decide(pts, NOW, policy=CATCH_UP, window_s=60, overlap="skip", previous_unfinished=True)
    # A missed point stays a misfire; the ones that would run are skipped for the overlap.
    assert actions(ds) == [MF, OV, OV, OV]


def test_decide_overlap_skip_without_previous_runs_the_first_only():
    pts = ago(120, 50, 40, 0)
    ds = decide(pts, NOW, policy=CATCH_UP, window_s=60, overlap="skip", previous_unfinished=False)
    assert actions(ds) == [MF, S, OV, OV]


def test_decide_overlap_skip_with_latest():
    pts = ago(120, 50, 40, 0)
    ds = decide(pts, NOW, policy=LATEST, window_s=60, overlap="skip", previous_unfinished=False)
    assert actions(ds) == [MF, MF, MF, S]
    ds = decide(pts, NOW, policy=LATEST, window_s=60, overlap="skip", previous_unfinished=True)
    assert actions(ds) == [MF, MF, MF, OV]


def test_decide_overlap_allow_runs_everything_inside_the_window():
    pts = ago(50, 40, 30, 0)
    for prev in (False, True):
        ds = decide(pts, NOW, policy=CATCH_UP, window_s=60, overlap=ALLOW, previous_unfinished=prev)
        assert actions(ds) == [S, S, S, S]


def test_decide_empty_batch():
    assert decide([], NOW, policy=CATCH_UP, window_s=60, overlap="skip", previous_unfinished=True) == []


def test_decide_on_a_real_batch_of_due_points():
    # An every-10-s schedule resumed 5 minutes late with a 60 s window: 30 missed points, the last
    # 7 (t-60 .. t) inside the window.
    t = every(10, NOW - timedelta(seconds=310))
    pts = due_points(t, NOW - timedelta(seconds=300), NOW)
    assert len(pts) == 31
    ds = decide(pts, NOW, policy=CATCH_UP, window_s=60, overlap=ALLOW, previous_unfinished=False)
    assert actions(ds) == [MF] * 24 + [S] * 7
    ds = decide(pts, NOW, policy=LATEST, window_s=60, overlap=ALLOW, previous_unfinished=False)
    assert actions(ds) == [MF] * 30 + [S]



def _generate(t: Timing, cursor: datetime, now: datetime, **policy) -> list[Decision]:
    """The scheduler's generation walk built from the pure functions: points from the cursor up
    to now, at most 1000 per batch, the misfire and overlap policies applied to each batch (as
    services/scheduler.py does, one batch per tick)."""
    out: list[Decision] = []
    while cursor is not None and cursor <= now:
        batch = due_points(t, cursor, now)
        later = next_point(t, batch[-1])
        out += decide(batch, now, previous_unfinished=False, more_due=later is not None and later <= now, **policy)
        cursor = later
    return out


def test_catch_up_over_several_batches_submits_every_point_inside_the_window():
    # Every minute, a 1-day window, resumed after 2 days: 2881 points in 3 batches.
    now = datetime(2026, 5, 3, 12)
    t = every(60, now - timedelta(days=2, minutes=1))
    ds = _generate(t, now - timedelta(days=2), now, policy=CATCH_UP, window_s=86400, overlap=ALLOW)
    assert len(ds) == 2881 and strictly_increasing([d.trigger_at for d in ds])
    assert [d.trigger_at for d in ds if d.action == SUBMIT] == [now - timedelta(minutes=m) for m in range(1440, -1, -1)]


def test_latest_over_several_batches_runs_only_the_most_recent_point():
    now = datetime(2026, 5, 3, 12)
    t = every(60, now - timedelta(days=2, minutes=1))
    ds = _generate(t, now - timedelta(days=2), now, policy=LATEST, window_s=86400, overlap=ALLOW)
    assert len(ds) == 2881
    assert [d.trigger_at for d in ds if d.action == SUBMIT] == [now]


@settings(max_examples=300, deadline=None, database=None)
@given(
    offsets=st.lists(st.integers(min_value=0, max_value=4000_000), max_size=30, unique=True),
    window=st.integers(min_value=0, max_value=3600),
    policy=st.sampled_from([CATCH_UP, LATEST]),
    overlap=st.sampled_from([ALLOW, "skip"]),
    prev=st.booleans(),
)
def test_decide_properties(offsets, window, policy, overlap, prev):
    # offsets in milliseconds before now; points sorted oldest first
    pts = sorted(NOW - timedelta(milliseconds=o) for o in offsets)
    ds = decide(pts, NOW, policy=policy, window_s=window, overlap=overlap, previous_unfinished=prev)
    # every point exactly once, in order; a reason exactly on skips
    assert [d.trigger_at for d in ds] == pts
    assert all((d.action == SUBMIT) == (d.reason is None) for d in ds)
    assert all(d.action in (SUBMIT, SKIP) and d.reason in (None, MISFIRE, OVERLAP) for d in ds)
    horizon = NOW - timedelta(seconds=max(window, ON_TIME_S))
    inside = [p for p in pts if p >= horizon]
    # a point outside the window is always a misfire; nothing outside is submitted
    for d in ds:
        if d.trigger_at < horizon:
            assert (d.action, d.reason) == MF
    submitted = [d.trigger_at for d in ds if d.action == SUBMIT]
    wanted = inside if policy == CATCH_UP else inside[-1:]
    if policy == LATEST:
        assert all((d.action, d.reason) == MF for d in ds if d.trigger_at not in wanted)
    if overlap == ALLOW:
        assert submitted == wanted
        assert all(d.reason != OVERLAP for d in ds)
    elif prev:
        assert submitted == []
        assert [d.trigger_at for d in ds if d.reason == OVERLAP] == wanted
    else:
        assert submitted == wanted[:1]
        assert [d.trigger_at for d in ds if d.reason == OVERLAP] == wanted[1:]


def test_relative_deadline():
    t = datetime(2026, 1, 1, 2, 0)
    assert relative_deadline(t, None) is None
    assert relative_deadline(t, 0) == t
    assert relative_deadline(t, 600) == datetime(2026, 1, 1, 2, 10)


# --------------------------------------------------------------------------- properties

PROP_ZONES = [
    "UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata", "Europe/London",
    "Australia/Lord_Howe",  # 30-minute DST
    "America/Santiago",  # transitions at local midnight (00:00 skipped / 23:00 repeated)
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/St_Johns",  # -3:30 / -2:30
    "Asia/Kathmandu",  # +5:45
    "Africa/Casablanca",  # negative DST around Ramadan
]


def _transitions(tz: str, y0: int = 2026, y1: int = 2029) -> list[datetime]:
    """UTC instants (to the minute, rounded up) where the zone's offset changes in [y0, y1)."""
    z = ZoneInfo(tz)

    def off(u: datetime) -> timedelta:
        return u.replace(tzinfo=UTC).astimezone(z).utcoffset()

    out = []
    t = datetime(y0, 1, 1)
    while t < datetime(y1, 1, 1):
        n = t + timedelta(hours=6)
        if off(n) != off(t):
            lo, hi = t, n
            while hi - lo > timedelta(minutes=1):
                mid = lo + (hi - lo) // 2
                lo, hi = (mid, hi) if off(mid) == off(t) else (lo, mid)
            out.append(hi.replace(second=0, microsecond=0))
        t = n
    return out


TRANSITIONS = {tz: _transitions(tz) for tz in PROP_ZONES}


class CronSpec(NamedTuple):
    expr: str
    minutes: frozenset[int]
    hours: frozenset[int]
    doms: frozenset[int] | None  # None: '*'
    months: frozenset[int] | None
    dows: frozenset[int] | None  # 0 = Sunday


MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAY_NAMES = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def _case(draw, word: str) -> str:
    return draw(st.sampled_from([word, word.upper(), word.capitalize()]))


@st.composite
def cron_specs(draw) -> CronSpec:
    # minute: a list or a step
    if draw(st.booleans()):
        minutes = frozenset(draw(st.sets(st.integers(0, 59), min_size=1, max_size=4)))
        m_field = ",".join(str(m) for m in sorted(minutes))
    else:
        n = draw(st.sampled_from([1, 5, 15, 20, 30, 45]))
        minutes = frozenset(range(0, 60, n))
        m_field = f"*/{n}"
    # hour: '*', a list biased towards the hours DST moves, or a range
    kind = draw(st.sampled_from(["*", "list", "range"]))
    if kind == "*":
        hours, h_field = frozenset(range(24)), "*"
    elif kind == "list":
        hours = frozenset(draw(st.sets(st.one_of(st.sampled_from([0, 1, 2, 3, 23]), st.integers(0, 23)),
                                       min_size=1, max_size=3)))
        h_field = ",".join(str(h) for h in sorted(hours))
    else:
        a = draw(st.integers(0, 22))
        b = draw(st.integers(a + 1, 23))
        hours, h_field = frozenset(range(a, b + 1)), f"{a}-{b}"
    # day of month, month, day of week: mostly '*'
    doms = draw(st.one_of(st.none(), st.none(), st.frozensets(st.integers(1, 31), min_size=1, max_size=2)))
    months = draw(st.one_of(st.none(), st.none(), st.frozensets(st.integers(1, 12), min_size=1, max_size=3)))
    dows = draw(st.one_of(st.none(), st.none(), st.frozensets(st.integers(0, 6), min_size=1, max_size=3)))
    if doms is not None and months is not None and dows is None:
        assume(min(doms) <= 28)  # a day that exists in every month (see the xfail on Feb 30)
    dom_field = "*" if doms is None else ",".join(str(d) for d in sorted(doms))
    if months is None:
        mon_field = "*"
    else:
        mon_field = ",".join(_case(draw, MONTH_NAMES[m - 1]) if draw(st.booleans()) else str(m) for m in sorted(months))
    if dows is None:
        dow_field = "*"
    else:
        parts = []
        for d in sorted(dows):
            how = draw(st.sampled_from(["num", "name", "seven"]))
            if how == "name":
                parts.append(_case(draw, DAY_NAMES[d]))
            elif how == "seven" and d == 0:
                parts.append("7")
            else:
                parts.append(str(d))
        dow_field = ",".join(parts)
    expr = f"{m_field} {h_field} {dom_field} {mon_field} {dow_field}"
    return CronSpec(expr, minutes, hours, doms, months, dows)


def _day_matches(spec: CronSpec, day: date) -> bool:
    if spec.months is not None and day.month not in spec.months:
        return False
    dom_ok = spec.doms is None or day.day in spec.doms
    dow_ok = spec.dows is None or day.isoweekday() % 7 in spec.dows
    if spec.doms is not None and spec.dows is not None:
        return dom_ok or dow_ok  # standard cron: both restricted -> either
    return dom_ok and dow_ok


def _first_instant(zone: ZoneInfo, wall: datetime) -> datetime | None:
    """The earliest naive UTC instant at which the zone's clock reads `wall`, or None (a gap).
    Found by trying every offset in force within a day and a half, without fold."""
    base = wall.replace(tzinfo=UTC)
    offsets = {(base + timedelta(hours=h)).astimezone(zone).utcoffset() for h in (-36, -18, -6, 0, 6, 18, 36)}
    hits = [wall - off for off in offsets
            if (wall - off).replace(tzinfo=UTC).astimezone(zone).replace(tzinfo=None) == wall]
    return min(hits) if hits else None


def oracle_next(spec: CronSpec, tz: str, after: datetime) -> datetime:
    """Brute-force reference: the first wall time matching the spec whose first occurrence is after `after`."""
    zone = ZoneInfo(tz)
    day = after.replace(tzinfo=UTC).astimezone(zone).date() - timedelta(days=1)
    found: list[datetime] = []
    found_on: date | None = None
    for _ in range(366 * 10):
        if found_on is not None and day > found_on + timedelta(days=1):
            break
        if _day_matches(spec, day):
            for h in spec.hours:
                for m in spec.minutes:
                    u = _first_instant(zone, datetime.combine(day, time(h, m)))
                    if u is not None and u > after:
                        found.append(u)
                        found_on = found_on or day
        day += timedelta(days=1)
    assert found, f"oracle found no point for {spec.expr!r} after {after}"
    return min(found)


@st.composite
def instants(draw, tz: str) -> datetime:
    """A naive UTC instant in 2026-2028, often within three hours of one of the zone's transitions."""
    if TRANSITIONS[tz] and draw(st.booleans()):
        center = draw(st.sampled_from(TRANSITIONS[tz]))
        return center + timedelta(microseconds=draw(st.integers(-3 * 3600 * 10**6, 3 * 3600 * 10**6)))
    return draw(st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2028, 12, 31)))


def _assert_is_a_real_first_occurrence(spec: CronSpec, tz: str, p: datetime) -> None:
    loc = local(p, tz)
    wall = loc.replace(tzinfo=None)
    # on a whole minute, matching the cron fields in local time
    assert (wall.second, wall.microsecond) == (0, 0)
    assert wall.minute in spec.minutes and wall.hour in spec.hours and _day_matches(spec, wall.date())
    # the wall time exists and this is its first occurrence: local -> UTC round-trips
    assert loc.fold == 0
    assert wall.replace(tzinfo=ZoneInfo(tz), fold=0).astimezone(UTC).replace(tzinfo=None) == p
    assert _first_instant(ZoneInfo(tz), wall) == p


PROPS = settings(max_examples=250, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@PROPS
@given(data=st.data(), tz=st.sampled_from(PROP_ZONES), spec=cron_specs())
def test_next_point_matches_brute_force_reference(data, tz, spec):
    assert cron_error(spec.expr) is None, spec.expr
    after = data.draw(instants(tz), label="after")
    got = next_point(cron(spec.expr, tz), after)
    assert got is not None and got > after
    _assert_is_a_real_first_occurrence(spec, tz, got)
    assert got == oracle_next(spec, tz, after)


@PROPS
@given(data=st.data(), tz=st.sampled_from(PROP_ZONES), spec=cron_specs())
def test_next_point_is_monotone(data, tz, spec):
    t = cron(spec.expr, tz)
    a = data.draw(instants(tz), label="a")
    b = a + timedelta(microseconds=data.draw(st.integers(0, 3 * 86400 * 10**6), label="delta_us"))
    na, nb = next_point(t, a), next_point(t, b)
    assert na > a and nb > b
    assert na <= nb
    # the point is found again from just before it, and the next one is strictly later
    assert next_point(t, na - US) == na
    assert next_point(t, na) > na
    # nothing between `a` and its next point: from any instant in between, the same point
    mid = a + (na - a) / 2
    assert next_point(t, mid) == na


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), tz=st.sampled_from(PROP_ZONES), spec=cron_specs())
def test_two_hundred_points_never_repeat(data, tz, spec):
    t = cron(spec.expr, tz)
    after = data.draw(instants(tz), label="after")
    pts = walk(t, after, 200)
    assert len(pts) == 200
    assert pts[0] > after
    assert strictly_increasing(pts)
    walls = [local(p, tz).replace(tzinfo=None) for p in pts]
    assert len(set(walls)) == len(walls)
    for p in pts:
        _assert_is_a_real_first_occurrence(spec, tz, p)
    # due_points over the same stretch gives the same chain
    assert due_points(t, pts[0], pts[-1], limit=500) == pts


@settings(max_examples=200, deadline=None, database=None)
@given(
    interval=st.integers(1, MAX_INTERVAL_S),
    anchor=st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2028, 12, 31)),
    after_us=st.integers(-10 * 86400 * 10**6, 400 * 86400 * 10**6),
    start_us=st.one_of(st.none(), st.integers(-10 * 86400 * 10**6, 400 * 86400 * 10**6)),
)
def test_interval_properties(interval, anchor, after_us, start_us):
    step = timedelta(seconds=interval)
    start = None if start_us is None else anchor + timedelta(microseconds=start_us)
    t = every(interval, anchor, start_at=start)
    after = anchor + timedelta(microseconds=after_us)
    p = next_point(t, after)
    assert p is not None and p > after
    assert p >= anchor and (p - anchor) % step == timedelta(0)
    assert start is None or p >= start
    # it is the earliest such grid point: the one before is excluded by after, the anchor or start_at
    prev = p - step
    assert prev <= after or prev < anchor or (start is not None and prev < start)
    fp = first_point(t)
    if start is None:
        assert fp == anchor + step
    else:
        assert fp >= start and fp >= anchor and (fp - anchor) % step == timedelta(0)
        assert fp - step < max(start, anchor)


@pytest.mark.parametrize("expr", ["5-1 * * * *", "0 0 * * fri-mon", "0 0 * dec-jan *", "0 23-1 * * *"])
def test_ranges_that_run_backwards_are_refused(expr):
    assert "backwards" in (cron_error(expr) or "")


def test_saturday_to_sunday_is_a_forward_range():
    assert cron_error("0 0 * * sat-sun") is None and cron_error("0 0 * * 5-7") is None
