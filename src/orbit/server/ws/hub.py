"""Node-wide worker machinery: session registry, wake-ups, group commit, pushes, drain.

Nodes never talk to each other: work committed on another node is found by
polling (long polls re-check at least every `POLL_INTERVAL`), and pushes for
leases held by this node's sessions are found in the `leases.push_pending` index.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import structlog
from sqlalchemy import select, update

from ..core.ids import new_id
from ..services import dispatch
from ..store.db import Database, Tx
from ..store.tables import credentials, leases, tasks

if TYPE_CHECKING:
    from .session import WorkerSession

log = structlog.get_logger("orbit.ws")

POLL_INTERVAL = 0.2
PUSH_INTERVAL = 0.25
REVOCATION_INTERVAL = 2.0

C = TypeVar("C")


class GroupCommitter(Generic[C]):
    """Coalesce commands arriving within a few milliseconds into one transaction.

    Each caller awaits its own reply; up to `parallel` transactions run at once.
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

    async def submit(self, command: C) -> dict[str, Any]:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((command, fut))
        self._wake.set()
        return await fut

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
            replies = await self._run([c for c, _ in batch])
            for (_, fut), reply in zip(batch, replies):
                if not fut.done():
                    fut.set_result(reply)
        except Exception as exc:
            log.warning("group_commit_failed", kind=self.name, size=len(batch), error=type(exc).__name__)
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        finally:
            self._in_flight -= 1
            self._slots.release()


class KeyedBatcher(Generic[C]):
    """Serve commands per key (a queue) one transaction at a time, each taking all that waited.

    Commands of one key meet on the same hot row anyway, so running them one
    transaction after another costs nothing, and whatever arrived while one was
    in flight goes into the next. No task lives for an idle key.
    """

    def __init__(self, name: str, run: Callable[[list[C]], Awaitable[list[dict[str, Any]]]], *,
                 max_batch: int = 64, weight: Callable[[C], int] = lambda c: 1, max_weight: int = 64) -> None:
        self.name = name
        self._run = run
        self._max_batch = max_batch
        self._weight = weight
        self._max_weight = max_weight
        self._pending: dict[str, list[tuple[C, asyncio.Future]]] = {}
        self._tasks: set[asyncio.Task] = set()

    async def submit(self, key: str, command: C) -> dict[str, Any]:
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
                try:
                    replies = await self._run([c for c, _ in batch])
                except Exception as exc:
                    log.warning("batch_failed", kind=self.name, size=len(batch), error=type(exc).__name__)
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, fut), reply in zip(batch, replies):
                    if not fut.done():
                        fut.set_result(reply)
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


class Notifier:
    """Wakes long polls on this node when a queue may have work or free capacity."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = defaultdict(asyncio.Event)

    def notify(self, queue_id: str) -> None:
        ev = self._events.get(queue_id)
        if ev is not None:
            ev.set()

    async def wait(self, queue_id: str, timeout: float) -> None:
        ev = self._events[queue_id]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout)
        ev.clear()


class WorkerHub:
    """Everything the worker sessions of one server process share."""

    def __init__(self, db: Database, node_id: str) -> None:
        self.db = db
        self.node_id = node_id
        # Unique per process so that pushes are routed to this process even if node ids repeat.
        self.instance_id = f"{node_id[:40]}:{new_id()[:12]}"
        self.sessions: dict[str, WorkerSession] = {}
        self.notifier = Notifier()
        self.draining = False
        self.drain_deadline_ms = 0
        self._push_wake = asyncio.Event()
        self._loops: list[asyncio.Task] = []
        self.starts = GroupCommitter("start", lambda cmds: dispatch.start(db, cmds))
        self.renews = GroupCommitter("renew", lambda cmds: dispatch.renew(db, cmds))
        self.completes = GroupCommitter("complete", lambda cmds: dispatch.complete(db, cmds))
        # A claim transaction reads (and may lease) up to the sum of its claims' max_tasks rows,
        # payloads included: bound it, so that many waiting sessions never make one huge read.
        self.claims: KeyedBatcher[dispatch.ClaimCommand] = KeyedBatcher(
            "claim", lambda cmds: dispatch.claim_many(db, cmds), weight=lambda c: c.max_tasks, max_weight=400)

    def start(self) -> None:
        for gc in (self.starts, self.renews, self.completes):
            gc.start()
        self._loops.append(asyncio.create_task(self._push_loop(), name="worker-push"))
        self._loops.append(asyncio.create_task(self._revocation_loop(), name="worker-revocation"))

    async def stop(self) -> None:
        for t in self._loops:
            t.cancel()
        for t in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for gc in (self.starts, self.renews, self.completes):
            await gc.stop()
        await self.claims.stop()

    def register(self, session: WorkerSession) -> None:
        self.sessions[session.session_id] = session

    def unregister(self, session: WorkerSession) -> None:
        self.sessions.pop(session.session_id, None)

    def wake_pushes(self) -> None:
        self._push_wake.set()

    async def begin_drain(self, deadline_ms: int) -> None:
        """Stop granting claims and tell every session to finish and reconnect elsewhere."""
        self.draining = True
        self.drain_deadline_ms = deadline_ms
        for s in list(self.sessions.values()):
            await s.push({"type": "drain", "deadline_ms": deadline_ms})
        for q in list(self.notifier._events):
            self.notifier.notify(q)

    async def leases_held(self) -> int:
        """Current leases held through this process's sessions (drain waits for zero)."""
        if not self.sessions:
            return 0

        async def read(tx: Tx) -> int:
            rows = await tx.all(
                select(leases.c.id).where(
                    leases.c.server_node_id == self.instance_id, leases.c.state.in_((dispatch.LEASED, dispatch.RUNNING))
                ).limit(1)
            )
            return len(rows)

        return await self.db.read(read)

    async def _push_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._push_wake.wait(), PUSH_INTERVAL)
            self._push_wake.clear()
            try:
                await self._push_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("push_loop_failed", exc_info=True)

    async def _push_once(self) -> None:
        async def read(tx: Tx):
            return await tx.all(
                select(leases.c.id, leases.c.session_id, leases.c.state, leases.c.outcome, leases.c.task_id,
                       tasks.c.cancel_requested, tasks.c.cancel_reason)
                .join(tasks, tasks.c.id == leases.c.task_id)
                .where(leases.c.server_node_id == self.instance_id, leases.c.push_pending.is_(True))
                .limit(500)
            )

        rows = await self.db.read(read)
        if not rows:
            return
        for r in rows:
            session = self.sessions.get(r["session_id"])
            if session is None:
                continue
            if r["state"] == dispatch.ENDED:
                await session.push({"type": "lease_revoked", "lease_id": r["id"],
                                    "reason": (r["outcome"] or "REVOKED").lower()})
            elif r["cancel_requested"]:
                await session.push({"type": "cancel_requested", "lease_id": r["id"], "task_id": r["task_id"],
                                    "reason": r["cancel_reason"] or ""})
        ids = [r["id"] for r in rows]

        async def clear(tx: Tx) -> None:
            await tx.execute(update(leases).where(leases.c.id.in_(ids)).values(push_pending=False))

        await self.db.transaction(clear)

    async def _revocation_loop(self) -> None:
        """Close sessions of revoked credentials within a few seconds."""
        while True:
            await asyncio.sleep(REVOCATION_INTERVAL)
            creds = {s.identity.principal.credential_id for s in self.sessions.values() if s.identity}
            if not creds:
                continue
            try:
                async def read(tx: Tx):
                    return await tx.all(
                        select(credentials.c.id).where(credentials.c.id.in_(creds), credentials.c.revoked_at.is_not(None))
                    )

                revoked = {r["id"] for r in await self.db.read(read)}
            except Exception:
                log.warning("revocation_check_failed", exc_info=True)
                continue
            for s in list(self.sessions.values()):
                if s.identity and s.identity.principal.credential_id in revoked:
                    await s.close(4401, "credential revoked")
