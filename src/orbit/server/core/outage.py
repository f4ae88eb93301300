"""A node that cannot reach its database: how often to retry, what to tell clients, what to log.

Pure rules on the monotonic clock (`now` in seconds), so that the timing is tested without a
database. `store/health.py` holds the node's one `Outage` and feeds it real attempts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Log lines (and retries of a failing loop) come at most once per step: 1, 2, 4, … 30, 30 s.
BACKOFF_INITIAL_S = 1.0
BACKOFF_CAP_S = 30.0
# What a refused client is told to wait: grows with the outage but stays short, so that clients
# are back within seconds of the database.
RETRY_AFTER_MIN_MS = 1000
RETRY_AFTER_MAX_MS = 5000


@dataclass
class Backoff:
    """Exponential and capped; `next()` gives the delay of the next step and moves on to it."""

    initial: float = BACKOFF_INITIAL_S
    cap: float = BACKOFF_CAP_S
    factor: float = 2.0
    steps: int = 0

    def peek(self) -> float:
        return min(self.cap, self.initial * self.factor ** self.steps)

    def next(self) -> float:
        delay = self.peek()
        if delay < self.cap:
            self.steps += 1
        return delay

    def reset(self) -> None:
        self.steps = 0


@dataclass(frozen=True)
class Report:
    """One log line to write: its event name and fields (never a traceback)."""

    event: str
    fields: dict[str, Any]


@dataclass
class Outage:
    """Whether the database is down, since when, and when the next "still down" line is due.

    `failed` is fed every real attempt that could not reach the database, `recovered` the first
    one that did; each answers the line to log, if any: one when the outage begins, at most one
    per backoff step while it lasts, one when it ends.
    """

    down_since: float | None = None
    failures: int = 0
    error: str = ""
    backoff: Backoff = field(default_factory=Backoff)
    _next_report_at: float = 0.0
    _step: float = 0.0  # the backoff step the outage is in (what clients are told to wait)

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, now: float, error: str) -> Report | None:
        self.failures += 1
        self.error = error
        if self.down_since is None:
            self.down_since = now
            self.failures = 1
            self.backoff.reset()
            self._step = self.backoff.next()
            self._next_report_at = now + self._step
            return Report("database_unavailable", {"error": error})
        if now < self._next_report_at:
            return None
        self._step = self.backoff.next()
        self._next_report_at = now + self._step
        return Report("database_still_unavailable", {
            "error": error, "down_s": round(now - self.down_since, 1), "failed_attempts": self.failures,
            "next_report_in_s": self._step,
        })

    def recovered(self, now: float) -> Report | None:
        if self.down_since is None:
            return None
        report = Report("database_available", {
            "down_s": round(now - self.down_since, 1), "failed_attempts": self.failures})
        self.down_since = None
        self.failures = 0
        self.error = ""
        self.backoff.reset()
        self._step = 0.0
        return report

    def retry_after_ms(self) -> int:
        """What a refused request or command is told to wait before resending it."""
        step_ms = int(self._step * 1000) if self.down else 0
        return max(RETRY_AFTER_MIN_MS, min(RETRY_AFTER_MAX_MS, step_ms))
