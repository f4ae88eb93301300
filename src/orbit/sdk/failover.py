"""Which server the worker connects to next, and how long it waits first (no I/O).

Every node serves the same database, so a worker's leases, Starts and reports are
good through any of them: when a session is lost or a node refuses it, the worker
tries the next URL at once, and backs off only after a whole round of URLs without
a session that lasted. A dead node thus costs no wait while another is up, and a
cluster that is down is not hammered.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

__all__ = ["LASTING_SESSION_S", "Failover"]

# A session that lived this long proves its node good: the round and the backoff start over.
LASTING_SESSION_S = 5.0


def _jitter() -> float:
    return random.uniform(0.5, 1.5)


class Failover:
    """The URL to connect to (`current`) and the wait before the next connection.

    `failed()` (a connection or its hello refused) and `lost()` (an open session
    ended, whatever the reason) move to the next URL and return the seconds to
    wait before connecting to it: 0 while the round has URLs not tried yet, else
    the backoff (`initial` doubling to `maximum`, times `jitter()`, and at least
    the largest `Retry-After` heard in the round).
    """

    def __init__(self, urls: Sequence[str], initial: float, maximum: float,
                 jitter: Callable[[], float] = _jitter) -> None:
        if not urls:
            raise ValueError("Failover needs at least one URL")
        self.urls = list(urls)
        self.initial = initial
        self.maximum = maximum
        self._jitter = jitter
        self._index = 0
        self._tried = 0  # URLs tried this round without a lasting session
        self._delay = initial
        self._hint = 0.0
        self._opened_at: float | None = None

    @property
    def current(self) -> str:
        return self.urls[self._index]

    def connected(self, now: float) -> None:
        """A session opened on `current` at monotonic time `now`."""
        self._opened_at = now

    def failed(self, retry_after: float = 0.0) -> float:
        """Connecting to `current` failed; `retry_after` is the server's hint, if any."""
        self._tried += 1
        self._hint = max(self._hint, retry_after)
        return self._advance()

    def lost(self, now: float) -> float:
        """The session on `current` ended at monotonic time `now` (closed, killed, drained)."""
        opened, self._opened_at = self._opened_at, None
        if opened is not None and now - opened >= LASTING_SESSION_S:
            self._tried, self._delay, self._hint = 1, self.initial, 0.0
        else:
            self._tried += 1
        return self._advance()

    def _advance(self) -> float:
        self._index = (self._index + 1) % len(self.urls)
        if self._tried < len(self.urls):
            return 0.0
        wait = max(self._delay, self._hint) * self._jitter()
        self._delay = min(self.maximum, max(self._delay, self.initial) * 2)
        self._tried, self._hint = 0, 0.0
        return wait
