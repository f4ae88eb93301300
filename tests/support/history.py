"""Checks over stored history (lease and start times), shared by the cluster tests and the benchmarks.

Limits are proven from what the database recorded, not from client-side guesses.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from orbit.server.core.rate_window import WINDOW


def rate_windows(starts: Iterable[datetime]) -> list[int]:
    """Starts per rebuilt database window: the first Start opens one, it lasts one second."""
    counts: list[int] = []
    window_start: datetime | None = None
    for t in sorted(starts):
        if window_start is None or t >= window_start + WINDOW:
            window_start = t
            counts.append(0)
        counts[-1] += 1
    return counts


def max_overlap(intervals: Iterable[tuple[datetime, datetime]]) -> int:
    """The largest number of [start, end) intervals open at one instant."""
    events = []
    for a, b in intervals:
        events.append((a, 1))
        events.append((b, -1))
    events.sort(key=lambda e: (e[0], e[1]))
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best
