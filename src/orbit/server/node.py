"""What one server process shares between its requests and worker sessions.

A typed registry instead of attributes scattered on the ASGI app's state: the app
puts one `Node` there (`app.state.node`), and routes and sessions take what they
need from it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .batching import KeyedBatcher
from .config import Settings
from .overload import WAIT_BUDGET_S, Slots
from .services import tasks as task_service
from .services.auth import Principal
from .services.idempotency import IdempotencyScope, Outcome
from .services.dispatch import Handoff, Unparker
from .services.metrics import Load, NodeMetrics
from .services.events import Sequencer
from .services.auth import TokenCache
from .store import migrate
from .store.db import Database
from .wakeups import Waiter, Wakeups
from .ws.hub import WorkerHub

R = TypeVar("R")

SCHEMA_CHECK_SECONDS = 5.0
WAITING_PER_SLOT = 4


@dataclass
class Node:
    settings: Settings
    db: Database
    wakeups: Wakeups
    hub: WorkerHub
    tokens: TokenCache = field(default_factory=TokenCache)
    submits: KeyedBatcher = field(init=False)
    unparker: Unparker = field(init=False)
    metrics: NodeMetrics = field(init=False)
    sequencer: Sequencer = field(init=False)
    admission: Slots = field(init=False)
    batch_submits: Slots = field(init=False)
    draining: bool = False
    schema_head: str = field(default_factory=migrate.head_revision)
    _schema_checked_at: float = 0.0
    _schema_ok: bool = False

    def __post_init__(self) -> None:
        db = self.db
        # HTTP requests in progress are bounded: beyond the limit and a short wait, 503 UNAVAILABLE.
        limit = self.settings.requests_in_progress_limit()
        # Requests beyond it wait (at most `admission_wait_ms`), up to WAITING_PER_SLOT per slot: a
        # client that resends at once whatever it hears is slowed down by the wait, not served refusals
        # as fast as it can send (they would take the CPU the admitted requests need).
        self.admission = Slots(limit, self.settings.admission_wait_ms / 1000, max_waiting=limit * WAITING_PER_SLOT)
        # Of those, batch submits (up to 500 tasks each): a few at once, the others wait their turn
        # within their request's budget. More at once only lengthens each one's transaction.
        self.batch_submits = Slots(self.settings.batch_submits_limit(), WAIT_BUDGET_S, max_waiting=limit)
        # Single submits of one queue that arrive together share a transaction.
        self.submits = KeyedBatcher("submit", self._submit_group, max_batch=100)
        # Tasks parked on a resource key come back as soon as a transaction here frees a permit of it.
        self.unparker = Unparker(db)
        db.on_keys_freed = self.unparker.freed
        # A report that gave permits back wakes as many claims of its queue as tasks may take them.
        db.on_claimable = self._claimable
        self.metrics = NodeMetrics(db, lambda: len(self.hub.sessions), self.settings.metrics_ttl_seconds, self.load)
        # Events this node's transactions wrote are numbered right after they commit.
        self.sequencer = Sequencer(db)
        db.on_events_written = self.sequencer.written

    async def _submit_group(self, group: list[task_service.QueuedSubmit]) -> list[task_service.Admission]:
        """A group's transaction, which also serves the claims of its queue waiting here (their
        tasks are leased as they commit); then any other waiting claim is woken, before a
        submitter hears its answer. Only when the queue's submits are sparse: a lone submit,
        none queued behind it, the queue's previous submit here `HANDOFF_GAP_S` before or more.
        A claim woken then would take that one task anyway, so one transaction does the work of
        two; when submits come closer, a claim woken a moment later takes several tasks at once."""
        queue_id = group[0].queue_id
        claims = self.wakeups.claims
        sparse = claims.sparse(queue_id, time.monotonic())
        lone = len(group) == 1 and not self.submits.waiting(group[0].group)
        taken = claims.take(queue_id, 1) if sparse and lone else []
        return await self._serving(queue_id, taken, lambda handoff: task_service.submit_group(self.db, group, handoff),
                                   lambda admissions: sum(1 for a in admissions if a.new))

    async def submit_batch(self, principal: Principal, queue_id: str, scope: IdempotencyScope,
                           commands: list[task_service.SubmitCommand], *, verified: bool = True) -> Outcome:
        """A batch's transaction, which also serves the claims of its queue waiting here, up to
        the batch's size (their tasks are leased as they commit); then as many other waiting
        claims are woken as tasks are left. A batch is many tasks at once, so a claim it serves
        takes several in one transaction, as a claim woken after it would."""
        taken = self.wakeups.claims.take(queue_id, len(commands))
        return await self._serving(
            queue_id, taken,
            lambda handoff: task_service.submit_batch(self.db, principal, queue_id, scope, commands, handoff,
                                                      verified=verified),
            task_service.new_tasks)

    async def _serving(self, queue_id: str, taken: list[Waiter],
                       write: Callable[[Handoff], Awaitable[tuple[R, list[Any] | None]]],
                       created: Callable[[R], int]) -> R:
        """Run a submit's transaction `write` with the commands of the waiting claims `taken` for it;
        answer those claims with its replies (or let them claim again when it served none or
        failed), then wake as many other waiting claims as it `created` tasks that no served claim
        took. Replies sent as the COMMIT goes out (`Handoff`) hold their leases' commands here
        until the transaction ends."""
        claims = self.wakeups.claims
        ends: list[Callable[[], None]] = []

        def answer(served: list[Any]) -> None:
            leases = [g["lease_id"] for r in served if isinstance(r, dict) for g in r["tasks"]]
            ends.append(self.hub.hold_until_committed(leases))
            claims.serve(taken, served)

        try:
            result, served = await write(Handoff([w.offer for w in taken], answer))
        except BaseException:
            claims.serve(taken, None)  # those answered already keep their reply
            raise
        finally:
            for end in ends:
                end()
        claims.serve(taken, served)
        new = created(result)
        if served is not None:
            new -= sum(len(r["tasks"]) for r in served if isinstance(r, dict))
        if new > 0:
            claims.notify(queue_id, new)
        return result

    def _claimable(self, claimable: dict[str, int]) -> None:
        for queue_id, n in claimable.items():
            self.wakeups.claims.notify(queue_id, n)

    def load(self) -> Load:
        """What /metrics reports of this node's admission and of what it shed."""
        a = self.admission
        shed = {"admission": a.refused, "batch_submit": self.batch_submits.refused, "connection": self.db.overloaded}
        for batcher in (self.submits, self.hub.claims, self.hub.starts, self.hub.renews, self.hub.completes):
            shed[batcher.name] = batcher.shed
        return Load(a.taken, a.waiting, a.limit, shed)

    async def unpark(self) -> None:
        for queue_id, n in (await self.unparker.run_once()).items():
            self.wakeups.claims.notify(queue_id, n)

    @classmethod
    def create(cls, settings: Settings, db: Database) -> Node:
        poll_interval = settings.claim_poll_seconds()
        wakeups = Wakeups(poll_interval)
        return cls(settings, db, wakeups, WorkerHub(db, settings.node_id, wakeups, poll_interval))

    async def schema_is_current(self) -> bool:
        """Checked at most every few seconds: readiness probes must stay cheap."""
        if self._schema_ok and time.monotonic() - self._schema_checked_at < SCHEMA_CHECK_SECONDS:
            return True
        try:
            ok = await migrate.current_revision_on(self.db) == self.schema_head
        except Exception:
            ok = False
        self._schema_checked_at, self._schema_ok = time.monotonic(), ok
        return ok
