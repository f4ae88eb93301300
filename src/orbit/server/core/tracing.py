"""W3C trace context (https://www.w3.org/TR/trace-context/): which `traceparent` headers to keep."""

from __future__ import annotations

import re

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def parse_traceparent(header: str | None) -> str | None:
    """The header if it is a valid traceparent, else None: an invalid one is ignored (a new
    trace starts), as the recommendation says, rather than failing the request."""
    if header is None:
        return None
    m = _TRACEPARENT.match(header.strip())
    if m is None:
        return None
    version, trace_id, parent_id, _ = m.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return m.group(0)
