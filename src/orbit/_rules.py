"""Field rules shared by the SDK models and the server (names, reasons, revisions)."""

from __future__ import annotations

import re

# `\Z`, not `$`: `$` also matches before a trailing newline, which would let "name\n" through.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}\Z")
REVISION_RE = re.compile(r"^[1-9][0-9]{0,19}\Z")
UINT64_RE = re.compile(r"^(0|[1-9][0-9]{0,19})\Z")
IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,128}\Z")
# RFC 3339 date-time: seconds required, optional fraction, and an offset of exactly `Z` or `±hh:mm`.
RFC3339_RE = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)
UINT64_MAX = (1 << 64) - 1
REASON_MAX_CHARS = 1024
ID_PATTERN = "^[0-9a-f]{32}$"
ID_RE = re.compile(r"^[0-9a-f]{32}\Z")


def _at_most(limit: str) -> str:
    """A regular expression (no anchors) for the decimal numbers without leading zeros from 1 to
    `limit`: shorter numbers, then per digit of `limit` a smaller digit followed by any."""
    shorter = f"[1-9][0-9]{{0,{len(limit) - 2}}}" if len(limit) > 1 else ""
    branches = [shorter] if shorter else []
    for i, digit in enumerate(limit):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            rest = len(limit) - i - 1
            smaller = f"[{low}-{int(digit) - 1}]" if int(digit) - 1 > low else str(low)
            branches.append(limit[:i] + smaller + (f"[0-9]{{{rest}}}" if rest else ""))
    branches.append(limit)
    return "(" + "|".join(branches) + ")"


# uint64 decimal strings exactly as the server takes them (no sign, no leading zero, at most
# 2^64 - 1), for the document: JSON Schema has no maximum for a string.
NONZERO_UINT64_PATTERN = "^" + _at_most(str(UINT64_MAX)) + "$"
UINT64_PATTERN = "^(0|" + _at_most(str(UINT64_MAX))[1:] + "$"


# A character that is not blank: not one `str.strip()` removes. Spelled out so that the document's
# pattern (ECMA 262 regular expressions, whose `\s` is another set) means what `check_reason` does.
NOT_BLANK_PATTERN = "[^\\t-\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"


def check_name(value: str) -> str:
    if not NAME_RE.match(value):
        raise ValueError(
            "must be 1-128 characters: an ASCII letter or digit, then letters, digits, '_', '.', ':' or '-'"
        )
    return value


def check_reason(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    if len(value) > REASON_MAX_CHARS:
        raise ValueError(f"must be at most {REASON_MAX_CHARS} characters")
    return value


def check_id(value: str) -> str:
    if not ID_RE.match(value):
        raise ValueError("must be an id: 32 lowercase hex characters")
    return value


def check_uint64(value: str) -> str:
    """A uint64 as a canonical decimal string (`0` included)."""
    if not UINT64_RE.match(value) or int(value) > UINT64_MAX:
        raise ValueError("must be the decimal string of a uint64, e.g. \"0\"")
    return value


def parse_revision(value: str) -> int:
    """A non-zero uint64 as a canonical decimal string."""
    if not REVISION_RE.match(value) or int(value) > UINT64_MAX:
        raise ValueError("must be the decimal string of a non-zero uint64, e.g. \"1\"")
    return int(value)


def is_idempotency_key(value: str | None) -> bool:
    return value is not None and bool(IDEMPOTENCY_KEY_RE.match(value))


def check_timestamp(value: str) -> str:
    """RFC 3339 with an explicit offset; kept as text, converted by the server."""
    from datetime import datetime

    text = value.strip()
    if not RFC3339_RE.match(text):
        raise ValueError("must be an RFC 3339 timestamp such as 2026-11-29T22:21:53Z")
    if text[-1] in "zZ":
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError("must be an RFC 3339 timestamp such as 2026-11-29T22:21:53Z") from None
    if parsed.tzinfo is None:
        raise ValueError("must carry an offset such as Z or +01:00")
    return value
