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
import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import structlog

from .errors import DatabaseUnavailable, DomainError, overloaded
from .loops import raise_if_cancelled
from .overload import deadline, waits_until

log = structlog.get_logger("orbit.batching")

C = TypeVar("C")
R = TypeVar("R")

# A command still waiting for its transaction this long after it was queued (or when the waits of
# the request that queued it must end, if sooner: `overload.deadline`) is answered UNAVAILABLE
# instead of being run: the node is overloaded, and its caller is better served by a prompt
# refusal it may resend (same message id, same idempotency key) than by a late answer.
MAX_QUEUED_S = 2.0


def _due_by() -> float:
    """When a command queued now must have begun its transaction."""
    latest = time.monotonic() + MAX_QUEUED_S
    at = deadline()
    return latest if at is None or at > latest else at


def _refuse_late(queue: list[tuple[C, asyncio.Future, float]], refuse: Callable[[asyncio.Future], None]) -> None:
    """Take the commands whose time to begin is over out of `queue`, each refused through `refuse`."""
    now = time.monotonic()
    if all(due >= now for _, _, due in queue):
        return
    keep = []
    for item in queue:
        if item[2] >= now:
            keep.append(item)
        elif not item[1].done():
            refuse(item[1])
    queue[:] = keep


def _run_by(batch: list[tuple[C, asyncio.Future, float]]) -> contextlib.AbstractContextManager[None]:
    """Within this block the batch's waits (for a connection) end when its first command's must."""
    return waits_until(min(due for _, _, due in batch))


async def run_group(name: str, run: Callable[[list[C]], Awaitable[list[Any]]],
                    batch: list[tuple[C, asyncio.Future]], failed: str) -> None:
    """Run `batch` as one transaction and answer each command's future; if it fails but for an
    outage, run each command alone, so that only the commands at fault fail."""
    try:
        replies = await run([c for c, _ in batch])
    except Exception as exc:
        raise_if_cancelled(exc)
        # The database's health reports outages, once; a refusal (QUEUE_FULL, …) is an answer.
        if not isinstance(exc, (DatabaseUnavailable, DomainError)):
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
        # Starts, renewals and reports of a queue all meet on its usage row: two transactions at
        # once keep the database busy while the next group gathers; more only wait on that row.
        parallel: int = 2,
    ) -> None:
        self.name = name
        self._run = run
        self._max_batch = max_batch
        self._linger = linger
        self.shed = 0  # commands answered UNAVAILABLE for waiting too long (`MAX_QUEUED_S`)
        self._pending: list[tuple[C, asyncio.Future, float]] = []
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(parallel)
        self._in_flight = 0
        self._task: asyncio.Task | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._event_loop = asyncio.get_running_loop()
        self._task = self._event_loop.create_task(self._loop(), name=f"group-commit-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def enqueue(self, command: C) -> asyncio.Future:
        """Queue `command`; its reply (or error) arrives on the returned future. A command still
        waiting for its transaction when its time is over (`MAX_QUEUED_S`) is answered
        UNAVAILABLE instead."""
        # The loop it was started on: asking asyncio for the running loop is a getpid() each time.
        loop = self._event_loop or asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._pending.append((command, fut, _due_by()))
        self._wake.set()
        return fut

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
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
                loop.create_task(self._flush(batch))

    def _refuse(self, fut: asyncio.Future) -> None:
        self.shed += 1
        fut.set_result(overloaded())  # a command's own result: its reply carries retry_after_ms

    async def _flush(self, batch: list[tuple[C, asyncio.Future, float]]) -> None:
        try:
            _refuse_late(batch, self._refuse)
            if not batch:
                return
            with _run_by(batch):
                await run_group(self.name, self._run, [(c, fut) for c, fut, _ in batch], "group_commit_failed")
        finally:
            for _, fut, _ in batch:
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
        self.shed = 0  # commands refused UNAVAILABLE for waiting too long (`MAX_QUEUED_S`)
        self._pending: dict[str, list[tuple[C, asyncio.Future, float]]] = {}
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, key: str, command: C) -> R:
        """The command's reply; raises UNAVAILABLE (`overloaded`) when the command's time to begin
        its transaction was over first (it never ran)."""
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        queue = self._pending.get(key)
        if queue is None:
            self._pending[key] = [(command, fut, _due_by())]
            # A context of its own: the task serves later callers too, never under this one's deadline.
            task = asyncio.create_task(self._serve(key), name=f"batch-{self.name}", context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            queue.append((command, fut, _due_by()))
        return await fut

    def waiting(self, key: str) -> int:
        """Commands of `key` queued behind the transaction now in flight."""
        queue = self._pending.get(key)
        return len(queue) if queue else 0

    def _refuse(self, fut: asyncio.Future) -> None:
        self.shed += 1
        fut.set_exception(overloaded())

    async def _serve(self, key: str) -> None:
        queue = self._pending[key]
        batch: list[tuple[C, asyncio.Future, float]] = []
        try:
            while queue:
                _refuse_late(queue, self._refuse)
                if not queue:
                    break
                n, total = 0, 0
                while n < len(queue) and n < self._max_batch:
                    total += self._weight(queue[n][0])
                    if n and total > self._max_weight:
                        break
                    n += 1
                batch, queue[:] = queue[:n], queue[n:]
                with _run_by(batch):
                    await run_group(self.name, self._run, [(c, fut) for c, fut, _ in batch], "batch_failed")
        finally:
            del self._pending[key]
            for _, fut, _ in batch + queue:
                if not fut.done():
                    fut.cancel()

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t
