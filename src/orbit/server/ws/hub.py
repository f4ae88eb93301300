"""Node-wide worker machinery: session registry, wake-ups, group commit, pushes, drain.

Nodes never talk to each other: work committed on another node is found by
polling (long polls re-check at least every `POLL_INTERVAL`), and pushes for
leases held by this node's sessions are found in the `leases.push_pending` index.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import select, update

from ..batching import GroupCommitter, KeyedBatcher
from ..core.ids import new_id
from ..loops import BackgroundLoops
from ..services import dispatch
from ..store.db import Database, Tx
from ..store.tables import credentials, leases

if TYPE_CHECKING:
    from .session import WorkerSession

log = structlog.get_logger("orbit.ws")

POLL_INTERVAL = 0.2
PUSH_INTERVAL = 0.25
REVOCATION_INTERVAL = 2.0

class Notifier:
    """Wakes long polls on this node when a queue may have work or free capacity.

    A wake-up is sized: `notify(queue, count)` wakes the longest-waiting claims whose
    `max_tasks` together cover `count` (tasks submitted, permits freed), not every
    waiting claim. Each woken claim runs a transaction; waking all of them for one
    task made the rest run empty claims (measured: 16 idle sessions and single
    submits spent most of the node's claim transactions finding nothing). A
    notification that found no waiter is kept (once) for the next claim about to
    wait, whose transaction may have read before the work committed.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, deque[tuple[asyncio.Future, int]]] = {}
        self._missed: set[str] = set()
        # Queues long-polled by some claim on this node: only their missed notifications are
        # kept, so that submits to queues no worker here polls leave nothing behind.
        self._polled: set[str] = set()

    def notify(self, queue_id: str, count: int | None = None) -> None:
        """`count` tasks or permits may be claimable in `queue_id` (None: unknown, wake every claim)."""
        waiters = self._waiters.get(queue_id)
        woken = 0
        covered = 0
        while waiters and (count is None or covered < count):
            fut, want = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                woken += 1
                covered += want
        if not waiters:
            self._waiters.pop(queue_id, None)
        if not woken and queue_id in self._polled:
            self._missed.add(queue_id)

    def watch(self, queue_id: str) -> None:
        """A claim on `queue_id` is about to read: from now on, a notification nobody hears is kept."""
        self._polled.add(queue_id)

    async def wait(self, queue_id: str, timeout: float, want: int = 1) -> None:
        """Until a notification for `queue_id` names this claim, or `timeout` seconds."""
        self._polled.add(queue_id)
        if queue_id in self._missed:
            self._missed.discard(queue_id)
            return
        fut = asyncio.get_running_loop().create_future()
        entry = (fut, want)
        self._waiters.setdefault(queue_id, deque()).append(entry)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(fut, timeout)
        finally:
            waiters = self._waiters.get(queue_id)
            if waiters is not None:  # timed out or cancelled: still listed (a woken entry is not)
                with contextlib.suppress(ValueError):
                    waiters.remove(entry)
                if not waiters:
                    del self._waiters[queue_id]

    def queues(self) -> list[str]:
        return list(self._waiters)


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
        self._loops = BackgroundLoops()
        self.starts = GroupCommitter("start", lambda cmds: dispatch.start(db, cmds))
        self.renews = GroupCommitter("renew", lambda cmds: dispatch.renew(db, cmds))
        self.completes = GroupCommitter("complete", lambda cmds: dispatch.complete(db, cmds))
        # A claim transaction reads (and may lease) up to the sum of its claims' max_tasks rows,
        # payloads included: bound it, so that many waiting sessions never make one huge read.
        self.claims: KeyedBatcher[dispatch.ClaimCommand, dict[str, Any]] = KeyedBatcher(
            "claim", lambda cmds: dispatch.claim_many(db, cmds), weight=lambda c: c.max_tasks, max_weight=400)

    def start(self) -> None:
        for gc in (self.starts, self.renews, self.completes):
            gc.start()
        self._loops.every(PUSH_INTERVAL, "worker_push", self._push_once, wake=self._push_wake)
        self._loops.every(REVOCATION_INTERVAL, "worker_revocation", self._close_revoked_sessions)

    async def stop(self) -> None:
        await self._loops.stop()
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
        for q in self.notifier.queues():
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

    async def _push_once(self) -> None:
        # Runs four times a second on every node, nearly always finding nothing: one raw read.
        rows = await self.db.fast_read(lambda tx: tx.raw_rows(
            "SELECT l.id, l.session_id, l.state, l.outcome, l.task_id, t.cancel_requested, t.cancel_reason "
            "FROM leases l JOIN tasks t ON t.id = l.task_id WHERE l.server_node_id = ? AND l.push_pending = 1 "
            "LIMIT 500", (self.instance_id,)))
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

    async def _close_revoked_sessions(self) -> None:
        """Close sessions of revoked credentials within a few seconds."""
        creds = {s.identity.principal.credential_id for s in self.sessions.values() if s.identity}
        if not creds:
            return

        async def read(tx: Tx):
            return await tx.all(
                select(credentials.c.id).where(credentials.c.id.in_(creds), credentials.c.revoked_at.is_not(None))
            )

        revoked = {r["id"] for r in await self.db.read(read)}
        for s in list(self.sessions.values()):
            if s.identity and s.identity.principal.credential_id in revoked:
                await s.close(4401, "credential revoked")
