"""Timestamps: RFC 3339 UTC with microseconds and `Z` out, any RFC 3339 offset in."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.server.core.timefmt import format_ts, parse_rfc3339, to_naive_utc

FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z\Z")
naive = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30))
offsets = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59).map(
    lambda m: timezone(timedelta(minutes=m))
)


def test_format_exact():
    assert format_ts(datetime(2026, 11, 29, 22, 21, 53, 123456)) == "2026-11-29T22:21:53.123456Z"
    assert format_ts(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05.000000Z"
    assert format_ts(datetime(999, 1, 2, 3, 4, 5, 7)) == "0999-01-02T03:04:05.000007Z"
    assert format_ts(None) is None


def test_format_converts_aware_to_utc():
    plus = timezone(timedelta(hours=5, minutes=30))
    assert format_ts(datetime(2026, 11, 30, 3, 51, 53, 1, tzinfo=plus)) == "2026-11-29T22:21:53.000001Z"
    assert format_ts(datetime(2026, 11, 29, 22, 21, 53, tzinfo=UTC)) == "2026-11-29T22:21:53.000000Z"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-29T22:21:53Z", datetime(2026, 11, 29, 22, 21, 53)),
        ("2026-11-29T22:21:53.123456Z", datetime(2026, 11, 29, 22, 21, 53, 123456)),
        ("2026-11-29t22:21:53z", datetime(2026, 11, 29, 22, 21, 53)),
        ("2026-11-29 22:21:53Z", datetime(2026, 11, 29, 22, 21, 53)),
        ("2026-11-29T22:21:53+00:00", datetime(2026, 11, 29, 22, 21, 53)),
        ("2026-11-29T22:21:53-00:00", datetime(2026, 11, 29, 22, 21, 53)),
        ("2026-11-30T03:51:53.5+05:30", datetime(2026, 11, 29, 22, 21, 53, 500000)),
        ("2026-11-29T14:21:53-08:00", datetime(2026, 11, 29, 22, 21, 53)),
        ("2026-12-31T23:30:00-01:00", datetime(2027, 1, 1, 0, 30)),
    ],
)
def test_parse_accepts_offsets_and_returns_naive_utc(text, expected):
    parsed = parse_rfc3339(text)
    assert parsed.tzinfo is None
    assert parsed == expected


def test_parse_more_than_six_fraction_digits():
    parsed = parse_rfc3339("2026-11-29T22:21:53.123456789Z")
    assert parsed.replace(microsecond=0) == datetime(2026, 11, 29, 22, 21, 53)
    assert parsed.microsecond in (123456, 123457)


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-29T22:21:53",  # no offset
        "2026-11-29T22:21:53.123456",
        "2026-11-29",
        "2026-11-29T22:21Z",  # no seconds
        "22:21:53Z",
        "",
        "garbage",
        "not-a-timestamp-at-all",
        "2026-11-29X22:21:53Z",
        "20261129T222153Z",
        "2026-11-29T22:21:53+05",  # ISO 8601 but not RFC 3339
        "2026-11-29T22:21:53+0530",
        "2026-11-29T22:21:53.Z",
        "2026-11-29T22:21:53+00:00:30",
        "2026-11-29T22:21:53ZZ",
        "2026-11-29T22:21:53+05:30Z",
        "2026-13-01T00:00:00Z",
        "2026-02-30T00:00:00Z",
        "2026-11-29T24:00:00Z",
        "2026-11-29T22:60:00Z",
        "2026-11-29T22:21:53+24:00",
        "\uff12\uff10\uff12\uff16-11-29T22:21:53Z",  # full-width digits
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
    ],
)
def test_parse_rejects(text):
    with pytest.raises(ValueError):
        parse_rfc3339(text)


@settings(max_examples=150, deadline=None)
@given(naive)
def test_format_parse_round_trip(value):
    text = format_ts(value)
    assert FORMAT.match(text), text
    assert parse_rfc3339(text) == value


@settings(max_examples=150, deadline=None)
@given(naive, offsets)
def test_any_offset_parses_to_the_same_instant(value, tz):
    aware = value.replace(tzinfo=UTC).astimezone(tz)
    assert parse_rfc3339(aware.isoformat()) == value
    assert to_naive_utc(aware) == value
    assert format_ts(aware) == format_ts(value)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40))
def test_parse_never_fails_other_than_value_error(text):
    try:
        parsed = parse_rfc3339(text)
    except ValueError:
        return
    assert parsed.tzinfo is None
