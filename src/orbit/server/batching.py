"""Coalescing of concurrent commands into shared transactions (group commit).

Commands that meet on the same hot rows gain nothing from running in parallel
transactions: they queue on the row lock, each paying a commit while holding
it. Batched, they pay one lock wait and one commit between them.

A group's transaction is all or nothing, so one command the database refuses (a
value it cannot store, a group too large for one round trip) or that meets a bug
would fail the others with it. A group that fails for any reason but an outage is
therefore run again one command per transaction: each then gets its own answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import structlog

from .errors import DatabaseUnavailable
from .loops import raise_if_cancelled

log = structlog.get_logger("orbit.batching")

C = TypeVar("C")
R = TypeVar("R")


async def run_group(name: str, run: Callable[[list[C]], Awaitable[list[Any]]],
                    batch: list[tuple[C, asyncio.Future]], failed: str) -> None:
    """Run `batch` as one transaction and answer each command's future; if it fails but for an
    outage, run each command alone, so that only the commands at fault fail."""
    try:
        replies = await run([c for c, _ in batch])
    except Exception as exc:
        raise_if_cancelled(exc)
        if not isinstance(exc, DatabaseUnavailable):  # the database's health reports outages, once
            log.warning(failed, kind=name, size=len(batch), error=type(exc).__name__)
        if len(batch) == 1 or isinstance(exc, DatabaseUnavailable):
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for one in batch:
            await run_group(name, run, [one], failed)
        return
    for (_, fut), reply in zip(batch, replies):
        if not fut.done():
            fut.set_result(reply)


class GroupCommitter(Generic[C]):
    """Coalesce commands arriving within a few milliseconds into one transaction.

    Each caller gets a future of its own reply; up to `parallel` transactions run at once.
    """

    def __init__(
        self,
        name: str,
        run: Callable[[list[C]], Awaitable[list[dict[str, Any]]]],
        *,
        max_batch: int = 200,
        linger: float = 0.001,
        parallel: int = 4,
    ) -> None:
        self.name = name
        self._run = run
        self._max_batch = max_batch
        self._linger = linger
        self._pending: list[tuple[C, asyncio.Future]] = []
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(parallel)
        self._in_flight = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=f"group-commit-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def enqueue(self, command: C) -> asyncio.Future:
        """Queue `command`; its reply (or error) arrives on the returned future."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((command, fut))
        self._wake.set()
        return fut

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            # Linger only under load (a transaction in flight): an idle node answers at once.
            if len(self._pending) < self._max_batch and self._linger and self._in_flight:
                await asyncio.sleep(self._linger)
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
            if not self._pending:
                self._wake.clear()
            if batch:
                await self._slots.acquire()
                self._in_flight += 1
                asyncio.create_task(self._flush(batch))

    async def _flush(self, batch: list[tuple[C, asyncio.Future]]) -> None:
        try:
            await run_group(self.name, self._run, batch, "group_commit_failed")
        finally:
            for _, fut in batch:
                if not fut.done():
                    fut.cancel()  # the node is stopping
            self._in_flight -= 1
            self._slots.release()


class KeyedBatcher(Generic[C, R]):
    """Serve commands per key (a queue) one transaction at a time, each taking all that waited.

    Commands of one key meet on the same hot row anyway, so running them one
    transaction after another costs nothing, and whatever arrived while one was
    in flight goes into the next. No task lives for an idle key.
    """

    def __init__(self, name: str, run: Callable[[list[C]], Awaitable[list[R]]], *,
                 max_batch: int = 64, weight: Callable[[C], int] = lambda c: 1, max_weight: int = 64) -> None:
        self.name = name
        self._run = run
        self._max_batch = max_batch
        self._weight = weight
        self._max_weight = max_weight
        self._pending: dict[str, list[tuple[C, asyncio.Future]]] = {}
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, key: str, command: C) -> R:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        queue = self._pending.get(key)
        if queue is None:
            self._pending[key] = [(command, fut)]
            task = asyncio.create_task(self._serve(key), name=f"batch-{self.name}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            queue.append((command, fut))
        return await fut

    async def _serve(self, key: str) -> None:
        queue = self._pending[key]
        batch: list[tuple[C, asyncio.Future]] = []
        try:
            while queue:
                n, total = 0, 0
                while n < len(queue) and n < self._max_batch:
                    total += self._weight(queue[n][0])
                    if n and total > self._max_weight:
                        break
                    n += 1
                batch, queue[:] = queue[:n], queue[n:]
                await run_group(self.name, self._run, batch, "batch_failed")
        finally:
            del self._pending[key]
            for _, fut in batch + queue:
                if not fut.done():
                    fut.cancel()

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t
