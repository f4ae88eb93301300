"""Periodic background loops that stop between iterations, not in the middle of one.

Cancelling a coroutine while it waits on the database driver is unreliable: the
driver may turn the `CancelledError` into its own error while rolling back (asyncmy
raises `InterfaceError('Cancelled during execution')`), and a loop that logs and
carries on after errors would then swallow the cancel and never end, hanging the
node's shutdown. So loops are asked to stop through an event, checked between
iterations; cancellation is only the fallback after a grace period.

A loop that fails backs off (1, 2, 4, … 30 s) and logs at most one line per step: the first
failure with its traceback, the later ones by class, and one line when it works again. While
the database is down (the `gate`, store/health.py) loops do not run at all: the outage is the
database's to report, once; they resume at their own pace the moment it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from .core.outage import Backoff
from .errors import DatabaseUnavailable

log = structlog.get_logger("orbit.loops")


class Gate(Protocol):
    """What the loops ask of the database's health: whether to run, and until when to wait."""

    available: bool

    async def wait_available(self) -> None: ...


def raise_if_cancelled(exc: Exception) -> None:
    """Raise `CancelledError` if the current task is being cancelled and `exc` is how the
    driver reported that cancel; code that logs errors and carries on must call this first."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


class BackgroundLoops:
    """A set of named loops that each run ``fn`` every ``seconds`` until `stop`; none runs while
    ``gate`` (the database's health) says the database is down."""

    def __init__(self, gate: Gate | None = None) -> None:
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._gate = gate

    def every(self, seconds: float, name: str, fn: Callable[[], Awaitable[object]],
              *, wake: asyncio.Event | None = None) -> None:
        """Run ``fn`` now and then every ``seconds`` (sooner when ``wake`` is set); one
        failing loop never stops the others."""
        self._tasks.append(asyncio.create_task(self._run(seconds, name, fn, wake), name=name))

    async def _run(self, seconds: float, name: str, fn: Callable[[], Awaitable[object]],
                   wake: asyncio.Event | None) -> None:
        backoff = Backoff()
        failures = 0  # in a row, the database's refusals left out (reported by its health)
        while not self._stopping.is_set():
            if self._gate is not None and not self._gate.available:
                await self._until(self._gate.wait_available())
                continue
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelled(exc)
                delay = backoff.next()
                if not isinstance(exc, DatabaseUnavailable):
                    failures += 1
                    if failures == 1:
                        log.error("background_loop_failed", loop=name, retry_in_s=delay, exc_info=True)
                    else:
                        log.warning("background_loop_still_failing", loop=name, error=type(exc).__name__,
                                    failures=failures, retry_in_s=delay)
                await self._pause(delay, None)
                continue
            if failures:
                log.info("background_loop_recovered", loop=name, failures=failures)
                failures = 0
            backoff.reset()
            await self._pause(seconds, wake)

    async def _until(self, waiting: Awaitable[object]) -> None:
        """Wait for ``waiting`` or for `stop`, whichever comes first."""
        waits = [asyncio.ensure_future(waiting), asyncio.ensure_future(self._stopping.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _pause(self, seconds: float, wake: asyncio.Event | None) -> None:
        waits = [asyncio.ensure_future(self._stopping.wait())]
        if wake is not None:
            waits.append(asyncio.ensure_future(wake.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if wake is not None:
            wake.clear()

    async def stop(self, grace: float = 5.0) -> None:
        """Let every loop finish its iteration; cancel what is still running after ``grace`` s."""
        self._stopping.set()
        if not self._tasks:
            return
        _, late = await asyncio.wait(self._tasks, timeout=grace)
        for t in late:
            t.cancel()
        for t in late:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(t, 2.0)
        self._tasks.clear()
