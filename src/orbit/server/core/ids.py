"""Identifiers: 32 lowercase hex characters, time-ordered (UUIDv7 layout).

Time ordering keeps primary-key inserts append-friendly in InnoDB and lets
lists ordered by id follow creation order.
"""

from __future__ import annotations

import os
import re
import threading
import time

_ID_RE = re.compile(r"^[0-9a-f]{32}\Z")  # `\Z`: `$` would accept a trailing newline
_lock = threading.Lock()
_last_ms = 0
_seq = 0


def new_id() -> str:
    """Return a UUIDv7 as 32 hex chars, monotonic within this process."""
    global _last_ms, _seq
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _seq += 1
            if _seq > 0xFFF:
                ms += 1
                _seq = 0
        else:
            _seq = int.from_bytes(os.urandom(2), "big") & 0x3FF
        _last_ms = ms
        seq = _seq
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= seq << 64
    value |= 0b10 << 62
    value |= rand
    return f"{value:032x}"


def is_id(value: object) -> bool:
    return isinstance(value, str) and bool(_ID_RE.match(value))
