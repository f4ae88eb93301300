"""What a client's JSON value (a payload, a template's payload) may be to be stored and shown.

Stored values are written back inside answers and event rows, up to eight levels below their
top (`{"data":{"items":[{"data":{"task":{"payload": …}}}]}}`); the encoder stops at 254 levels.
A value deeper than 246 would be accepted and then fail every answer that carries it (and every
write grouped with it), so it is refused at the door instead.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_DEPTH = 246
_ROOM = 254 - MAX_DEPTH


class JsonValueError(ValueError):
    """Why a value cannot be stored; the caller names the field."""


def encode(value: Any, limit: int) -> bytes:
    """The value encoded, or JsonValueError when it is larger than `limit` bytes or nested
    deeper than MAX_DEPTH. Depth is checked only when the text could be that deep, so that an
    ordinary payload costs one encode, as before."""
    try:
        encoded = orjson.dumps(value)
    except orjson.JSONEncodeError:
        raise JsonValueError(f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    if len(encoded) > limit:
        raise JsonValueError(f"serialized size {len(encoded)} bytes exceeds the {limit}-byte limit")
    if encoded.count(b"[") + encoded.count(b"{") >= MAX_DEPTH:
        wrapped = value
        for _ in range(_ROOM):
            wrapped = [wrapped]
        try:
            orjson.dumps(wrapped)
        except orjson.JSONEncodeError:
            raise JsonValueError(f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    return encoded
