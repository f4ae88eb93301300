"""Periodic background loops that stop between iterations, not in the middle of one.

Cancelling a coroutine while it waits on the database driver is unreliable: the
driver may turn the `CancelledError` into its own error while rolling back (asyncmy
raises `InterfaceError('Cancelled during execution')`), and a loop that logs and
carries on after errors would then swallow the cancel and never end, hanging the
node's shutdown. So loops are asked to stop through an event, checked between
iterations; cancellation is only the fallback after a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger("orbit.loops")


def raise_if_cancelled(exc: Exception) -> None:
    """Raise `CancelledError` if the current task is being cancelled and `exc` is how the
    driver reported that cancel; code that logs errors and carries on must call this first."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


class BackgroundLoops:
    """A set of named loops that each run ``fn`` every ``seconds`` until `stop`."""

    def __init__(self) -> None:
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task] = []

    def every(self, seconds: float, name: str, fn: Callable[[], Awaitable[object]],
              *, wake: asyncio.Event | None = None) -> None:
        """Run ``fn`` now and then every ``seconds`` (sooner when ``wake`` is set); one
        failing loop never stops the others."""
        self._tasks.append(asyncio.create_task(self._run(seconds, name, fn, wake), name=name))

    async def _run(self, seconds: float, name: str, fn: Callable[[], Awaitable[object]],
                   wake: asyncio.Event | None) -> None:
        while not self._stopping.is_set():
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelled(exc)
                log.warning("background_loop_failed", loop=name, exc_info=True)
            await self._pause(seconds, wake)

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
