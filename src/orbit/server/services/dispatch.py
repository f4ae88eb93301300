"""The execution half: claim, Start authorization, renew, complete, release, lease recovery.

Every operation takes a *list* of commands and runs them in one transaction so
that a node can group-commit whatever commands arrived together. Locks are taken
in one order everywhere: task rows (sorted), then lease rows, then usage rows
(sorted, queues before applications). A claim holds its queue's usage row
first and only skip-locks task rows, so it never waits behind that order.

Each command's result is a dict of its answer's fields, or an `DomainError`; the
rules are in `core/lease.py` and `core/limits.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson

from ..core import lease as rules
from ..core import states
from ..core.ids import new_id
from ..core.lease import DEFAULT_LEASE_MS, ENDED, HEARTBEAT_MS, LEASED, MAX_LEASE_MS, RUNNING
from ..core import dispatch_order as fair
from ..core.dispatch_order import KeyRoom, choose, in_dispatch_order
from ..core.limits import QueueLimits, count_starts, grant_size, grant_still_fits, may_lease
from ..core.rate_window import RateWindow, authorize_start
from ..core.timefmt import format_ts
from ..errors import DomainError
from ..store.db import Database
from ..store.dialect import PlanNoLongerHolds
from ..store.queries import claims as claim_q
from ..store.queries import key_permits as key_q
from ..store.queries import leases as lease_q
from ..store.queries import queues as queue_q
from ..store.queries import tasks as task_q
from ..store.queries import usage as usage_q
from ..store.queries.bulk import update_many
from ..store.queries.tasks import ALL_LEVELS
from ..store.queries.usage import APPLICATION, QUEUE, UsageChanges
from ..store.tx import ReadAhead, Stmt, Tx
from . import metrics
from .auth import Principal
from .outbox import Event, emit_many

__all__ = ["DEFAULT_LEASE_MS", "MAX_LEASE_MS", "HEARTBEAT_MS", "LEASED", "RUNNING", "ENDED"]

Result = dict[str, Any] | DomainError


@dataclass(frozen=True)
class WorkerIdentity:
    """Who sends worker commands: the credential, its session and the nodes involved."""

    principal: Principal
    session_id: str
    worker_node_id: str
    server_node_id: str


def _refused(r: rules.Refusal) -> DomainError:
    return DomainError(r.code, r.message, retry_after_ms=r.retry_after_ms)


def _no_such_lease() -> DomainError:
    return DomainError("NOT_FOUND", "no such lease for this credential")


def _j(text: str | None) -> Any:
    return None if text is None else orjson.Fragment(text)


def _task_event(task: Any, type_: str, state: str, **extra: Any) -> Event:
    return (task["namespace_id"], type_, "task", task["id"],
            {"task_id": task["id"], "queue_id": task["queue_id"], "state": state, **extra})


def lease_json(lease: dict[str, Any], task: Any, payload: Any) -> dict[str, Any]:
    return {
        "lease_id": lease["id"],
        "task_id": task["id"],
        "queue_id": task["queue_id"],
        "attempt": int(lease["attempt"]),
        "payload": payload,
        "priority": int(task["priority"]),
        "lease_expires_at": format_ts(lease["expires_at"]),
        "start_deadline_at": format_ts(task["start_deadline_at"]),
        "deadline_at": format_ts(task["deadline_at"]),
        "resource_keys": _j(task["resource_keys"]),
        "traceparent": task["traceparent"],
    }


def _paused(q: dict[str, Any]) -> bool:
    """Claims and Starts stop while the queue or its application is paused."""
    return bool(q["paused"]) or bool(q["application_paused"])


def _limits(q: dict[str, Any], usage: dict[str, Any]) -> QueueLimits:
    return QueueLimits(_paused(q), int(q["max_concurrency"]), int(q["rate_per_second"]),
                       int(usage["permits_in_use"]), usage_q.window_of(usage))


# ------------------------------------------------------------------ claim


@dataclass(frozen=True)
class ClaimCommand:
    who: WorkerIdentity
    queue_id: str
    max_tasks: int
    lease_ms: int
    msg_id: str


class Handoff:
    """The claims waiting on this node that a submit's transaction serves.

    Where writes wait for the COMMIT, their replies go out once every write has been made and
    every guard has held, as the COMMIT goes out (`answer`), so that the worker's turn-around
    overlaps the commit's flush: the caller holds back the leases' own commands on this node
    until the transaction ends, and a lease whose COMMIT failed after all (a lost connection)
    is then unknown to its Start, which never runs a handler. Once answered, a rerun of the
    transaction serves them no more: their replies are out."""

    def __init__(self, offers: Sequence[ClaimCommand], answer: Callable[[list[Any]], None] | None = None) -> None:
        self._offers = list(offers)
        self._answer = answer
        self.answered = False

    def offers(self) -> list[ClaimCommand]:
        """The claims this run of the transaction may serve."""
        return [] if self.answered else self._offers

    def answer_as_commit_goes(self, tx: Tx, served: list[Any] | None) -> None:
        if served is None or self._answer is None or not tx.deferring:
            return
        answer = self._answer
        # The new task and lease rows go first in the writes, the usage rows' UPDATEs (deferred
        # since the backlog slots were taken) last: those hot rows are held the shortest.
        tx.lead_commit(task_q.NEW_ROWS, lease_q.NEW_ROWS)

        def send() -> None:
            self.answered = True
            answer(served)

        tx.as_commit_goes(send)


async def claim(
    db: Database, who: WorkerIdentity, queue_id: str, *, max_tasks: int, lease_ms: int, msg_id: str
) -> Result:
    """Lease up to `max_tasks` due tasks in dispatch order within every layer's room."""
    (reply,) = await claim_many(db, [ClaimCommand(who, queue_id, max_tasks, lease_ms, msg_id)])
    return reply


async def claim_many(db: Database, commands: list[ClaimCommand]) -> list[Result]:
    """Claims that arrived together on a node, of one queue or several, in one transaction.

    A node gathers the claims its sessions sent meanwhile (per application: their
    queues meet on the application's usage row) and serves them together: per
    queue one grant, one candidate read and one round of writes, shared in arrival
    order; every queue's reads travel in the same round trips. Like a Start, a
    claim locks the usage rows *last*: the grants are planned on unlocked reads,
    the chosen tasks are locked with SKIP LOCKED (so claims on several nodes never
    take the same task nor wait on each other) and written, and only then are the
    usage rows locked — queues, applications, resource keys, each in id order — and
    every grant re-checked. If one no longer fits, everything is rolled back and the
    claims run again with each usage row locked first. If a permit was given back at
    a later database time than the plan's clock, the leases are re-timed to just
    after it (`permits_freed_at`), so stored lease intervals never overlap beyond a limit.

    A candidate whose resource key has no free permit is parked on it (taken out of
    the claimable part of the dispatch index) and the candidates behind it are
    served; a claim reads further, a bounded number of rows, only while it parks.

    A claim resent while it waits for its transaction (the same credential and message id)
    is served once and both get its answer, as a replay would.
    """
    return await db.lock_last(lambda tx, optimistic: claim_within(tx, commands, optimistic=optimistic))


class ClaimReads:
    """A group of claims and its first round trip's reads, built before they run: a submit that
    serves the claims sends those reads with its own (`read_claims_ahead`)."""

    def __init__(self, commands: list[ClaimCommand], *, optimistic: bool) -> None:
        self.commands: list[ClaimCommand] = []  # one per (credential, message id): a resent claim is served once
        slot: dict[tuple[str, str], int] = {}
        self.served: list[int] = []  # per command given, its reply's index
        for c in commands:
            key = (c.who.principal.credential_id, c.msg_id)
            if key not in slot:
                slot[key] = len(self.commands)
                self.commands.append(c)
            self.served.append(slot[key])
        self.keys = [(c.who.principal.credential_id, c.msg_id) for c in self.commands]
        self.by_queue: dict[str, list[int]] = {}
        for i, c in enumerate(self.commands):
            self.by_queue.setdefault(c.queue_id, []).append(i)
        self.queue_ids = sorted(self.by_queue)
        self.reads = [claim_q.receipts(self.keys)]
        # The levels each queue's first read covers: another claim of this node may change
        # `_levels_seen` before this one reads the levels it missed.
        self.read_levels = {qid: _levels_seen.get(qid, ALL_LEVELS) for qid in self.queue_ids}
        # What each queue's first read asks for per level: its rows are judged against the same.
        self.wanted = {qid: _wanted(self.commands, self.by_queue[qid]) for qid in self.queue_ids}
        self.optimistic = optimistic
        if not optimistic:
            self.reads.append(queue_q.controls(self.queue_ids))
        else:
            # Plan on unlocked usage reads, and lock (SKIP LOCKED) as many due tasks per queue as
            # its claims could take in the same round trip; the grants then decide how many are used.
            self.reads += [usage_q.with_controls(self.queue_ids, clock=True), key_q.nodes(self.queue_ids)]
            self.reads += [task_q.claimable(qid, self.wanted[qid], levels=self.read_levels[qid], skip_locked=True,
                                            candidates=True)
                           for qid in self.queue_ids]
        self.ahead: ReadAhead | None = None


def read_claims_ahead(tx: Tx, commands: list[ClaimCommand]) -> ClaimReads:
    """Queue the first reads of optimistic claims to travel with `tx`'s next round trip; serve
    them later with `claim_within(..., reads=...)`. Tasks that the transaction writes after that
    round trip are not in those reads: pass them as `arrived`."""
    reads = ClaimReads(commands, optimistic=True)
    reads.ahead = tx.read_ahead(reads.reads)
    return reads


async def claim_within(tx: Tx, commands: list[ClaimCommand], *, optimistic: bool, reads: ClaimReads | None = None,
                       arrived: Sequence[dict[str, Any]] = (),
                       unwritten: dict[str, dict[str, Any]] | None = None) -> list[Result]:
    """`claim_many`'s work in the caller's transaction (a submit's serves the claims waiting for
    its tasks; see `tasks.submit_group`): the same locks, in the same order, after the caller's.
    `reads`: the claims' first reads, queued earlier (`read_claims_ahead`), used when the plan is
    still optimistic; `arrived`: rows (`task_q.claim_row`) of due tasks written after those reads;
    `unwritten`: by id, stored rows of arrived tasks that the caller writes only after this (an
    optimistic plan leases them by changing those rows, not with an UPDATE)."""
    if reads is None or reads.optimistic != optimistic:
        reads = ClaimReads(commands, optimistic=optimistic)
    replies = await _claim_body(tx, reads, arrived, unwritten or {})
    return [replies[i] for i in reads.served]


async def _claim_body(tx: Tx, r: ClaimReads, arrived: Sequence[dict[str, Any]],
                      unwritten: dict[str, dict[str, Any]]) -> list[Result]:
    commands, keys, by_queue, queue_ids, read_levels = r.commands, r.keys, r.by_queue, r.queue_ids, r.read_levels
    wanted = r.wanted
    optimistic = r.optimistic
    replies: list[Result | None] = [None] * len(commands)
    prior, *rest = await (tx.rows_ahead(r.ahead) if r.ahead is not None else tx.rows_multi(r.reads))
    if optimistic:
        usage_rows, app_rows, control_rows = usage_q.split_with_controls(rest[0])
        node_rows, *pick_rows = rest[1:]
    else:
        (control_rows,) = rest
    notes: list[Stmt] = []
    controls = {r["id"]: r for r in control_rows}
    stored = {(r["credential_id"], r["msg_id"]): r["response"] for r in prior}
    for i, k in enumerate(keys):
        if k in stored:
            replies[i] = {"tasks": await _replay_claim(tx, stored[k])}
    live: dict[str, list[int]] = {}
    for qid in queue_ids:
        q = controls.get(qid)
        for i in by_queue[qid]:
            c = commands[i]
            if replies[i] is not None:
                continue
            if q is None or q["namespace_id"] != c.who.principal.namespace_id:
                replies[i] = DomainError("NOT_FOUND", "queue not found")
            elif q["retired_at"] is not None:
                replies[i] = DomainError("STATE_CONFLICT", "the queue is retired")
            elif _paused(q):
                replies[i] = {"tasks": []}
            else:
                live.setdefault(qid, []).append(i)
    if live and optimistic:
        snapshots = {r["queue_id"]: r for r in usage_rows}
        app_snapshots = {r["application_id"]: r for r in app_rows}
        nodes = _nodes_by_queue(node_rows)
        picks = {qid: await _locked_picks(tx, qid, rows, wanted[qid], read_levels[qid])
                 for qid, rows in zip(queue_ids, pick_rows, strict=True) if qid in live}
        if arrived:
            read = {r["id"] for rows in picks.values() for r in rows}
            picks = {qid: list(rows) for qid, rows in picks.items()}
            for row in arrived:  # read already where the reads ran after the writes (SQLite)
                if row["queue_id"] in picks and row["id"] not in read:
                    picks[row["queue_id"]].append(row)
        tx.adopt_clock(snapshots[next(iter(live))])
        now = await tx.now()
        for qid in live:
            # Levels this node did not know the queue has: read them too (rare: a new priority).
            levels = int(snapshots[qid]["priority_levels"])
            missing = levels & ~read_levels[qid]
            _levels_seen[qid] = _levels_seen.get(qid, 0) | levels
            if missing:
                picks[qid] = picks[qid] + await tx.rows(task_q.claimable(
                    qid, _wanted(commands, live[qid]), levels=missing, skip_locked=True))
        room = _application_room(commands, live, controls, app_snapshots, now)
        rooms: dict[str, KeyRoom] = {}
        planned = []
        for qid, slots in live.items():
            p = await _plan_grant(tx, qid, commands, slots, replies, controls[qid], snapshots[qid],
                                  picks[qid], room, rooms, nodes.get(qid, {}), now, notes, unwritten)
            if p is not None:
                planned.append(p)
        if planned:
            await _confirm_grants(tx, planned, replies)
    elif live:
        await _grant_locked(tx, commands, live, replies, notes)
    # The nodes' rows come after every usage row (the lock order).
    for stmt in notes:
        await tx.defer(stmt)
    return [r if r is not None else {"tasks": []} for r in replies]


async def _locked_picks(tx: Tx, queue_id: str, rows: list[dict[str, Any]], wanted: int,
                        levels: int) -> list[dict[str, Any]]:
    """The candidates a claim's first read locked. Where it passed over some that another
    transaction holds (another node's claim, most often), it reads as many more candidates once;
    if a level still comes out short, the queue's ranges are scanned with locks instead."""
    locked, whole = task_q.locked_candidates(rows, wanted, wanted)
    if whole:
        return locked
    wider = wanted + len(rows) - len(locked)
    locked, whole = task_q.locked_candidates(await tx.rows(task_q.claimable(
        queue_id, wider, levels=levels, skip_locked=True, candidates=True)), wider, wanted)
    if whole:
        return locked
    return await tx.rows(task_q.claimable(queue_id, wanted, levels=levels, skip_locked=True))


# The priority levels each queue's usage row showed this process last (they only ever grow):
# a claim reads those levels' candidates in its first round trip, before it sees the row.
_levels_seen: dict[str, int] = {}


MAX_POLL_COUNT = 400  # due tasks a node's poll counts per queue and level at most (a claim group's weight)


@dataclass(frozen=True)
class WaitingClaims:
    """The claims waiting on one queue at a node: the tasks they want together, and the worker
    nodes they come from."""

    want: int
    worker_nodes: frozenset[str]


@dataclass
class PollResult:
    """Per queue polled: how many of its waiting claims to wake (None: every one, e.g. the queue
    was retired and each must hear so), or, where no claim could lease now, its namespace."""

    wake: dict[str, int | None] = field(default_factory=dict)
    idle: dict[str, str] = field(default_factory=dict)


async def poll_waiting(db: Database, waiting: dict[str, WaitingClaims]) -> PollResult:
    """What a node's waiting claims would find, found without a claim transaction each: per queue
    where a claim could lease now, how many due tasks (up to what its claims want); the other
    queues are idle.

    Work committed through another node reaches a waiting claim only this way. A queue nobody
    could lease from (empty, paused, at its limits) costs one read of its usage row, however many
    claims wait on it. Their worker nodes stay seen as waiting by the other nodes' claims (node
    fairness), as a claim that polls would keep them: their rows on the queue are rewritten when due.
    """
    queue_ids = sorted(waiting)

    async def read(tx: Tx) -> tuple[list[list[dict[str, Any]]], datetime]:
        rows = await tx.rows_multi([queue_q.controls(queue_ids), usage_q.queue_rows(queue_ids, clock=True),
                                    key_q.nodes(queue_ids)])
        tx.adopt_clock(rows[1][0] if rows[1] else None)
        return rows, await tx.now()

    (control_rows, usage_rows, node_rows), now = await db.read(read)
    controls = {r["id"]: r for r in control_rows}
    usage = {r["queue_id"]: r for r in usage_rows}
    nodes = _nodes_by_queue(node_rows)
    result = PollResult()
    wake = result.wake
    dives: list[tuple[str, int]] = []
    notes: list[Stmt] = []
    for qid in queue_ids:
        q, u = controls.get(qid), usage.get(qid)
        if q is None or u is None or q["retired_at"] is not None:
            wake[qid] = None
            continue
        result.idle[qid] = q["namespace_id"]
        for node in sorted(waiting[qid].worker_nodes):
            row = nodes.get(qid, {}).get(node) or {}
            if fair.note_due(row.get("last_claim_at"), row.get("wanting_at"), True, 0, now):
                notes.append(key_q.note_claim(qid, node, now, True, 0))
        if may_lease(_limits(q, u), int(u["unfinished"]) - int(u["permits_in_use"]), now):
            dives.append((qid, int(u["priority_levels"]) or ALL_LEVELS))
    if dives:
        limit = min(MAX_POLL_COUNT, max(waiting[qid].want for qid, _ in dives))
        for r in await db.read(lambda tx: tx.rows(task_q.due(dives, limit))):
            wake[r["queue_id"]] = min(waiting[r["queue_id"]].want, (wake.get(r["queue_id"]) or 0) + 1)
            result.idle.pop(r["queue_id"], None)
    if notes:
        async def note(tx: Tx) -> None:
            for stmt in notes:
                await tx.defer(stmt)
        await db.transaction(note)
    return result


async def claim_answered(db: Database, who: WorkerIdentity, msg_id: str) -> bool:
    """Whether a claim with this message id was already answered (a resent claim replays it)."""
    return bool(await db.read(lambda tx: tx.rows(claim_q.receipts([(who.principal.credential_id, msg_id)]))))


def _wanted(commands: list[ClaimCommand], slots: list[int]) -> int:
    return sum(commands[i].max_tasks for i in slots)


def _application_limits(q: dict[str, Any], usage: dict[str, Any]) -> QueueLimits:
    """The application layer's limits, read with a queue of the application."""
    return QueueLimits(bool(q["application_paused"]), int(q["application_max_concurrency"]),
                       int(q["application_rate_per_second"]), int(usage["permits_in_use"]),
                       usage_q.window_of(usage))


def _application_room(commands: list[ClaimCommand], live: dict[str, list[int]], controls: dict[str, Any],
                      usage: dict[str, dict[str, Any]], now: datetime) -> dict[str, int]:
    """How many leases each application can still grant: its queues' grants share it, in queue order."""
    wanted: dict[str, int] = {}
    sample: dict[str, dict[str, Any]] = {}
    for qid, slots in live.items():
        aid = controls[qid]["application_id"]
        wanted[aid] = wanted.get(aid, 0) + _wanted(commands, slots)
        sample[aid] = controls[qid]
    return {aid: grant_size(n, _application_limits(sample[aid], usage[aid]), now) for aid, n in wanted.items()}


def _nodes_by_queue(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["queue_id"], {})[r["worker_node_id"]] = r
    return out


def _fair_caps(commands: list[ClaimCommand], slots: list[int], max_concurrency: int,
               nodes: dict[str, dict[str, Any]], now: datetime) -> list[int]:
    """Each claim's most leases: its `max_tasks`, within its node's fair share of the queue while
    another active node waits (a node claiming in this same transaction waits too)."""
    claiming = {commands[i].who.worker_node_id for i in slots}
    active = claiming | {n for n, r in nodes.items() if fair.is_active(r["last_claim_at"], now)}
    waiting = claiming | {n for n, r in nodes.items() if fair.is_waiting(r["wanting_at"], now)}
    holding = {n: int(r["in_flight"]) for n, r in nodes.items()}
    caps = []
    for i in slots:
        node = commands[i].who.worker_node_id
        room = fair.fair_room(max_concurrency, len(active), holding.get(node, 0), bool(waiting - {node}))
        cap = commands[i].max_tasks if room is None else min(commands[i].max_tasks, room)
        holding[node] = holding.get(node, 0) + cap
        caps.append(cap)
    return caps


def _grant(wanted: int, q: dict[str, Any], usage: dict[str, Any], room: dict[str, int], now: datetime) -> int:
    """A queue's grant: what its own limits allow, within what is left of its application's room."""
    return min(grant_size(wanted, _limits(q, usage), now), room[q["application_id"]])


MAX_PARKING_SCAN = 2000  # candidates one claim reads per queue at most while it parks tasks


async def _key_rooms(tx: Tx, key_ids: list[str], *, lock: bool) -> dict[str, KeyRoom]:
    usage_rows, limit_rows = await tx.rows_multi([usage_q.resource_key_rows(key_ids, lock=lock),
                                                 key_q.limits(key_ids)])
    limits = {r["id"]: int(r["max_concurrency"]) for r in limit_rows}
    return {r["resource_key_id"]: KeyRoom(limits[r["resource_key_id"]], int(r["permits_in_use"]))
            for r in usage_rows}


async def _take(tx: Tx, queue_id: str, grant: int, first: list[dict[str, Any]], limit: int, now: datetime,
                rooms: dict[str, KeyRoom], parked: dict[str, int], *, levels: int,
                optimistic: bool) -> list[dict[str, Any]]:
    """Up to `grant` candidates in dispatch order whose every resource key has a free permit
    (`rooms`, updated with what is taken); candidates with a saturated key are parked on it
    (`parked` counts them per key) and the claim reads on, while it parks, up to
    `MAX_PARKING_SCAN` rows: each blocked task is read once, then no claim reads it again
    until its key gives a permit back."""
    taken: list[dict[str, Any]] = []
    # One row per task whatever read it: a task listed twice would be leased twice.
    rows = in_dispatch_order(list({r["id"]: r for r in first}.values()), now)
    exhausted = _exhausted(first, limit)
    scanned = 0
    while True:
        unknown = sorted({k for r in rows for k in task_q.resource_key_ids(r)} - rooms.keys())
        if unknown:
            # Planning: unlocked (the confirmation locks them); in the locked order: locked now.
            rooms.update(await _key_rooms(tx, unknown, lock=not optimistic))
        choice = choose([task_q.resource_key_ids(r) for r in rows], grant - len(taken), rooms)
        for i in choice.taken:
            taken.append(rows[i])
            for k in task_q.resource_key_ids(rows[i]):
                rooms[k] = rooms[k]._replace(in_use=rooms[k].in_use + 1)
        by_key: dict[str, list[str]] = {}
        for i, k in choice.parked.items():
            by_key.setdefault(k, []).append(rows[i]["id"])
        for k, ids in sorted(by_key.items()):
            parked[k] = parked.get(k, 0) + await tx.count(task_q.park(ids, k))
        scanned += len(rows)
        if not choice.parked or len(taken) >= grant or exhausted or scanned >= MAX_PARKING_SCAN:
            return taken
        limit = min(limit * 4, 256)
        seen = {t["id"] for t in taken}
        fresh = await tx.rows(task_q.claimable(queue_id, limit + len(seen), levels=levels, now=now,
                                               skip_locked=optimistic))
        exhausted = _exhausted(fresh, limit + len(seen))
        rows = in_dispatch_order([r for r in fresh if r["id"] not in seen], now)


def _exhausted(rows: list[dict[str, Any]], limit: int) -> bool:
    """Whether a level-wise read returned every claimable task (no level filled its limit)."""
    per_level: dict[int, int] = {}
    for r in rows:
        per_level[int(r["priority"])] = per_level.get(int(r["priority"]), 0) + 1
    return all(n < limit for n in per_level.values())


@dataclass
class _PlannedGrant:
    """A queue's grant planned on the unlocked snapshot, written but not yet checked under the lock."""

    queue_id: str
    application_id: str
    commands: list[ClaimCommand]
    slots: list[int]
    now: datetime
    leases: int
    changes: UsageChanges
    key_leases: dict[str, int]  # leases taken per resource key
    parked: dict[str, int]  # tasks parked per resource key


async def _plan_grant(tx: Tx, queue_id: str, commands: list[ClaimCommand], slots: list[int], replies: list[Any],
                      q: dict[str, Any], usage: dict[str, Any], picked: list[dict[str, Any]],
                      room: dict[str, int], rooms: dict[str, KeyRoom], nodes: dict[str, dict[str, Any]],
                      now: datetime, notes: list[Stmt], unwritten: dict[str, dict[str, Any]]) -> _PlannedGrant | None:
    """Lease the due tasks `picked` (locked with SKIP LOCKED) to the claims within the room an
    unlocked usage read shows in the queue, what is left of its application's `room`, the keys'
    `rooms` and each node's fair share; the writes wait to travel with the round trip that
    locks the usage rows."""
    aid = q["application_id"]
    mine = [commands[i] for i in slots]
    caps = _fair_caps(commands, slots, int(q["max_concurrency"]), nodes, now)
    grant = _grant(sum(caps), q, usage, room, now)
    parked: dict[str, int] = {}
    candidates = await _take(tx, queue_id, grant, picked, _wanted(commands, slots), now, rooms, parked,
                             levels=int(usage["priority_levels"]), optimistic=True) if grant > 0 else []
    notes += _note_claims(queue_id, mine, caps, candidates, nodes, now)
    if not candidates and not parked:
        return None
    room[aid] -= len(candidates)
    changes = UsageChanges()
    if candidates:
        written = [t["id"] for t in candidates if not task_q.lease_unwritten(unwritten.get(t["id"]), now)]
        if written:
            await tx.defer(task_q.mark_leased(written, now))
        changes = await _write_leases(tx, queue_id, mine, caps, slots, replies, candidates, now,
                                      defer_receipts=True)
    key_leases: dict[str, int] = {}
    for t in candidates:
        for k in task_q.resource_key_ids(t):
            key_leases[k] = key_leases.get(k, 0) + 1
    return _PlannedGrant(queue_id, aid, mine, slots, now, len(candidates), changes, key_leases, parked)


def _note_claims(queue_id: str, commands: list[ClaimCommand], caps: list[int], candidates: list[dict[str, Any]],
                 nodes: dict[str, dict[str, Any]], now: datetime) -> list[Stmt]:
    """Record each claiming node's activity on the queue, whether it still wants more, and the
    permits it now holds; an idle poll rewrites its row only when that changes what others see."""
    granted: dict[str, int] = {}
    wanting: dict[str, bool] = {}
    pos = 0
    for c, cap in zip(commands, caps, strict=True):
        n = len(candidates[pos: pos + cap])
        pos += cap
        node = c.who.worker_node_id
        granted[node] = granted.get(node, 0) + n
        wanting[node] = wanting.get(node, False) or n < c.max_tasks
    out = []
    for node in sorted(granted):
        row = nodes.get(node) or {}
        if fair.note_due(row.get("last_claim_at"), row.get("wanting_at"), wanting[node], granted[node], now):
            out.append(key_q.note_claim(queue_id, node, now, wanting[node], granted[node]))
    return out


async def _confirm_grants(tx: Tx, planned: list[_PlannedGrant], replies: list[Any]) -> None:
    """Lock the planned queues' usage rows (queue order), then their applications', then their
    resource keys', and check each grant there; `PlanNoLongerHolds` if one no longer fits.

    Where writes wait for the COMMIT, the guarded UPDATEs that take the permits check the grants
    themselves in the COMMIT's round trip (the usage rows are locked for no round trip at all),
    and a permit given back at or after the plan's clock re-times the leases there too. Elsewhere
    the rows are read under the lock and checked here."""
    ids = sorted(p.queue_id for p in planned)
    app_ids = sorted({p.application_id for p in planned})
    key_ids = sorted({k for p in planned for k in (*p.key_leases, *p.parked)})
    changes = UsageChanges()
    for p in planned:
        changes.merge(p.changes)
    now = planned[0].now
    if changes.grant_permits_in_sql(tx, now):
        # Parking is a hint: whether a permit came back since the plan read a key is not known
        # until the COMMIT, so the unparker is asked to look (a read, when nothing is free).
        tx.keys_freed.update(k for p in planned for k in p.parked)
        await changes.apply(tx)
        lease_ids = [g["lease_id"] for p in planned for slot in p.slots for g in _granted(replies[slot])]
        taken_keys = sorted({k for p in planned for k in p.key_leases})
        stmts = [usage_q.note_freed(ids, app_ids, taken_keys)]
        if lease_ids:
            stmts.append(lease_q.retime_after_freed(lease_ids, now))

        def retimed(rows: list[list[dict[str, Any]]]) -> None:
            freed = rows[0][0]["freed"]
            if freed is not None and freed >= now:
                after = freed + timedelta(microseconds=1)
                for p in planned:
                    _retime_replies(p.commands, p.slots, replies, after)

        tx.at_commit(stmts, retimed)
        return
    reads = [usage_q.queue_rows(ids, lock=True), usage_q.application_rows(app_ids, lock=True), queue_q.controls(ids)]
    if key_ids:
        reads += [usage_q.resource_key_rows(key_ids, lock=True), key_q.limits(key_ids)]
    usage_rows, app_rows, control_rows, *key_reads = await tx.rows_multi(reads)
    usage_of = {r["queue_id"]: r for r in usage_rows}
    app_usage_of = {r["application_id"]: r for r in app_rows}
    controls_of = {r["id"]: r for r in control_rows}
    key_rows = key_reads[0] if key_ids else []
    # A permit these claims may reuse was given back at a later database time than the plan's
    # clock: lease from just after it, so no stored interval overlaps another beyond a limit.
    freed = [r["permits_freed_at"] for r in (*usage_rows, *app_rows, *key_rows) if r["permits_freed_at"] is not None]
    if freed and max(freed) >= now:
        now = max(freed) + timedelta(microseconds=1)
        for p in planned:
            await _retime(tx, p.commands, p.slots, replies, now)
    per_app: dict[str, tuple[int, dict[str, Any]]] = {}  # leases granted, and a queue row with the controls
    key_leases: dict[str, int] = {}
    parked: set[str] = set()
    for p in planned:
        q = controls_of[p.queue_id]
        if not grant_still_fits(p.leases, _limits(q, usage_of[p.queue_id]), now):
            raise PlanNoLongerHolds()
        per_app[p.application_id] = (per_app.get(p.application_id, (0, q))[0] + p.leases, q)
        for k, n in p.key_leases.items():
            key_leases[k] = key_leases.get(k, 0) + n
        parked.update(p.parked)
    for aid, (n, q) in per_app.items():
        if not grant_still_fits(n, _application_limits(q, app_usage_of[aid]), now):
            raise PlanNoLongerHolds()
    if key_ids:
        limits = {r["id"]: int(r["max_concurrency"]) for r in key_reads[1]}
        for r in key_rows:
            k = r["resource_key_id"]
            after = int(r["permits_in_use"]) + key_leases.get(k, 0)
            if after > limits[k]:
                raise PlanNoLongerHolds()
            if k in parked and after < limits[k]:
                # A permit came back since the plan read the key: parking is only a hint, so
                # rather than run again, let the unparker return tasks for it after the commit.
                tx.keys_freed.add(k)
    await changes.apply(tx)


async def _grant_locked(tx: Tx, commands: list[ClaimCommand], live: dict[str, list[int]], replies: list[Any],
                       notes: list[Stmt]) -> None:
    """The exact order: lock the queues' usage rows, then their applications', then pick and lease
    under them (locking the candidates' resource keys' rows as they are met)."""
    queue_ids = sorted(live)
    app_ids = sorted({commands[slots[0]].who.principal.application_id for slots in live.values()})
    usage_rows, app_rows, control_rows, node_rows = await tx.rows_multi([
        usage_q.queue_rows(queue_ids, lock=True), usage_q.application_rows(app_ids, lock=True),
        # Read under the usage locks: a configure that committed meanwhile counts.
        queue_q.controls(queue_ids), key_q.nodes(queue_ids)])
    usage_of = {r["queue_id"]: r for r in usage_rows}
    controls = {r["id"]: r for r in control_rows}
    nodes = _nodes_by_queue(node_rows)
    # The clock after the locks: every lease whose permit is reused here ended before it.
    now = await tx.refresh_now()
    room = _application_room(commands, live, controls, {r["application_id"]: r for r in app_rows}, now)
    rooms: dict[str, KeyRoom] = {}
    changes = UsageChanges()
    for qid in queue_ids:
        slots = live[qid]
        mine = [commands[i] for i in slots]
        q = controls[qid]
        caps = _fair_caps(commands, slots, int(q["max_concurrency"]), nodes.get(qid, {}), now)
        grant = _grant(sum(caps), q, usage_of[qid], room, now)
        candidates: list[dict[str, Any]] = []
        if grant > 0:
            # The usage rows are held: claims take turns, so a plain indexed read is enough, and the
            # UPDATE re-checks WAITING: a task a cancel or sweep changed meanwhile is simply not taken.
            wanted = _wanted(commands, slots)
            levels = int(usage_of[qid]["priority_levels"])
            first = await tx.rows(task_q.claimable(qid, wanted, levels=levels, now=now))
            candidates = await _take(tx, qid, grant, first, wanted, now, rooms, {}, levels=levels, optimistic=False)
        if candidates:
            ids = [t["id"] for t in candidates]
            taken = await tx.count(task_q.mark_leased(ids, now, only_waiting=True))
            if taken != len(ids):
                leased = {r["id"] for r in await tx.rows(task_q.leased_among(ids))}
                candidates = [t for t in candidates if t["id"] in leased]
        notes += _note_claims(qid, mine, caps, candidates, nodes.get(qid, {}), now)
        if not candidates:
            continue
        room[q["application_id"]] -= len(candidates)
        changes.merge(await _write_leases(tx, qid, mine, caps, slots, replies, candidates, now,
                                          defer_receipts=False))
    await changes.apply(tx)


async def _write_leases(tx: Tx, queue_id: str, commands: list[ClaimCommand], caps: list[int], slots: list[int],
                        replies: list[Any], candidates: list[dict[str, Any]], now: datetime, *,
                        defer_receipts: bool) -> UsageChanges:
    """Share `candidates` among `commands` in arrival order, each up to its cap: lease rows,
    events, claim receipts and each command's reply; returns the usage changes (not yet applied)."""
    lease_rows = []
    events = []
    receipts = []
    changes = UsageChanges()
    pos = 0
    for slot, c, cap in zip(slots, commands, caps, strict=True):
        mine, pos = candidates[pos : pos + cap], pos + cap
        if not mine:
            continue
        who = c.who
        expires = now + timedelta(milliseconds=c.lease_ms)
        granted = []
        for t in mine:
            lease = {
                "id": new_id(), "task_id": t["id"], "queue_id": queue_id, "application_id": t["application_id"],
                "namespace_id": t["namespace_id"], "credential_id": who.principal.credential_id,
                "session_id": who.session_id, "worker_node_id": who.worker_node_id,
                "server_node_id": who.server_node_id, "attempt": int(t["attempts"]) + 1, "state": LEASED,
                "reserved": True, "leased_at": now, "expires_at": expires, "push_pending": False,
            }
            lease_rows.append([lease[col] for col in lease_q.COLUMNS])
            granted.append(lease_json(lease, t, orjson.Fragment(t["payload"])))
            changes.add(queue_id, t["application_id"], permits_in_use=1, rate_reserved=1, keys=task_q.resource_key_ids(t))
            events.append(_task_event(t, "task.leased", states.LEASED, lease_id=lease["id"], attempt=lease["attempt"]))
        receipts.append((who.principal.credential_id, c.msg_id, _claim_receipt(granted, c.lease_ms), now))
        replies[slot] = {"tasks": granted}
    await tx.defer_rows(lease_q.INSERT, lease_rows)
    await emit_many(tx, events)
    # Planned on a snapshot, they travel in the round trip that finally locks the usage rows.
    await claim_q.insert(tx, receipts, deferred=defer_receipts)
    return changes


async def _retime(tx: Tx, commands: list[ClaimCommand], slots: list[int], replies: list[Any], now: datetime) -> None:
    """Move the leases a claim just wrote to `now`, in the same transaction (their receipts
    refer to the lease rows, so they follow)."""
    for expires, ids in _retime_replies(commands, slots, replies, now).items():
        await tx.defer(lease_q.retime(ids, now, expires))


def _retime_replies(commands: list[ClaimCommand], slots: list[int], replies: list[Any],
                    now: datetime) -> dict[datetime, list[str]]:
    """Tell the claims their leases begin at `now`; the lease ids per new expiry."""
    by_expiry: dict[datetime, list[str]] = {}
    for slot, c in zip(slots, commands):
        expires = now + timedelta(milliseconds=c.lease_ms)
        for g in _granted(replies[slot]):
            g["lease_expires_at"] = format_ts(expires)
            by_expiry.setdefault(expires, []).append(g["lease_id"])
    return by_expiry


def _granted(reply: Any) -> list[dict[str, Any]]:
    """The leases a claim's reply grants (none for a refusal)."""
    return (reply.get("tasks") or []) if isinstance(reply, dict) else []


def _claim_receipt(granted: list[dict[str, Any]], lease_ms: int) -> str:
    """What a claim's receipt keeps to answer a resent claim: its leases' ids, in order, and
    their length. Everything else a lease tells the worker is on its lease row (which keeps
    the claim time) and its task row (immutable fields), so it is read back from them."""
    return orjson.dumps({"leases": [g["lease_id"] for g in granted], "lease_ms": lease_ms}).decode()


async def _replay_claim(tx: Tx, response: str) -> list[dict[str, Any]]:
    """The leases a claim granted, as it answered them."""
    stored = orjson.loads(response)
    ids = stored["leases"]
    if not ids:
        return []
    by_id = {r["id"]: r for r in await tx.rows(lease_q.granted(ids))}
    length = timedelta(milliseconds=stored["lease_ms"])
    granted = []
    for lease_id in ids:
        r = by_id[lease_id]
        lease = {"id": lease_id, "attempt": r["attempt"], "expires_at": r["leased_at"] + length}
        granted.append(lease_json(lease, {**r, "id": r["task_id"]}, _j(r["payload"])))
    return granted


# ------------------------------------------------------------------ locking helper


@dataclass
class _Locked:
    """Task and lease rows of a group of commands, locked in the global order."""

    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    also: list[list[dict[str, Any]]] = field(default_factory=list)


async def _lock_for_leases(
    tx: Tx, lease_ids: list[str], also: Callable[[list[str]], list[Stmt]] | None = None,
    located: dict[str, tuple[str, str]] | None = None, *, also_clock: bool = False,
) -> _Locked:
    """Lock the leases' task rows, then the lease rows (the global order), in one round trip
    after the id lookup; `also` adds reads about the leases' queues to that round trip.

    `located` maps lease ids to their (task id, queue id), which never change: the session
    that granted a lease knows them, and when it knows all of them the lookup round trip is
    skipped (the clock is then read in the lock round trip, after the locks: by the first
    `also` read when `also_clock` says that it selects `db_now`, else by a statement of its own)."""
    ids = sorted(set(lease_ids))
    located = located or {}
    unknown = [i for i in ids if i not in located]
    found = [{"id": i, "task_id": located[i][0], "queue_id": located[i][1]} for i in ids if i in located]
    if unknown:
        rows = await tx.rows(lease_q.locate(unknown))
        if rows:
            tx.adopt_clock(rows[0])
        found += rows
    locked = _Locked()
    if not found:
        return locked
    task_ids = sorted({r["task_id"] for r in found})
    reads = [task_q.lock_for_dispatch(task_ids), lease_q.lock(sorted(r["id"] for r in found))]
    if also is not None:
        reads += also(sorted({r["queue_id"] for r in found}))
    clock = not unknown  # else the lookup read it
    own_clock = clock and not (also is not None and also_clock)
    if own_clock:
        reads.append(lease_q.clock())
    task_rows, lease_rows, *locked.also = await tx.rows_multi(reads)
    if own_clock:
        tx.adopt_clock(locked.also.pop()[0])
    elif clock and locked.also[0]:
        tx.adopt_clock(locked.also[0][0])
    locked.tasks = {r["id"]: r for r in task_rows}
    for lease in lease_rows:
        if lease["task_id"] not in locked.tasks:
            raise RuntimeError(f"lease {lease['id']} is not on the task its session located it on")
    locked.leases = {r["id"]: rules.as_started(r, locked.tasks[r["task_id"]]) for r in lease_rows}
    return locked


def _located(commands: list[Any]) -> dict[str, tuple[str, str]]:
    return {c.lease_id: c.located for c in commands if c.located is not None}


class _Writes:
    """Row updates of a grouped transaction, flushed after all decisions are made, and what they
    count in the metrics once committed."""

    def __init__(self, tally: metrics.Tally) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.events: list[Event] = []
        self.usage = UsageChanges()
        self.tally = tally
        self.permits_back: dict[str, int] = {}  # per queue: leases that gave their permit back

    def task(self, task_id: str, **values: Any) -> None:
        self.tasks.setdefault(task_id, {}).update(values)

    def lease(self, lease_id: str, **values: Any) -> None:
        self.leases.setdefault(lease_id, {}).update(values)

    def started(self, queue_id: str, waited: timedelta | None) -> None:
        """An attempt's Start was authorized: the metrics, and the queue's throughput counter in
        the UPDATE of its usage row that the Start writes anyway."""
        self.tally.started(waited)
        self.usage.count_started(queue_id)

    def task_ended(self, task: dict[str, Any], state: str) -> None:
        """A task ended in `state`: the metrics, and the queue's throughput counter (its usage
        row is written anyway: the task's unfinished slot goes back)."""
        self.tally.task_ended(state)
        self.usage.count_ended(task["queue_id"], state)

    async def flush(self, tx: Tx) -> None:
        await self.flush_rows(tx)
        await self.usage.apply(tx)

    async def flush_rows(self, tx: Tx) -> None:
        """Task, lease and event rows; the usage rows, which every dispatch transaction
        meets on, are written last so that their locks are held the shortest time."""
        await update_many(tx, "tasks", self.tasks)
        await update_many(tx, "leases", self.leases)
        await emit_many(tx, self.events)


def _give_back(w: _Writes, lease: dict[str, Any], task: dict[str, Any]) -> None:
    """A lease ends: the permits it holds (queue, application, each resource key, its node's
    share) and its rate reservation if it never started."""
    w.usage.add(lease["queue_id"], task["application_id"], permits_in_use=-1,
                rate_reserved=-1 if lease["reserved"] else 0, keys=task_q.resource_key_ids(task), node=lease["worker_node_id"])
    w.permits_back[lease["queue_id"]] = w.permits_back.get(lease["queue_id"], 0) + 1


def _finished(w: _Writes, task: dict[str, Any]) -> None:
    """A task ends: one unfinished task less in its queue, application and resource keys."""
    w.usage.add(task["queue_id"], task["application_id"], unfinished=-1, keys=task_q.resource_key_ids(task))


def _end_task_failed(w: _Writes, task: dict[str, Any], now: datetime, code: str, message: str) -> None:
    error = {"code": code, "message": message}
    w.task(task["id"], state=states.FAILED, error=orjson.dumps(error).decode(), updated_at=now, finished_at=now)
    _finished(w, task)
    w.events.append(_task_event(task, "task.failed", states.FAILED, error=error))
    w.task_ended(task, states.FAILED)


def _fail_unstarted(w: _Writes, lease: dict[str, Any], task: dict[str, Any], now: datetime, code: str,
                    message: str) -> None:
    """A leased task whose deadline passed before its Start: end it FAILED, free permit and reservation."""
    _end_task_failed(w, task, now, code, message)
    w.lease(lease["id"], state=ENDED, ended_at=now, outcome=code, reserved=False)
    _give_back(w, lease, task)
    lease.update(state=ENDED, outcome=code)


def _retry_or_fail(w: _Writes, task: dict[str, Any], now: datetime, *, retryable: bool, code: str,
                   message: str) -> dict[str, Any]:
    """A failed attempt: back to WAITING with backoff while budget and deadline allow, else FAILED."""
    after = rules.after_failure(
        attempts=int(task["attempts"]), max_attempts=int(task["max_attempts"]), retryable=retryable,
        cancel_requested=bool(task["cancel_requested"]), deadline_at=task["deadline_at"],
        policy=orjson.loads(task["retry_policy"]), code=code, message=message, now=now)
    if after.retry:
        error = {"code": code, "message": message}
        w.task(task["id"], state=states.WAITING, available_at=after.next_at, error=orjson.dumps(error).decode(),
               updated_at=now)
        w.events.append(_task_event(task, "task.retry_scheduled", states.WAITING, attempt=int(task["attempts"]),
                                    next_available_at=format_ts(after.next_at), error=error))
        return {"task_state": states.WAITING, "next_available_at": format_ts(after.next_at)}
    _end_task_failed(w, task, now, after.code or code, after.message or message)
    return {"task_state": states.FAILED}


# ------------------------------------------------------------------ start


@dataclass(frozen=True)
class StartCommand:
    credential_id: str
    msg_id: str
    lease_id: str
    located: tuple[str, str] | None = None  # (task id, queue id) when the session granted the lease


async def start(db: Database, commands: list[StartCommand]) -> list[Result]:
    """Authorize Starts; a refused Start (rate, pause) writes nothing.

    The queue's usage row is every dispatch transaction's meeting point, so it is
    locked *last*: decisions are planned on an unlocked read of the rate window,
    the task, lease and event rows are written, and only then is the window locked
    and the plan re-checked against it. If the window moved so that the plan no
    longer holds, the transaction is rolled back and re-run with the window locked
    first (the exact, slower order). A plan that refuses anything on the snapshot
    is re-decided under the lock before anything is written.
    """
    tallies = metrics.Tallies()
    replies = await db.lock_last(lambda tx, optimistic: _start_body(tx, commands, tallies, optimistic=optimistic))
    tallies.publish()
    return replies


Window = tuple[str, str]  # (layer, id): a queue's or an application's rate window


async def _read_windows(tx: Tx, keys: list[Window], *, lock: bool) -> dict[Window, RateWindow]:
    """The windows of these queues and applications (locked: queues' rows first, the lock order)."""
    queue_ids = sorted(k for layer, k in keys if layer == QUEUE)
    app_ids = sorted(k for layer, k in keys if layer == APPLICATION)
    reads = ([usage_q.queue_rows(queue_ids, lock=lock)] if queue_ids else []) + \
            ([usage_q.application_rows(app_ids, lock=lock)] if app_ids else [])
    results = iter(await tx.rows_multi(reads))
    return _windows(next(results) if queue_ids else [], next(results) if app_ids else [])


def _windows(queue_rows: list[dict[str, Any]], app_rows: list[dict[str, Any]]) -> dict[Window, RateWindow]:
    out = {(QUEUE, r["queue_id"]): usage_q.window_of(r) for r in queue_rows}
    out.update({(APPLICATION, r["application_id"]): usage_q.window_of(r) for r in app_rows})
    return out


def _rates(controls: dict[str, Any]) -> dict[Window, int]:
    out: dict[Window, int] = {}
    for qid, q in controls.items():
        out[(QUEUE, qid)] = int(q["rate_per_second"])
        out[(APPLICATION, q["application_id"])] = int(q["application_rate_per_second"])
    return out


@dataclass
class _StartPlan:
    replies: list[Result]
    writes: _Writes
    counted: dict[Window, list[bool]]  # window -> `reserved` of each Start counted in it, in order
    rate_limited: bool


def _plan_starts(commands: list[StartCommand], locked: _Locked, controls: dict[str, Any],
                 windows: dict[Window, RateWindow], rates: dict[Window, int], now: datetime,
                 tally: metrics.Tally) -> _StartPlan:
    w = _Writes(tally)
    replies: list[Result] = []
    counted: dict[Window, list[bool]] = {}
    rate_limited = False
    leases_ = {k: dict(v) for k, v in locked.leases.items()}
    tasks_ = {k: dict(v) for k, v in locked.tasks.items()}
    windows = dict(windows)
    for c in commands:
        lease = leases_.get(c.lease_id)
        if lease is None or lease["credential_id"] != c.credential_id:
            replies.append(_no_such_lease())
            continue
        if lease["start_msg_id"] == c.msg_id:
            replies.append(orjson.loads(lease["start_response"]))
            continue
        task = tasks_[lease["task_id"]]
        qid = lease["queue_id"]
        verdict = rules.start_verdict(
            state=lease["state"], expires_at=lease["expires_at"], outcome=lease["outcome"],
            attempts=int(task["attempts"]), start_deadline_at=task["start_deadline_at"],
            deadline_at=task["deadline_at"], paused=_paused(controls[qid]), now=now)
        if verdict.kind == "fail_task":
            _fail_unstarted(w, lease, task, now, verdict.task_code, verdict.task_message)
        if verdict.kind != "go":
            replies.append(_refused(verdict.refusal))
            continue
        reserved = bool(lease["reserved"])
        # Every layer's window must take the Start; a refusal by any writes nothing.
        keys = ((QUEUE, qid), (APPLICATION, controls[qid]["application_id"]))
        decisions = [authorize_start(windows[k], rates[k], now, reserved=reserved) for k in keys]
        refused = [(k, d) for k, d in zip(keys, decisions, strict=True) if not d.allowed]
        if refused:
            rate_limited = True
            w.tally.rate_limited()
            layer = refused[-1][0][0]
            replies.append(DomainError("RATE_LIMITED", f"the {layer}'s Start rate is exhausted for this window",
                                       retry_after_ms=max(d.retry_after_ms for _, d in refused)))
            continue
        for k, d in zip(keys, decisions, strict=True):
            windows[k] = d.window
            counted.setdefault(k, []).append(reserved)
            w.usage.set_window(k[1], d.window.start, d.window.used, layer=k[0])
        if reserved:
            w.usage.add(qid, task["application_id"], rate_reserved=-1)
        attempt = int(task["attempts"]) + 1
        receipt = {
            "attempt": attempt,
            "started_at": format_ts(now),
            "start_receipt_id": new_id(),
            "deadline_at": format_ts(task["deadline_at"]),
            "lease_expires_at": format_ts(lease["expires_at"]),
        }
        stored = orjson.dumps(receipt).decode()
        # The lease row is left alone: its task's row says that it started (`rules.as_started`).
        w.task(task["id"], state=states.RUNNING, attempts=attempt, updated_at=now, started_at=now,
               start_msg_id=c.msg_id, start_response=stored)
        task.update(state=states.RUNNING, attempts=attempt, started_at=now, start_msg_id=c.msg_id,
                    start_response=stored)
        lease.update(rules.as_started(lease, task))
        w.events.append(_task_event(task, "task.started", states.RUNNING, attempt=attempt, lease_id=lease["id"]))
        w.started(qid, now - task["created_at"] if attempt == 1 else None)
        replies.append(receipt)
    return _StartPlan(replies, w, counted, rate_limited)


async def _start_body(tx: Tx, commands: list[StartCommand], tallies: metrics.Tallies, *,
                      optimistic: bool) -> list[Result]:
    def queue_reads(queue_ids: list[str]) -> list[Stmt]:
        if optimistic:  # it reads the clock too, after the locks: one statement fewer
            return [usage_q.with_controls(queue_ids, clock=True)]
        return [usage_q.queue_rows(queue_ids, lock=True), usage_q.application_rows_of_queues(queue_ids, lock=True),
                queue_q.controls(queue_ids)]

    locked = await _lock_for_leases(tx, [c.lease_id for c in commands], queue_reads, _located(commands),
                                    also_clock=optimistic)
    windows: dict[Window, RateWindow] = {}
    controls: dict[str, Any] = {}
    if locked.also:
        usage_rows, app_rows, control_rows = (usage_q.split_with_controls(locked.also[0]) if optimistic
                                              else locked.also)
        windows = _windows(usage_rows, app_rows)
        controls = {r["id"]: r for r in control_rows}
    rates = _rates(controls)
    # Locked first, the clock must be read after the lock; planning on a snapshot, the first read's clock will do.
    now = await (tx.now() if optimistic else tx.refresh_now())
    plan = _plan_starts(commands, locked, controls, windows, rates, now, tallies.new())
    if not optimistic:
        await plan.writes.flush(tx)
        return plan.replies
    if plan.rate_limited:
        # A refusal must be exact: decide again with the windows locked (nothing is written yet).
        windows = await _read_windows(tx, sorted(windows), lock=True)
        now = await tx.refresh_now()
        plan = _plan_starts(commands, locked, controls, windows, rates, now, tallies.new())
        await plan.writes.flush(tx)
        return plan.replies
    await plan.writes.flush_rows(tx)
    usage = plan.writes.usage
    # The windows count the Starts in the UPDATEs that travel with the COMMIT where the backend
    # can: no round trip then holds the usage rows. Elsewhere they are counted on a locked read.
    recount = sorted(k for k, reserved in plan.counted.items()
                     if not usage.count_starts_in_sql(tx, k[1], len(reserved), rates[k], now, layer=k[0]))
    if recount:
        current = await _read_windows(tx, recount, lock=True)
        for k in recount:
            window = count_starts(current[k], rates[k], now, plan.counted[k])
            if window is None:
                raise PlanNoLongerHolds()
            usage.set_window(k[1], window.start, window.used, layer=k[0])
    await usage.apply(tx)
    return plan.replies


# ------------------------------------------------------------------ renew


@dataclass(frozen=True)
class RenewCommand:
    credential_id: str
    msg_id: str
    lease_id: str
    lease_ms: int
    session_id: str | None = None
    server_node_id: str | None = None


async def renew(db: Database, commands: list[RenewCommand]) -> list[Result]:
    """Extend current leases (never beyond MAX_LEASE_MS from now); report cancel requests."""

    async def body(tx: Tx) -> list[Result]:
        ids = sorted({c.lease_id for c in commands})
        rows = {r["id"]: r for r in await tx.rows(lease_q.lock_for_renew(ids))}
        task_ids = sorted({r["task_id"] for r in rows.values()})
        cancel = {r["id"]: bool(r["cancel_requested"])
                  for r in await tx.rows(task_q.cancel_requested(task_ids))} if task_ids else {}
        now = await tx.now()
        replies: list[Result] = []
        extended: dict[str, dict[str, Any]] = {}
        for c in commands:
            lease = rows.get(c.lease_id)
            if lease is None or lease["credential_id"] != c.credential_id:
                replies.append(_no_such_lease())
                continue
            if not rules.is_current(lease["state"], lease["expires_at"], now):
                replies.append(_refused(rules.not_current(lease["outcome"])))
                continue
            expires = rules.renewed_until(now, c.lease_ms)
            extended[lease["id"]] = {"expires_at": expires}
            if c.session_id is not None:
                # A worker that reconnected elsewhere renews from its new session: pushes follow it.
                extended[lease["id"]].update(session_id=c.session_id, server_node_id=c.server_node_id)
            lease["expires_at"] = expires
            replies.append({"lease_expires_at": format_ts(expires),
                            "cancel_requested": cancel.get(lease["task_id"], False)})
        await update_many(tx, "leases", extended)
        return replies

    return await db.transaction(body)


# ------------------------------------------------------------------ complete / release


@dataclass(frozen=True)
class CompleteCommand:
    credential_id: str
    msg_id: str
    lease_id: str
    outcome: str  # succeeded | failed | cancelled | release
    result: Any = None
    error_message: str | None = None
    retryable: bool = True
    located: tuple[str, str] | None = None  # as in StartCommand


async def complete(db: Database, commands: list[CompleteCommand]) -> list[Result]:
    """Record outcomes (and releases). Reports for leases no longer current are late evidence."""
    tallies = metrics.Tallies()

    async def body(tx: Tx) -> list[Result]:
        locked = await _lock_for_leases(tx, [c.lease_id for c in commands], located=_located(commands))
        now = await tx.now()
        w = _Writes(tallies.new())
        replies: list[Result] = []
        for c in commands:
            lease = locked.leases.get(c.lease_id)
            if lease is None or lease["credential_id"] != c.credential_id:
                replies.append(_no_such_lease())
                continue
            if lease["complete_msg_id"] == c.msg_id:
                replies.append(orjson.loads(lease["complete_response"]))
                continue
            task = locked.tasks[lease["task_id"]]
            if c.outcome == "release":
                replies.append(_release(w, lease, task, c, now))
                continue
            verdict = rules.complete_verdict(
                state=lease["state"], expires_at=lease["expires_at"], reported=c.outcome,
                error_message=c.error_message, retryable=c.retryable,
                cancel_requested=bool(task["cancel_requested"]), deadline_at=task["deadline_at"], now=now)
            if verdict.kind == "refuse":
                replies.append(_refused(verdict.refusal))
                continue
            if verdict.kind == "late":
                _keep_late_report(w, lease, c, now)
                replies.append(_refused(verdict.refusal))
                continue
            replies.append(_end_attempt(w, lease, task, c, verdict, now))
        await w.flush(tx)
        if w.permits_back:
            # Only claims a task may follow are woken: at light load no task waits for a permit.
            await usage_q.note_unleased(tx, w.permits_back)
        return replies

    replies = await db.transaction(body)
    tallies.publish()
    return replies


def _keep_late_report(w: _Writes, lease: dict[str, Any], c: CompleteCommand, now: datetime) -> None:
    """Store a late report as evidence on its lease, within the lease's bounds for it: with its
    result while they fit, else without it (`result_omitted`)."""
    late = orjson.loads(lease["late_reports"]) if lease["late_reports"] else []
    if not rules.keeps_late_report(len(late) + 1):
        return
    report = {"msg_id": c.msg_id, "outcome": c.outcome, "received_at": format_ts(now), "error": c.error_message}
    encoded = orjson.dumps([*late, {**report, "result": c.result}])
    if not rules.keeps_late_result(len(encoded)):
        encoded = orjson.dumps([*late, {**report, "result_omitted": True}])
    lease["late_reports"] = encoded.decode()
    w.lease(lease["id"], late_reports=lease["late_reports"])


def _end_attempt(w: _Writes, lease: dict[str, Any], task: dict[str, Any], c: CompleteCommand,
                 verdict: rules.CompleteVerdict, now: datetime) -> dict[str, Any]:
    _give_back(w, lease, task)
    error = None
    if verdict.kind == "succeeded":
        w.task(task["id"], state=states.SUCCEEDED, result=orjson.dumps(c.result).decode(), updated_at=now,
               finished_at=now, error=None)
        _finished(w, task)
        w.events.append(_task_event(task, "task.succeeded", states.SUCCEEDED, attempt=lease["attempt"]))
        w.task_ended(task, states.SUCCEEDED)
        answer, outcome = {"task_state": states.SUCCEEDED}, "SUCCEEDED"
    elif verdict.kind == "deadline":
        _end_task_failed(w, task, now, "DEADLINE_EXCEEDED", verdict.message)
        answer, outcome = {"task_state": states.FAILED}, "CANCELLED"
    elif verdict.kind == "cancelled":
        w.task(task["id"], state=states.CANCELLED, updated_at=now, finished_at=now)
        _finished(w, task)
        w.events.append(_task_event(task, "task.cancelled", states.CANCELLED, reason=task["cancel_reason"]))
        w.task_ended(task, states.CANCELLED)
        answer, outcome = {"task_state": states.CANCELLED}, "CANCELLED"
    else:
        error = {"code": "HANDLER_ERROR", "message": verdict.message}
        answer = _retry_or_fail(w, task, now, retryable=verdict.retryable, code="HANDLER_ERROR",
                                message=verdict.message)
        outcome = "FAILED"
    if lease["started_at"] is not None:
        w.tally.attempt_ended(outcome, now - lease["started_at"])
    response = orjson.dumps(answer).decode()
    w.lease(lease["id"], state=ENDED, ended_at=now, outcome=outcome,
            error=orjson.dumps(error).decode() if error else None, complete_msg_id=c.msg_id,
            complete_response=response, **rules.start_fields(lease))
    lease.update(state=ENDED, complete_msg_id=c.msg_id, complete_response=response)
    return answer


def _release(w: _Writes, lease: dict[str, Any], task: dict[str, Any], c: CompleteCommand, now: datetime) -> Result:
    refusal = rules.release_refusal(state=lease["state"], expires_at=lease["expires_at"], outcome=lease["outcome"],
                                    now=now)
    if refusal is not None:
        return _refused(refusal)
    w.task(task["id"], state=states.WAITING, updated_at=now)
    _give_back(w, lease, task)
    w.events.append(_task_event(task, "task.released", states.WAITING, lease_id=lease["id"], reason="released"))
    answer = {"task_state": states.WAITING}
    response = orjson.dumps(answer).decode()
    w.lease(lease["id"], state=ENDED, ended_at=now, outcome="RELEASED", reserved=False,
            complete_msg_id=c.msg_id, complete_response=response)
    lease.update(state=ENDED, outcome="RELEASED", complete_msg_id=c.msg_id, complete_response=response)
    return answer


# ------------------------------------------------------------------ recovery


async def recover_expired_leases(db: Database, batch: int = 200) -> int:
    """Expired LEASED leases give their task back; expired RUNNING ones lose their attempt.

    Every node runs this: candidate tasks are taken with SKIP LOCKED, so nodes
    divide the work and never wait on a task row another transaction holds.
    """
    tallies = metrics.Tallies()

    async def body(tx: Tx) -> int:
        now = await tx.now()
        expired = await tx.rows(lease_q.expired(now, batch))
        if not expired:
            return 0
        task_rows = {r["id"]: r for r in await tx.rows(
            task_q.lock_skipping_locked(sorted({e["task_id"] for e in expired})))}
        lease_ids = sorted(e["id"] for e in expired if e["task_id"] in task_rows)
        lease_rows = {r["id"]: rules.as_started(r, task_rows[r["task_id"]])
                      for r in await tx.rows(lease_q.lock_all_columns(lease_ids))} if lease_ids else {}
        w = _Writes(tallies.new())
        n = 0
        for lease in lease_rows.values():
            if not rules.expired(lease["state"], lease["expires_at"], now):
                continue
            task = task_rows[lease["task_id"]]
            n += 1
            _give_back(w, lease, task)
            if lease["state"] == LEASED:
                w.task(task["id"], state=states.WAITING, updated_at=now)
                w.lease(lease["id"], state=ENDED, ended_at=now, outcome="EXPIRED", reserved=False, push_pending=True)
                w.events.append(_task_event(task, "task.released", states.WAITING, lease_id=lease["id"],
                                            reason="lease_expired"))
                continue
            error = {"code": "LEASE_LOST", "message": "the lease expired while the attempt was running"}
            w.lease(lease["id"], state=ENDED, ended_at=now, outcome="LEASE_LOST", error=orjson.dumps(error).decode(),
                    push_pending=True, **rules.start_fields(lease))
            w.events.append(_task_event(task, "task.lease_lost", task["state"], attempt=lease["attempt"],
                                        lease_id=lease["id"]))
            w.tally.lease_lost()
            if rules.lease_lost_goes_to_review(task["on_lease_lost"]):
                w.task(task["id"], state=states.NEEDS_REVIEW, error=orjson.dumps(error).decode(), updated_at=now)
                w.events.append(_task_event(task, "task.needs_review", states.NEEDS_REVIEW, attempt=lease["attempt"]))
            else:
                _retry_or_fail(w, task, now, retryable=True, code="LEASE_LOST", message=error["message"])
        await w.flush(tx)
        if w.permits_back:
            # A task given back, or one a freed permit lets start, reaches the claims waiting here at once.
            await usage_q.note_unleased(tx, w.permits_back)
        return n

    if not await db.any_row(lease_q.any_expired()):
        return 0
    n = await db.transaction(body)
    tallies.publish()
    return n


# ------------------------------------------------------------------ parked tasks


async def unpark(db: Database, key_ids: set[str] | None = None, *, batch: int = 100) -> dict[str, int]:
    """Give tasks parked on keys that have free permits back to the claimable part, one per
    free permit, in dispatch order; returns how many went back per queue (to wake that many claims).

    With `key_ids` (keys a transaction of this node just gave permits back to) only those
    are looked at; without, every key with both (the periodic pass that also catches a task
    parked at submit on a snapshot that was already stale). Parking is a hint, never a
    limit: a claim re-checks every key, so unparking one task too many costs one more park."""
    read = key_q.free_permits(sorted(key_ids)) if key_ids else key_q.with_free_permits_and_parked(batch)
    free = {r["id"]: int(r["free"]) for r in await db.read(lambda tx: tx.rows(read))}
    if not free:
        return {}

    async def body(tx: Tx) -> dict[str, int]:
        keys = sorted(free)
        parked = await tx.rows_multi([task_q.parked_on(k, free[k]) for k in keys])
        queues: dict[str, int] = {}
        for k, rows in zip(keys, parked, strict=True):
            if rows:
                await tx.defer(task_q.unpark([r["id"] for r in rows], k))
                for r in rows:
                    queues[r["queue_id"]] = queues.get(r["queue_id"], 0) + 1
        return queues

    return await db.transaction(body)


class Unparker:
    """A node's tasks parked on resource keys: keys its transactions gave permits back to are
    served at once (`freed`, wired to `Database.on_keys_freed`), every key at least each
    `sweep_s` seconds."""

    def __init__(self, db: Database, sweep_s: float = 1.0) -> None:
        self.db = db
        self.sweep_s = sweep_s
        self.wake = asyncio.Event()
        self._pending: set[str] = set()
        self._swept_at = 0.0

    def freed(self, key_ids: set[str]) -> None:
        self._pending.update(key_ids)
        self.wake.set()

    async def run_once(self) -> dict[str, int]:
        """How many tasks went back to the claimable part, per queue."""
        keys, self._pending = self._pending, set()
        queues = await unpark(self.db, keys) if keys else {}
        if time.monotonic() - self._swept_at >= self.sweep_s:
            self._swept_at = time.monotonic()
            for q, n in (await unpark(self.db)).items():
                queues[q] = queues.get(q, 0) + n
        return queues
