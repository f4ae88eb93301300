"""Timestamps: naive UTC inside the store, RFC 3339 with microseconds and `Z` outside."""

from __future__ import annotations

from datetime import datetime, timezone

from ..._rules import RFC3339_RE


def to_naive_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)


_last: tuple[datetime | None, str | None] = (None, None)


def format_ts(value: datetime | None) -> str | None:
    """`2026-11-29T22:21:53.123456Z` for a naive-UTC or aware datetime.

    The last value formatted is remembered: a transaction stamps many rows with one clock
    reading (a 500-task batch formats the same `now` 1,500 times)."""
    global _last
    if value is None:
        return None
    last = _last
    if value is last[0]:
        return last[1]
    # isoformat, not strftime: `%Y` does not zero-pad years before 1000 on glibc.
    text = to_naive_utc(value).isoformat(timespec="microseconds") + "Z"
    _last = (value, text)
    return text


def parse_rfc3339(value: str) -> datetime:
    """Parse an RFC 3339 timestamp with any offset into naive UTC.

    RFC 3339 requires an offset (`Z` or `±hh:mm`); a bare local time is refused, and
    so are the other ISO 8601 forms `fromisoformat` would take (`+05`, `+0530`, `.Z`).
    """
    text = value.strip()
    if not RFC3339_RE.match(text):
        raise ValueError("not an RFC 3339 timestamp")
    if text[-1] in "zZ":
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        raise ValueError("RFC 3339 timestamp needs an offset such as Z")
    try:
        return to_naive_utc(parsed)
    except OverflowError:
        # Years 1 and 9999 with an offset leave datetime's range in UTC; callers expect ValueError.
        raise ValueError("timestamp out of range") from None
