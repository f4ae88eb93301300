"""Whether this node can reach its database: the one answer the loops, readiness, the worker hub
and the error replies consult.

The outage is detected from real failures: an operation that lost its connection, could not
open one, or waited too long for one reports it here (`lost`). One failure alone proves little
(a pooled connection the server had closed fails once), so it is confirmed by a probe on a fresh
connection; only a failed probe declares the outage. While the database is down, operations are
refused at once without touching the network (`available` is False), the probe runs every
`PROBE_INTERVAL_S` and the first one that succeeds ends the outage: pools are emptied of their
dead connections, then every listener hears it. Log lines follow `core/outage.py`: one when the
outage begins, one per backoff step, one when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog

from ..core.outage import Outage, Report
from ..errors import DatabaseUnavailable
from .dialect import driver_error, mysql_error_code

log = structlog.get_logger("orbit.store")

PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 3.0


def describe(exc: BaseException) -> str:
    """The error's class and driver code, never its message (it may quote statement values)."""
    orig = driver_error(exc)
    code = mysql_error_code(exc)
    return type(orig).__name__ + (f" {code}" if code is not None else "")


class DatabaseHealth:
    def __init__(self, probe: Callable[[], Awaitable[object]],
                 on_recovering: Callable[[], Awaitable[object]] | None = None,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        self._probe = probe
        self._on_recovering = on_recovering
        self._clock = clock
        self._outage = Outage()
        # Read on every transaction: a plain attribute, changed only when the outage begins or ends.
        self.available = True
        self._back = asyncio.Event()
        self._back.set()
        self._prober: asyncio.Task | None = None
        self._listeners: list[Callable[[bool], None]] = []

    # ------------------------------------------------------------ what the store reports

    def lost(self, exc: BaseException) -> None:
        """A real operation could not reach the database: confirm (or keep probing) in the background."""
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_until_reachable(),
                                                                  name="database-probe")

    # ------------------------------------------------------------ what everyone else asks

    @property
    def down_since(self) -> float | None:
        return self._outage.down_since

    def unavailable(self, reason: str = "the database is unreachable") -> DatabaseUnavailable:
        """The refusal to raise: its `retry_after_ms` grows with the outage (1 s to 5 s)."""
        return DatabaseUnavailable(reason, retry_after_ms=self._outage.retry_after_ms())

    def retry_after_ms(self) -> int:
        return self._outage.retry_after_ms()

    async def wait_available(self) -> None:
        await self._back.wait()

    def subscribe(self, listener: Callable[[bool], None]) -> None:
        """`listener(available)` is called when an outage begins (False) and when it ends (True)."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[bool], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def close(self) -> None:
        if self._prober is not None and not self._prober.done():
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._prober

    # ------------------------------------------------------------ the probe

    async def _probe_until_reachable(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._probe(), PROBE_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)
                await asyncio.sleep(PROBE_INTERVAL_S)
                continue
            if not self.available:
                await self._recovered()
            return

    def _failed(self, exc: BaseException) -> None:
        began = not self._outage.down
        self._write(self._outage.failed(self._clock(), describe(exc)))
        if began:
            self.available = False
            self._back.clear()
            self._tell(False)

    async def _recovered(self) -> None:
        if self._on_recovering is not None:
            try:
                await self._on_recovering()  # dead pooled connections go before anyone is let in
            except Exception as exc:
                log.warning("database_pool_reset_failed", error=describe(exc))
        self._write(self._outage.recovered(self._clock()))
        self.available = True
        self._back.set()
        self._tell(True)

    def _tell(self, available: bool) -> None:
        for listener in self._listeners:
            try:
                listener(available)
            except Exception:
                log.exception("database_listener_failed")

    @staticmethod
    def _write(report: Report | None) -> None:
        if report is None:
            return
        level = log.info if report.event == "database_available" else log.warning
        level(report.event, **report.fields)
