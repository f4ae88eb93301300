"""Node-wide worker machinery: session registry, wake-ups, group commit, pushes, drain.

Nodes never talk to each other: work committed on another node is found by
polling (every `poll_interval` one read for all the claims waiting here), and pushes
for leases held by this node's sessions are found in the `leases.push_pending` index.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from ..batching import GroupCommitter, KeyedBatcher
from ..core.ids import new_id
from ..loops import BackgroundLoops
from ..services import dispatch, workers
from ..wakeups import Wakeups

if TYPE_CHECKING:
    from ..store.db import Database
    from .session import WorkerSession

log = structlog.get_logger("orbit.ws")

# Queues one poll of the waiting claims reads at most per statement.
POLL_QUEUES = 200
PUSH_INTERVAL = 0.25
REVOCATION_INTERVAL = 2.0
# The drain pushed when the node loses its database: workers go on through another node.
OUTAGE_DRAIN = {"type": "drain", "deadline_ms": 10_000, "reason": "database_unavailable"}


class WorkerHub:
    """Everything the worker sessions of one server process share."""

    def __init__(self, db: Database, node_id: str, wakeups: Wakeups, poll_interval: float) -> None:
        self.db = db
        self.poll_interval = poll_interval
        self.node_id = node_id
        # Unique per process so that pushes are routed to this process even if node ids repeat.
        self.instance_id = f"{node_id[:40]}:{new_id()[:12]}"
        self.sessions: dict[str, WorkerSession] = {}
        # Leases answered to a claim while their transaction commits: their commands wait for it.
        self._committing: dict[str, asyncio.Future[None]] = {}
        self.notifier = wakeups.claims
        self._poll_began = float("-inf")  # when the latest poll began (monotonic)
        self.draining = False
        self.drain_deadline_ms = 0
        self._push_wake = wakeups.pushes
        self._loops = BackgroundLoops(gate=db.health)
        self._outage_push: asyncio.Task | None = None
        # A Start is on its task's way to its handler: it does not linger for a fuller group
        # under load (a report, off that way, does).
        self.starts = GroupCommitter("start", lambda cmds: dispatch.start(db, cmds), linger=0.0)
        self.renews = GroupCommitter("renew", lambda cmds: dispatch.renew(db, cmds))
        self.completes = GroupCommitter("complete", lambda cmds: dispatch.complete(db, cmds))
        # A claim transaction reads (and may lease) up to the sum of its claims' max_tasks rows,
        # payloads included: bound it, so that many waiting sessions never make one huge read.
        self.claims: KeyedBatcher[dispatch.ClaimCommand, dict[str, Any]] = KeyedBatcher(
            "claim", lambda cmds: dispatch.claim_many(db, cmds), weight=lambda c: c.max_tasks, max_weight=400)

    def start(self) -> None:
        for gc in (self.starts, self.renews, self.completes):
            gc.start()
        self._loops.every(self.poll_interval, "claim_poll", self._poll_waiting_claims)
        self._loops.every(PUSH_INTERVAL, "worker_push", self._push_once, wake=self._push_wake)
        self._loops.every(REVOCATION_INTERVAL, "worker_revocation", self._close_revoked_sessions)
        self.db.health.subscribe(self._database_changed)

    async def stop(self) -> None:
        self.db.health.unsubscribe(self._database_changed)
        await self._loops.stop()
        for gc in (self.starts, self.renews, self.completes):
            await gc.stop()
        await self.claims.stop()

    def hold_until_committed(self, lease_ids: list[str]) -> Callable[[], None]:
        """The commands of these leases, answered before their transaction is known to commit,
        wait here until it ends (the call returned); then a lease that did not commit is
        unknown to them as to any node."""
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for lease_id in lease_ids:
            self._committing[lease_id] = ended

        def end() -> None:
            for lease_id in lease_ids:
                if self._committing.get(lease_id) is ended:
                    del self._committing[lease_id]
            if not ended.done():
                ended.set_result(None)

        return end

    def committing(self, lease_id: Any) -> asyncio.Future[None] | None:
        """What a command of this lease waits for first, if its transaction is still committing."""
        return self._committing.get(lease_id) if type(lease_id) is str else None

    def register(self, session: WorkerSession) -> None:
        self.sessions[session.session_id] = session

    def unregister(self, session: WorkerSession) -> None:
        self.sessions.pop(session.session_id, None)

    async def begin_drain(self, deadline_ms: int) -> None:
        """Stop granting claims and tell every session to finish and reconnect elsewhere."""
        self.draining = True
        self.drain_deadline_ms = deadline_ms
        for s in list(self.sessions.values()):
            if s.identity is not None:  # a session told at its hello otherwise
                await s.push({"type": "drain", "deadline_ms": deadline_ms})
        for q in self.notifier.queues():
            self.notifier.notify(q)

    def _database_changed(self, available: bool) -> None:
        """The database is unreachable: every session hears `drain` (with its reason), so that its
        worker reconnects, which a balancer sends to a node that is ready; meanwhile commands
        here are answered UNAVAILABLE. Sessions are accepted again once the database is back."""
        if available:
            return
        sessions = [s for s in self.sessions.values() if s.identity is not None]
        if sessions:
            log.warning("workers_told_to_reconnect", sessions=len(sessions), reason=OUTAGE_DRAIN["reason"])
            self._outage_push = asyncio.get_running_loop().create_task(self._push_all(sessions, OUTAGE_DRAIN))

    @staticmethod
    async def _push_all(sessions: list[WorkerSession], message: dict[str, Any]) -> None:
        for s in sessions:
            await s.push(message)

    async def leases_held(self) -> int:
        """Current leases held through this process's sessions (drain waits for zero)."""
        if not self.sessions:
            return 0
        return await workers.leases_held(self.db, self.instance_id)

    async def _poll_waiting_claims(self) -> None:
        """Wake the claims waiting here that would now find work committed through another node
        (or freed permits, a resumed queue), as many as the tasks found cover; remember the
        queues where none could lease, so that the next claims there wait without a transaction."""
        waiting = {
            qid: dispatch.WaitingClaims(sum(w.want for w in ws),
                                        frozenset(w.offer.who.worker_node_id for w in ws if w.offer is not None))
            for qid, ws in self.notifier.waiting().items()
        }
        queue_ids = sorted(waiting)
        began, previous = time.monotonic(), self._poll_began
        self._poll_began = began
        for i in range(0, len(queue_ids), POLL_QUEUES):
            part = {qid: waiting[qid] for qid in queue_ids[i:i + POLL_QUEUES]}
            read_at = time.monotonic()
            found = await dispatch.poll_waiting(self.db, part)
            for qid, count in found.wake.items():
                # Where this node's own commits woke claims since the last poll, the due tasks it
                # found are theirs: waking more would split them into more, smaller claims.
                if count is None or not self.notifier.notified_since(qid, previous):
                    self.notifier.notify(qid, count, polled=True)
            for qid, namespace_id in found.idle.items():
                self.notifier.found_idle(qid, namespace_id, read_at)
        self.notifier.forget_before(began - self.notifier.idle_for_s)

    async def _push_once(self) -> None:
        pushes = await workers.pending_pushes(self.db, self.instance_id)
        if not pushes:
            return
        for p in pushes:
            session = self.sessions.get(p.session_id)
            if session is None:
                continue
            if p.kind == "lease_revoked":
                await session.push({"type": "lease_revoked", "lease_id": p.lease_id, "reason": p.reason})
            elif p.kind == "cancel_requested":
                await session.push({"type": "cancel_requested", "lease_id": p.lease_id, "task_id": p.task_id,
                                    "reason": p.reason})
        await workers.clear_pushes(self.db, [p.lease_id for p in pushes])

    async def _close_revoked_sessions(self) -> None:
        """Close sessions of revoked credentials within a few seconds, hello sent or not."""
        creds = {s.principal.credential_id for s in self.sessions.values()}
        if not creds:
            return
        revoked = await workers.revoked_credentials(self.db, creds)
        for s in list(self.sessions.values()):
            if s.principal.credential_id in revoked:
                await s.close(4401, "credential revoked")
