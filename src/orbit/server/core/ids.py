"""Identifiers: 32 lowercase hex characters, time-ordered (UUIDv7 layout).

Time ordering keeps primary-key inserts append-friendly in InnoDB and lets
lists ordered by id follow creation order.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time

_ID_RE = re.compile(r"^[0-9a-f]{32}\Z")  # `\Z`: `$` would accept a trailing newline
_lock = threading.Lock()
_last_ms = 0
_seq = 0
# Ids must be unique, not secret (every access is checked against the credential), so their random
# bits come from a generator seeded by the OS instead of a getrandom() system call per id; a forked
# child reseeds so that it never repeats its parent's sequence.
_random = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(32)))


_MS_MASK = (1 << 48) - 1
_VERSION_VARIANT = 0x7 << 76 | 0b10 << 62


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
            _seq = _random.getrandbits(10)
        _last_ms = ms
        seq = _seq
    # Version 7 (bits 76-79) and variant 0b10 (bits 62-63); bytes.hex() formats twice as fast as `:032x`.
    value = (ms & _MS_MASK) << 80 | _VERSION_VARIANT | seq << 64 | _random.getrandbits(62)
    return value.to_bytes(16, "big").hex()


def is_id(value: object) -> bool:
    return isinstance(value, str) and bool(_ID_RE.match(value))


NODE_ID_MAX = 128
# A node id (a worker's `hello`, a server's --node-id): 1-128 printable ASCII characters, no space
# at either end. ASCII because it is stored in ASCII columns (a table of every lease; widening one
# to another character set would copy it whole); no space at the ends because MariaDB compares
# such columns ignoring trailing spaces, so "a" and "a " would be one node there and two on SQLite.
_NODE_ID_RE = re.compile(r"^[\x21-\x7e](?:[\x20-\x7e]{0,126}[\x21-\x7e])?\Z")
NODE_ID_RULE = f"1-{NODE_ID_MAX} printable ASCII characters, not starting or ending with a space"


def is_node_id(value: object) -> bool:
    return isinstance(value, str) and bool(_NODE_ID_RE.match(value))
