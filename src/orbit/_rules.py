"""Field rules shared by the SDK models and the server (names, reasons, revisions)."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
REVISION_RE = re.compile(r"^[1-9][0-9]{0,19}$")
IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,128}$")
UINT64_MAX = (1 << 64) - 1
REASON_MAX_CHARS = 1024


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


def parse_revision(value: str) -> int:
    """A non-zero uint64 as a canonical decimal string."""
    if not REVISION_RE.match(value) or int(value) > UINT64_MAX:
        raise ValueError("must be the decimal string of a non-zero uint64, e.g. \"1\"")
    return int(value)


def is_idempotency_key(value: str | None) -> bool:
    return value is not None and bool(IDEMPOTENCY_KEY_RE.match(value))
