"""The execution half: claim, Start authorization, renew, complete, release, lease recovery.

Every operation takes a *list* of commands and runs them in one transaction so
that a node can group-commit whatever frames arrived together. Locks are taken
in one order everywhere: task rows (sorted), then lease rows, then usage rows
(sorted, queues before applications). A claim holds its queue's usage row
first and only skip-locks task rows, so it never waits behind that order.

Replies are plain dicts: ``{"ok": True, ...}`` or ``{"ok": False, "error": {...}}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import select

from ..core import states
from ..core.backoff import backoff_ms
from ..core.deadlines import start_deadline_applies
from ..core.ids import new_id
from ..core.rate_window import RateWindow, authorize_start, claim_room
from ..core.timefmt import format_ts
from ..store.bulk import update_many
from ..store.db import BAD_NULL, Database, RetryTransaction, Tx, is_duplicate_key, placeholders
from ..store.tables import leases, queues, tasks
from .auth import Principal
from .outbox import emit_many
from .usage import PlanNoLongerHolds, UsageChanges, lock_last

DEFAULT_LEASE_MS = 30_000
MAX_LEASE_MS = 600_000
HEARTBEAT_MS = 10_000
MAX_LATE_REPORTS = 20

LEASED, RUNNING, ENDED = "LEASED", "RUNNING", "ENDED"


@dataclass(frozen=True)
class WorkerIdentity:
    """Who sends worker commands: the credential, its session and the nodes involved."""

    principal: Principal
    session_id: str
    worker_node_id: str
    server_node_id: str


def ok(**fields: Any) -> dict[str, Any]:
    return {"ok": True, **fields}


def fail(code: str, message: str, retry_after_ms: int | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if retry_after_ms is not None:
        err["retry_after_ms"] = int(retry_after_ms)
    return {"ok": False, "error": err}


def _j(text: str | None) -> Any:
    return None if text is None else orjson.Fragment(text)


def _ms(delta: timedelta) -> int:
    return max(0, int(delta / timedelta(milliseconds=1)))


def _task_event(task: Any, type_: str, state: str, **extra: Any) -> tuple[str, str, str, str, dict[str, Any]]:
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
    }


async def missing_queues(db: Database, namespace_id: str, queue_ids: list[str]) -> list[str]:
    """Queue ids of a hello that do not exist in the credential's namespace."""
    if not queue_ids:
        return []

    async def read(tx: Tx) -> list[str]:
        rows = await tx.all(select(queues.c.id).where(queues.c.namespace_id == namespace_id,
                                                      queues.c.id.in_(set(queue_ids))))
        found = {r["id"] for r in rows}
        return [q for q in queue_ids if q not in found]

    return await db.read(read)


# ------------------------------------------------------------------ claim


@dataclass(frozen=True)
class ClaimCommand:
    who: WorkerIdentity
    queue_id: str
    max_tasks: int
    lease_ms: int
    msg_id: str


async def claim(
    db: Database, who: WorkerIdentity, queue_id: str, *, max_tasks: int, lease_ms: int, msg_id: str
) -> dict[str, Any]:
    """Lease up to `max_tasks` due tasks in dispatch order within the queue's free permits and rate space."""
    (reply,) = await claim_many(db, [ClaimCommand(who, queue_id, max_tasks, lease_ms, msg_id)])
    return reply


_PICK = ("SELECT id, namespace_id, application_id, queue_id, priority, attempts, payload, resource_keys, "
         "start_deadline_at, deadline_at FROM tasks WHERE queue_id = ? AND state = 'WAITING' AND available_at <= {now} "
         "ORDER BY priority DESC, available_at, id LIMIT ?")


async def claim_many(db: Database, commands: list[ClaimCommand]) -> list[dict[str, Any]]:
    """Claims that arrived together on a node, of one queue or several, in one transaction.

    A node gathers the claims its sessions sent meanwhile (per application: their
    queues meet on the application's usage row) and serves them together: per
    queue one grant, one candidate read and one round of writes, shared in arrival
    order; every queue's reads travel in the same round trips. Like a Start, a
    claim locks the usage rows *last*: the grants are planned on unlocked reads,
    the chosen tasks are locked with SKIP LOCKED (so claims on several nodes never
    take the same task nor wait on each other) and written, and only then are the
    queues' usage rows locked, in queue order, and every grant re-checked. If one
    no longer fits, everything is rolled back and the claims run again with each
    usage row locked first. If a permit was given back at a later database time
    than the plan's clock, the leases are re-timed to just after it
    (`permits_freed_at`), so stored lease intervals never overlap beyond the limit.
    """
    return await lock_last(db, lambda tx, optimistic: _claim_body(tx, commands, optimistic=optimistic))


_CONTROLS_OF = ("SELECT id, namespace_id, paused, retired_at, max_concurrency, rate_per_second FROM queues "
                "WHERE id IN ({ids})")
_USAGE_OF = ("SELECT queue_id, permits_in_use, rate_window_start, rate_window_used, rate_reserved, "
             "permits_freed_at, {now} AS db_now FROM queue_usage WHERE queue_id IN ({ids}) ORDER BY queue_id")


async def _claim_body(tx: Tx, commands: list[ClaimCommand], *, optimistic: bool) -> list[dict[str, Any]]:
    replies: list[dict[str, Any] | None] = [None] * len(commands)
    keys = [(c.who.principal.credential_id, c.msg_id) for c in commands]
    by_queue: dict[str, list[int]] = {}
    for i, c in enumerate(commands):
        by_queue.setdefault(c.queue_id, []).append(i)
    queue_ids = sorted(by_queue)
    reads: list[tuple[str, Any]] = [
        ("SELECT credential_id, msg_id, response FROM worker_claims WHERE "
         + " OR ".join("(credential_id = ? AND msg_id = ?)" for _ in keys), [v for k in keys for v in k]),
    ]
    marks = placeholders(len(queue_ids))
    reads.append((_CONTROLS_OF.format(ids=marks), queue_ids))
    if optimistic:
        # Plan on unlocked usage reads, and lock (SKIP LOCKED) as many due tasks per queue as its
        # claims could take in the same round trip; the grants then decide how many are used.
        reads.append((_USAGE_OF.format(now=tx.now_sql, ids=marks), queue_ids))
        due = ("NOW(6)", ()) if tx.is_mysql else ("?", (await tx.now(),))
        for qid in queue_ids:
            reads.append((_PICK.format(now=due[0]) + tx.skip_locked,
                          (qid, *due[1], sum(commands[i].max_tasks for i in by_queue[qid]))))
    prior, control_rows, *rest = await tx.raw_rows_multi(
        reads, datetimes=("rate_window_start", "permits_freed_at", "db_now", *TASK_TIMES))
    controls = {r["id"]: r for r in control_rows}
    snapshots = {r["queue_id"]: r for r in rest[0]} if optimistic else {}
    picks = dict(zip(queue_ids, rest[1:])) if optimistic else {}
    stored = {(r["credential_id"], r["msg_id"]): r["response"] for r in prior}
    for i, k in enumerate(keys):
        if k in stored:
            replies[i] = ok(tasks=await _replay_claim(tx, stored[k]))
    planned: list[_PlannedGrant] = []
    for qid in queue_ids:
        q = controls.get(qid)
        live = []
        for i in by_queue[qid]:
            c = commands[i]
            if replies[i] is not None:
                continue
            if q is None or q["namespace_id"] != c.who.principal.namespace_id:
                replies[i] = fail("NOT_FOUND", "queue not found")
            elif q["retired_at"] is not None:
                replies[i] = fail("STATE_CONFLICT", "the queue is retired")
            elif q["paused"]:
                replies[i] = ok(tasks=[])
            else:
                live.append(i)
        if not live:
            continue
        if not optimistic or qid not in snapshots:
            await _grant_locked(tx, qid, [commands[i] for i in live], replies, live)
            continue
        plan = await _plan_grant(tx, qid, [commands[i] for i in live], replies, live, q, snapshots[qid], picks[qid])
        if plan is not None:
            planned.append(plan)
    if planned:
        await _confirm_grants(tx, planned, replies)
    return [r if r is not None else ok(tasks=[]) for r in replies]


@dataclass
class _PlannedGrant:
    """A queue's grant planned on the unlocked snapshot, written but not yet checked under the lock."""

    queue_id: str
    commands: list[ClaimCommand]
    slots: list[int]
    now: datetime
    leases: int
    changes: UsageChanges


def _grant_size(commands: list[ClaimCommand], q: dict[str, Any], usage: dict[str, Any], now: datetime) -> int:
    window = RateWindow(usage["rate_window_start"], int(usage["rate_window_used"]), int(usage["rate_reserved"]))
    return min(
        sum(c.max_tasks for c in commands),
        int(q["max_concurrency"]) - int(usage["permits_in_use"]),
        claim_room(window, int(q["rate_per_second"]), now),
    )


async def _plan_grant(tx: Tx, queue_id: str, commands: list[ClaimCommand], replies: list[Any], slots: list[int],
                      q: dict[str, Any], usage: dict[str, Any], picked: list[dict[str, Any]]) -> _PlannedGrant | None:
    """Lease the due tasks `picked` (locked with SKIP LOCKED) to `commands` within the room an
    unlocked usage read shows; the writes wait to travel with the round trip that locks the usage rows."""
    tx.set_now(usage["db_now"])
    now = await tx.now()
    grant = _grant_size(commands, q, usage, now)
    # Claims on other nodes run at the same time: each locked its own candidates (SKIP LOCKED).
    candidates = picked[:grant] if grant > 0 else []
    if not candidates:
        return None
    await tx.defer(f"UPDATE tasks SET state = 'LEASED', updated_at = ? WHERE id IN "
                   f"({placeholders(len(candidates))})", (now, *(t["id"] for t in candidates)))
    changes = await _write_leases(tx, queue_id, commands, slots, replies, candidates, now, defer_receipts=True)
    return _PlannedGrant(queue_id, commands, slots, now, len(candidates), changes)


async def _confirm_grants(tx: Tx, planned: list[_PlannedGrant], replies: list[Any]) -> None:
    """Lock the planned queues' usage rows (queue order) in the round trip that carries every
    grant's writes, and check each grant there; raise `PlanNoLongerHolds` if one no longer fits."""
    ids = [p.queue_id for p in planned]
    marks = placeholders(len(ids))
    try:
        usage_rows, control_rows = await tx.raw_rows_multi(
            [(_USAGE_OF.format(now="NULL", ids=marks) + tx.for_update, ids), (_CONTROLS_OF.format(ids=marks), ids)],
            datetimes=("rate_window_start", "permits_freed_at"),
        )
    except Exception as exc:
        if is_duplicate_key(exc):  # the same message id is being claimed elsewhere: replay it
            raise RetryTransaction() from exc
        raise
    usage_of = {r["queue_id"]: r for r in usage_rows}
    controls_of = {r["id"]: r for r in control_rows}
    changes = UsageChanges()
    for p in planned:
        usage, q = usage_of[p.queue_id], controls_of[p.queue_id]
        now = p.now
        freed_at = usage["permits_freed_at"]
        if freed_at is not None and freed_at >= now:
            # A permit this claim may reuse was given back at a later database time than the
            # snapshot's clock: lease from just after it, so no stored interval overlaps another.
            now = freed_at + timedelta(microseconds=1)
            await _retime(tx, p.commands, p.slots, replies, now)
        window = RateWindow(usage["rate_window_start"], int(usage["rate_window_used"]), int(usage["rate_reserved"]))
        if (q["paused"] or (window.start is not None and window.start > now)
                or int(usage["permits_in_use"]) + p.leases > int(q["max_concurrency"])
                or claim_room(window, int(q["rate_per_second"]), now) < p.leases):
            raise PlanNoLongerHolds()
        changes.merge(p.changes)
    await changes.apply(tx)


async def _grant_locked(tx: Tx, queue_id: str, commands: list[ClaimCommand], replies: list[Any],
                        slots: list[int]) -> None:
    """The exact order: lock the queue's usage row first, then pick and lease under it."""
    (usage,) = await tx.raw_rows(_USAGE_OF.format(now="NULL", ids="?") + tx.for_update, (queue_id,),
                                 datetimes=("rate_window_start", "permits_freed_at"))
    # Re-read the controls under the usage lock: a configure that committed meanwhile counts.
    (q,) = await tx.raw_rows(_CONTROLS_OF.format(ids="?"), (queue_id,))
    if q["paused"]:
        return
    # The clock after the lock: every lease whose permit is reused here ended before it.
    now = await tx.refresh_now()
    grant = _grant_size(commands, q, usage, now)
    if grant <= 0:
        return
    # The usage row is held: claims take turns, so a plain indexed read is enough, and the
    # UPDATE re-checks WAITING: a task a cancel or sweep changed meanwhile is simply not taken.
    candidates = await tx.raw_rows(_PICK.format(now="?"), (queue_id, now, grant), datetimes=TASK_TIMES)
    if not candidates:
        return
    ids = [t["id"] for t in candidates]
    taken = await tx.raw(
        f"UPDATE tasks SET state = 'LEASED', updated_at = ? WHERE id IN ({placeholders(len(ids))}) "
        "AND state = 'WAITING'", (now, *ids),
    )
    if taken != len(ids):
        leased = {r["id"] for r in await tx.raw_rows(
            f"SELECT id FROM tasks WHERE id IN ({placeholders(len(ids))}) AND state = 'LEASED'", ids)}
        candidates = [t for t in candidates if t["id"] in leased]
        if not candidates:
            return
    changes = await _write_leases(tx, queue_id, commands, slots, replies, candidates, now, defer_receipts=False)
    await changes.apply(tx)


async def _write_leases(tx: Tx, queue_id: str, commands: list[ClaimCommand], slots: list[int], replies: list[Any],
                        candidates: list[dict[str, Any]], now: datetime, *, defer_receipts: bool) -> UsageChanges:
    """Share `candidates` among `commands` in arrival order: lease rows, events, claim receipts
    and each command's reply; returns the usage changes (not yet applied)."""
    lease_rows = []
    events = []
    receipts = []
    changes = UsageChanges()
    pos = 0
    for slot, c in zip(slots, commands):
        mine, pos = candidates[pos : pos + c.max_tasks], pos + c.max_tasks
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
            lease_rows.append(lease)
            granted.append(lease_json(lease, t, orjson.Fragment(t["payload"])))
            changes.add(queue_id, t["application_id"], permits=1, reserved=1)
            events.append(_task_event(t, "task.leased", states.LEASED, lease_id=lease["id"], attempt=lease["attempt"]))
        receipts.append((who.principal.credential_id, c.msg_id, _claim_receipt(granted, c.lease_ms), now))
        replies[slot] = ok(tasks=granted)
    cols = list(lease_rows[0])
    await tx.defer_many(
        f"INSERT INTO leases ({', '.join(cols)}) VALUES ({placeholders(len(cols))})",
        [[lr[c] for c in cols] for lr in lease_rows],
    )
    await emit_many(tx, events)
    receipts_sql = "INSERT INTO worker_claims (credential_id, msg_id, response, created_at) VALUES (?, ?, ?, ?)"
    if defer_receipts:
        # They travel in the round trip that finally locks the usage rows.
        await tx.defer_many(receipts_sql, receipts)
        return changes
    try:
        await tx.raw_many(receipts_sql, receipts)
    except Exception as exc:
        if is_duplicate_key(exc):  # the same message id is being claimed elsewhere: replay it
            raise RetryTransaction() from exc
        raise
    return changes


async def _retime(tx: Tx, commands: list[ClaimCommand], slots: list[int], replies: list[Any], now: datetime) -> None:
    """Move the leases a claim just wrote to `now`, in the same transaction (their receipts
    refer to the lease rows, so they follow)."""
    by_expiry: dict[datetime, list[str]] = {}
    for slot, c in zip(slots, commands):
        granted = (replies[slot] or {}).get("tasks")
        if not granted:
            continue
        expires = now + timedelta(milliseconds=c.lease_ms)
        for g in granted:
            g["lease_expires_at"] = format_ts(expires)
            by_expiry.setdefault(expires, []).append(g["lease_id"])
    for expires, ids in by_expiry.items():
        await tx.defer(f"UPDATE leases SET leased_at = ?, expires_at = ? WHERE id IN ({placeholders(len(ids))})",
                       (now, expires, *ids))


def _claim_receipt(granted: list[dict[str, Any]], lease_ms: int) -> str:
    """What a claim's receipt keeps to answer a resent claim: its leases' ids, in order, and
    their length. Everything else a lease tells the worker is on its lease row (which keeps
    the claim time) and its task row (immutable fields), so it is read back from them."""
    return orjson.dumps({"leases": [g["lease_id"] for g in granted], "lease_ms": lease_ms}).decode()


async def _replay_claim(tx: Tx, response: str) -> list[dict[str, Any]]:
    """The leases a claim granted, as it answered them (receipts from before `_claim_receipt`
    carry the leases without their payloads)."""
    stored = orjson.loads(response)
    if isinstance(stored, list):
        await _rehydrate_payloads(tx, stored)
        return stored
    ids = stored["leases"]
    rows = await tx.raw_rows(
        "SELECT l.id, l.attempt, l.leased_at, t.id AS task_id, t.queue_id, t.priority, t.start_deadline_at, "
        "t.deadline_at, t.resource_keys, t.payload FROM leases l JOIN tasks t ON t.id = l.task_id "
        f"WHERE l.id IN ({placeholders(len(ids))})", ids, datetimes=("leased_at", *TASK_TIMES))
    by_id = {r["id"]: r for r in rows}
    length = timedelta(milliseconds=stored["lease_ms"])
    granted = []
    for lease_id in ids:
        r = by_id[lease_id]
        lease = {"id": lease_id, "attempt": r["attempt"], "expires_at": r["leased_at"] + length}
        granted.append(lease_json(lease, {**r, "id": r["task_id"]}, _j(r["payload"])))
    return granted


async def _rehydrate_payloads(tx: Tx, granted: list[dict[str, Any]]) -> None:
    ids = [g["task_id"] for g in granted]
    if not ids:
        return
    rows = await tx.raw_rows(f"SELECT id, payload FROM tasks WHERE id IN ({placeholders(len(ids))})", ids)
    payloads = {r["id"]: r["payload"] for r in rows}
    for g in granted:
        g["payload"] = _j(payloads.get(g["task_id"]))


# ------------------------------------------------------------------ locking helper


@dataclass
class _Locked:
    """Task and lease rows of a group of commands, locked in the global order."""

    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    also: list[list[dict[str, Any]]] = field(default_factory=list)


TASK_COLS = ("id, namespace_id, application_id, queue_id, state, priority, attempts, max_attempts, retry_policy, "
             "on_lease_lost, start_deadline_at, deadline_at, cancel_requested, cancel_reason, resource_keys")
TASK_TIMES = ("start_deadline_at", "deadline_at")
LEASE_COLS = ("id, task_id, queue_id, application_id, namespace_id, credential_id, state, reserved, attempt, "
              "leased_at, expires_at, started_at, outcome, start_msg_id, start_response, complete_msg_id, "
              "complete_response, late_reports")
LEASE_TIMES = ("leased_at", "expires_at", "started_at")


async def _lock_for_leases(
    tx: Tx, lease_ids: list[str], also: Callable[[list[str]], list[tuple[str, Any]]] | None = None,
    located: dict[str, tuple[str, str]] | None = None,
) -> _Locked:
    """Lock the leases' task rows, then the lease rows (the global order), in one round trip
    after the id lookup; `also` adds reads about the leases' queues to that round trip.

    `located` maps lease ids to their (task id, queue id), which never change: the session
    that granted a lease knows them, and when it knows all of them the lookup round trip is
    skipped (the clock is then read in the lock round trip, after the locks)."""
    ids = sorted(set(lease_ids))
    located = located or {}
    unknown = [i for i in ids if i not in located]
    found = [{"id": i, "task_id": located[i][0], "queue_id": located[i][1]} for i in ids if i in located]
    if unknown:
        rows = await tx.raw_rows(
            f"SELECT id, task_id, queue_id{tx.now_column} FROM leases WHERE id IN ({placeholders(len(unknown))})",
            unknown)
        if rows:
            tx.take_now(rows[0])
        found += rows
    locked = _Locked()
    if not found:
        return locked
    task_ids = sorted({r["task_id"] for r in found})
    lease_ids_found = sorted(r["id"] for r in found)
    reads: list[tuple[str, Any]] = [
        (f"SELECT {TASK_COLS} FROM tasks WHERE id IN ({placeholders(len(task_ids))}) ORDER BY id{tx.for_update}",
         task_ids),
        (f"SELECT {LEASE_COLS} FROM leases WHERE id IN ({placeholders(len(lease_ids_found))}) "
         f"ORDER BY id{tx.for_update}", lease_ids_found),
    ]
    if also is not None:
        reads += also(sorted({r["queue_id"] for r in found}))
    clock = not unknown and tx.is_mysql
    if clock:
        reads.append(("SELECT NOW(6) AS db_now", ()))
    task_rows, lease_rows, *locked.also = await tx.raw_rows_multi(
        reads, datetimes=(*TASK_TIMES, *LEASE_TIMES, "rate_window_start"))
    if clock:
        tx.take_now(locked.also.pop()[0])
    locked.tasks = {r["id"]: r for r in task_rows}
    locked.leases = {r["id"]: r for r in lease_rows}
    for lease in lease_rows:
        if lease["task_id"] not in locked.tasks:
            raise RuntimeError(f"lease {lease['id']} is not on the task its session located it on")
    return locked


def _located(commands: list[Any]) -> dict[str, tuple[str, str]]:
    return {c.lease_id: c.located for c in commands if c.located is not None}


def _lease_current(lease: dict[str, Any], now: datetime) -> bool:
    return lease["state"] in (LEASED, RUNNING) and lease["expires_at"] > now


def _not_current_error(lease: dict[str, Any]) -> dict[str, Any]:
    outcome = lease["outcome"]
    if outcome == "CANCELLED":
        return fail("TASK_CANCELLED", "the task was cancelled")
    if outcome == "START_DEADLINE_EXCEEDED":
        return fail("START_DEADLINE_EXCEEDED", "the task's start deadline passed")
    return fail("LEASE_EXPIRED", "the lease is no longer current")


class _Writes:
    """Row updates of a grouped transaction, flushed after all decisions are made."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str, str, str, dict[str, Any]]] = []
        self.usage = UsageChanges()

    def task(self, task_id: str, **values: Any) -> None:
        self.tasks.setdefault(task_id, {}).update(values)

    def lease(self, lease_id: str, **values: Any) -> None:
        self.leases.setdefault(lease_id, {}).update(values)

    async def flush(self, tx: Tx) -> None:
        await self.flush_rows(tx)
        await self.usage.apply(tx)

    async def flush_rows(self, tx: Tx) -> None:
        """Task, lease and event rows; the usage rows, which every dispatch transaction
        meets on, are written last so that their locks are held the shortest time."""
        await update_many(tx, "tasks", self.tasks)
        await update_many(tx, "leases", self.leases)
        await emit_many(tx, self.events)


def _end_task_failed(w: _Writes, task: dict[str, Any], now: datetime, code: str, message: str) -> None:
    error = {"code": code, "message": message}
    w.task(task["id"], state=states.FAILED, error=orjson.dumps(error).decode(), updated_at=now, finished_at=now)
    w.usage.add(task["queue_id"], task["application_id"], unfinished=-1)
    w.events.append(_task_event(task, "task.failed", states.FAILED, error=error))


def _fail_unstarted(w: _Writes, lease: dict[str, Any], task: dict[str, Any], now: datetime, code: str,
                    message: str) -> None:
    """A leased task whose deadline passed before its Start: end it FAILED, free permit and reservation."""
    _end_task_failed(w, task, now, code, message)
    w.lease(lease["id"], state=ENDED, ended_at=now, outcome=code, reserved=False)
    w.usage.add(lease["queue_id"], task["application_id"], permits=-1, reserved=-1 if lease["reserved"] else 0)
    lease.update(state=ENDED, outcome=code)


# ------------------------------------------------------------------ start


@dataclass(frozen=True)
class StartCommand:
    credential_id: str
    msg_id: str
    lease_id: str
    located: tuple[str, str] | None = None  # (task id, queue id) when the session granted the lease


async def start(db: Database, commands: list[StartCommand]) -> list[dict[str, Any]]:
    """Authorize Starts; a refused Start (rate, pause) writes nothing.

    The queue's usage row is every dispatch transaction's meeting point, so it is
    locked *last*: decisions are planned on an unlocked read of the rate window,
    the task, lease and event rows are written, and only then is the window locked
    and the plan re-checked against it. If the window moved so that the plan no
    longer holds, the transaction is rolled back and re-run with the window locked
    first (the exact, slower order). A plan that refuses anything on the snapshot
    is re-decided under the lock before anything is written.
    """
    return await lock_last(db, lambda tx, optimistic: _start_body(tx, commands, optimistic=optimistic))


def _windows_sql(queue_ids: list[str], lock: str = "") -> tuple[str, Any]:
    return ("SELECT queue_id, rate_window_start, rate_window_used, rate_reserved FROM queue_usage "
            f"WHERE queue_id IN ({placeholders(len(queue_ids))}) ORDER BY queue_id{lock}", queue_ids)


def _as_windows(rows: list[dict[str, Any]]) -> dict[str, RateWindow]:
    return {r["queue_id"]: RateWindow(r["rate_window_start"], int(r["rate_window_used"]), int(r["rate_reserved"]))
            for r in rows}


async def _read_windows(tx: Tx, queue_ids: list[str], *, lock: bool) -> dict[str, RateWindow]:
    if not queue_ids:
        return {}
    sql, params = _windows_sql(queue_ids, tx.for_update if lock else "")
    return _as_windows(await tx.raw_rows(sql, params, datetimes=("rate_window_start",)))


@dataclass
class _StartPlan:
    replies: list[dict[str, Any]]
    writes: _Writes
    counted: dict[str, list[bool]]  # queue id -> `reserved` of each Start counted in its window, in order
    rate_limited: bool


def _plan_starts(commands: list[StartCommand], locked: _Locked, controls: dict[str, Any],
                 windows: dict[str, RateWindow], now: datetime) -> _StartPlan:
    w = _Writes()
    replies: list[dict[str, Any]] = []
    counted: dict[str, list[bool]] = {}
    rate_limited = False
    leases_ = {k: dict(v) for k, v in locked.leases.items()}
    tasks_ = {k: dict(v) for k, v in locked.tasks.items()}
    windows = dict(windows)
    for c in commands:
        lease = leases_.get(c.lease_id)
        if lease is None or lease["credential_id"] != c.credential_id:
            replies.append(fail("NOT_FOUND", "no such lease for this credential"))
            continue
        if lease["start_msg_id"] == c.msg_id:
            replies.append(ok(**orjson.loads(lease["start_response"])))
            continue
        if lease["state"] == RUNNING:
            replies.append(fail("STATE_CONFLICT", "the lease was already started by another message"))
            continue
        if not _lease_current(lease, now):
            replies.append(_not_current_error(lease))
            continue
        task = tasks_[lease["task_id"]]
        qid = lease["queue_id"]
        if (task["start_deadline_at"] is not None and start_deadline_applies(states.LEASED, int(task["attempts"]))
                and task["start_deadline_at"] <= now):
            _fail_unstarted(w, lease, task, now, "START_DEADLINE_EXCEEDED", "the start deadline passed before any start")
            replies.append(fail("START_DEADLINE_EXCEEDED", "the task's start deadline passed"))
            continue
        if task["deadline_at"] is not None and task["deadline_at"] <= now:
            _fail_unstarted(w, lease, task, now, "DEADLINE_EXCEEDED", "the total deadline passed before the start")
            replies.append(fail("LEASE_EXPIRED", "the task's total deadline passed; it ended FAILED"))
            continue
        if controls[qid]["paused"]:
            replies.append(fail("QUEUE_PAUSED", "the queue is paused; retry within the lease", 1000))
            continue
        reserved = bool(lease["reserved"])
        decision = authorize_start(windows[qid], int(controls[qid]["rate_per_second"]), now, reserved=reserved)
        if not decision.allowed:
            rate_limited = True
            replies.append(fail("RATE_LIMITED", "the queue's Start rate is exhausted for this window",
                                decision.retry_after_ms))
            continue
        windows[qid] = decision.window
        counted.setdefault(qid, []).append(reserved)
        w.usage.set_window(qid, decision.window)
        if reserved:
            w.usage.add(qid, task["application_id"], reserved=-1)
        attempt = int(task["attempts"]) + 1
        receipt = {
            "attempt": attempt,
            "started_at": format_ts(now),
            "start_receipt_id": new_id(),
            "deadline_at": format_ts(task["deadline_at"]),
            "lease_expires_at": format_ts(lease["expires_at"]),
        }
        w.task(task["id"], state=states.RUNNING, attempts=attempt, updated_at=now)
        w.lease(lease["id"], state=RUNNING, started_at=now, attempt=attempt, reserved=False,
                start_msg_id=c.msg_id, start_response=orjson.dumps(receipt).decode())
        lease.update(state=RUNNING, start_msg_id=c.msg_id, start_response=orjson.dumps(receipt).decode(),
                     reserved=False)
        task.update(attempts=attempt)
        w.events.append(_task_event(task, "task.started", states.RUNNING, attempt=attempt, lease_id=lease["id"]))
        replies.append(ok(**receipt))
    return _StartPlan(replies, w, counted, rate_limited)


def _recount(window: RateWindow, rate: int, now: datetime, reserved: list[bool]) -> RateWindow | None:
    """The window after counting these Starts on the locked row, or None if one no longer fits."""
    if window.start is not None and window.start > now:
        return None  # opened by a transaction with a later clock: only the locked order is exact
    for r in reserved:
        decision = authorize_start(window, rate, now, reserved=r)
        if not decision.allowed:
            return None
        window = decision.window
    return window


async def _start_body(tx: Tx, commands: list[StartCommand], *, optimistic: bool) -> list[dict[str, Any]]:
    def queue_reads(queue_ids: list[str]) -> list[tuple[str, Any]]:
        return [_windows_sql(queue_ids, "" if optimistic else tx.for_update),
                (f"SELECT id, paused, rate_per_second FROM queues WHERE id IN ({placeholders(len(queue_ids))})",
                 queue_ids)]

    locked = await _lock_for_leases(tx, [c.lease_id for c in commands], queue_reads, _located(commands))
    queue_ids = sorted({locked.leases[c.lease_id]["queue_id"] for c in commands if c.lease_id in locked.leases})
    windows, controls = {}, {}
    if locked.also:
        windows = _as_windows(locked.also[0])
        controls = {r["id"]: r for r in locked.also[1]}
    # Locked first, the clock must be read after the lock; planning on a snapshot, the first read's clock will do.
    now = await (tx.now() if optimistic else tx.refresh_now())
    plan = _plan_starts(commands, locked, controls, windows, now)
    if not optimistic:
        await plan.writes.flush(tx)
        return plan.replies
    if plan.rate_limited:
        # A refusal must be exact: decide again with the windows locked (nothing is written yet).
        windows = await _read_windows(tx, queue_ids, lock=True)
        now = await tx.refresh_now()
        plan = _plan_starts(commands, locked, controls, windows, now)
        await plan.writes.flush(tx)
        return plan.replies
    await plan.writes.flush_rows(tx)
    if plan.counted and tx.is_mysql and tx.deferring:
        # The windows count the Starts in the UPDATEs that travel with the COMMIT: no round trip
        # holds the usage rows. If one no longer has room, the Starts are decided again, locked first.
        tx.error_means(BAD_NULL, PlanNoLongerHolds)
        for qid, reserved in plan.counted.items():
            plan.writes.usage.count_starts(qid, len(reserved), int(controls[qid]["rate_per_second"]), now)
    elif plan.counted:
        current = await _read_windows(tx, sorted(plan.counted), lock=True)
        for qid, reserved in plan.counted.items():
            window = _recount(current[qid], int(controls[qid]["rate_per_second"]), now, reserved)
            if window is None:
                raise PlanNoLongerHolds()
            plan.writes.usage.set_window(qid, window)
    await plan.writes.usage.apply(tx)
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


async def renew(db: Database, commands: list[RenewCommand]) -> list[dict[str, Any]]:
    """Extend current leases (never beyond MAX_LEASE_MS from now); report cancel requests."""

    async def body(tx: Tx) -> list[dict[str, Any]]:
        ids = sorted({c.lease_id for c in commands})
        rows = {r["id"]: r for r in await tx.raw_rows(
            "SELECT id, task_id, credential_id, state, expires_at, outcome FROM leases "
            f"WHERE id IN ({placeholders(len(ids))}) ORDER BY id{tx.for_update}", ids, datetimes=("expires_at",),
        )}
        task_ids = sorted({r["task_id"] for r in rows.values()})
        cancel = {r["id"]: bool(r["cancel_requested"]) for r in await tx.raw_rows(
            f"SELECT id, cancel_requested FROM tasks WHERE id IN ({placeholders(len(task_ids))})", task_ids,
        )} if task_ids else {}
        now = await tx.now()
        replies = []
        extended: dict[str, dict[str, Any]] = {}
        for c in commands:
            lease = rows.get(c.lease_id)
            if lease is None or lease["credential_id"] != c.credential_id:
                replies.append(fail("NOT_FOUND", "no such lease for this credential"))
                continue
            if not _lease_current(lease, now):
                replies.append(_not_current_error(lease))
                continue
            expires = now + timedelta(milliseconds=min(c.lease_ms, MAX_LEASE_MS))
            extended[lease["id"]] = {"expires_at": expires}
            if c.session_id is not None:
                # A worker that reconnected elsewhere renews from its new session: pushes follow it.
                extended[lease["id"]].update(session_id=c.session_id, server_node_id=c.server_node_id)
            lease["expires_at"] = expires
            replies.append(ok(lease_expires_at=format_ts(expires), cancel_requested=cancel.get(lease["task_id"], False)))
        await update_many(tx, "leases", extended)
        return replies

    return await db.fast_transaction(body)


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


def _retry_or_fail(
    w: _Writes, task: dict[str, Any], now: datetime, *, retryable: bool, code: str, message: str
) -> dict[str, Any]:
    """A failed attempt: back to WAITING with backoff while budget and deadline allow, else FAILED."""
    attempts = int(task["attempts"])
    policy = orjson.loads(task["retry_policy"])
    if retryable and not task["cancel_requested"] and attempts < int(task["max_attempts"]):
        next_at = now + timedelta(milliseconds=backoff_ms(policy, attempts))
        if task["deadline_at"] is None or next_at < task["deadline_at"]:
            error = {"code": code, "message": message}
            w.task(task["id"], state=states.WAITING, available_at=next_at, error=orjson.dumps(error).decode(),
                   updated_at=now)
            w.events.append(_task_event(task, "task.retry_scheduled", states.WAITING, attempt=attempts,
                                        next_available_at=format_ts(next_at), error=error))
            return {"task_state": states.WAITING, "next_available_at": format_ts(next_at)}
        _end_task_failed(w, task, now, "DEADLINE_EXCEEDED", f"no retry fits before the deadline; last error: {message}")
        return {"task_state": states.FAILED}
    if retryable and not task["cancel_requested"]:
        _end_task_failed(w, task, now, "ATTEMPTS_EXHAUSTED", f"attempt budget used up; last error: {message}")
    else:
        _end_task_failed(w, task, now, code, message)
    return {"task_state": states.FAILED}


async def complete(db: Database, commands: list[CompleteCommand]) -> list[dict[str, Any]]:
    """Record outcomes (and releases). Reports for leases no longer current are late evidence."""

    async def body(tx: Tx) -> list[dict[str, Any]]:
        locked = await _lock_for_leases(tx, [c.lease_id for c in commands], located=_located(commands))
        now = await tx.now()
        w = _Writes()
        replies = []
        for c in commands:
            lease = locked.leases.get(c.lease_id)
            if lease is None or lease["credential_id"] != c.credential_id:
                replies.append(fail("NOT_FOUND", "no such lease for this credential"))
                continue
            if lease["complete_msg_id"] == c.msg_id:
                replies.append(orjson.loads(lease["complete_response"]))
                continue
            task = locked.tasks[lease["task_id"]]
            if c.outcome == "release":
                replies.append(_release(w, lease, task, c, now))
                continue
            if lease["state"] == LEASED and _lease_current(lease, now):
                replies.append(fail("STATE_CONFLICT", "the lease was not started; report needs a Start first"))
                continue
            if lease["state"] != RUNNING or lease["expires_at"] <= now:
                late = orjson.loads(lease["late_reports"]) if lease["late_reports"] else []
                if len(late) < MAX_LATE_REPORTS:
                    late.append({"msg_id": c.msg_id, "outcome": c.outcome, "received_at": format_ts(now),
                                 "error": c.error_message, "result": c.result})
                    w.lease(lease["id"], late_reports=orjson.dumps(late).decode())
                    lease["late_reports"] = orjson.dumps(late).decode()
                replies.append(fail("LEASE_LOST", "the lease is no longer current; the report was kept as late evidence"))
                continue
            qid, aid = lease["queue_id"], task["application_id"]
            w.usage.add(qid, aid, permits=-1)
            error = None
            if c.outcome == "succeeded":
                w.task(task["id"], state=states.SUCCEEDED, result=orjson.dumps(c.result).decode(), updated_at=now,
                       finished_at=now, error=None)
                w.usage.add(qid, aid, unfinished=-1)
                w.events.append(_task_event(task, "task.succeeded", states.SUCCEEDED, attempt=lease["attempt"]))
                answer = {"task_state": states.SUCCEEDED}
                outcome = "SUCCEEDED"
            elif c.outcome == "cancelled" and task["cancel_requested"] and task["deadline_at"] is not None \
                    and task["deadline_at"] <= now:
                _end_task_failed(w, task, now, "DEADLINE_EXCEEDED", "the total deadline passed; the worker stopped")
                answer = {"task_state": states.FAILED}
                outcome = "CANCELLED"
            elif c.outcome == "cancelled" and task["cancel_requested"]:
                w.task(task["id"], state=states.CANCELLED, updated_at=now, finished_at=now)
                w.usage.add(qid, aid, unfinished=-1)
                w.events.append(_task_event(task, "task.cancelled", states.CANCELLED, reason=task["cancel_reason"]))
                answer = {"task_state": states.CANCELLED}
                outcome = "CANCELLED"
            else:
                if c.outcome == "cancelled":
                    message, retryable = "the worker reported cancelled without a cancel request", False
                else:
                    message, retryable = (c.error_message or "handler failed"), c.retryable
                error = {"code": "HANDLER_ERROR", "message": message}
                answer = _retry_or_fail(w, task, now, retryable=retryable, code="HANDLER_ERROR", message=message)
                outcome = "FAILED"
            reply = ok(**answer)
            w.lease(lease["id"], state=ENDED, ended_at=now, outcome=outcome,
                    error=orjson.dumps(error).decode() if error else None,
                    complete_msg_id=c.msg_id, complete_response=orjson.dumps(reply).decode())
            lease.update(state=ENDED, complete_msg_id=c.msg_id, complete_response=orjson.dumps(reply).decode())
            replies.append(reply)
        await w.flush(tx)
        return replies

    return await db.fast_transaction(body)


def _release(w: _Writes, lease: dict[str, Any], task: dict[str, Any], c: CompleteCommand, now: datetime) -> dict[str, Any]:
    if lease["state"] == RUNNING and lease["expires_at"] > now:
        return fail("STATE_CONFLICT", "a started attempt cannot be released; report its outcome")
    if not _lease_current(lease, now):
        return _not_current_error(lease)
    w.task(task["id"], state=states.WAITING, updated_at=now)
    w.usage.add(lease["queue_id"], task["application_id"], permits=-1, reserved=-1 if lease["reserved"] else 0)
    reply = ok(task_state=states.WAITING)
    w.lease(lease["id"], state=ENDED, ended_at=now, outcome="RELEASED", reserved=False,
            complete_msg_id=c.msg_id, complete_response=orjson.dumps(reply).decode())
    lease.update(state=ENDED, outcome="RELEASED", complete_msg_id=c.msg_id, complete_response=orjson.dumps(reply).decode())
    return reply


# ------------------------------------------------------------------ recovery


async def recover_expired_leases(db: Database, batch: int = 200) -> int:
    """Expired LEASED leases give their task back; expired RUNNING ones lose their attempt.

    Every node runs this: candidate tasks are taken with SKIP LOCKED, so nodes
    divide the work and never wait on a task row another transaction holds.
    """

    async def body(tx: Tx) -> int:
        now = await tx.now()
        expired = await tx.all(
            select(leases.c.id, leases.c.task_id).where(leases.c.state.in_((LEASED, RUNNING)), leases.c.expires_at <= now)
            .order_by(leases.c.expires_at).limit(batch)
        )
        if not expired:
            return 0
        task_rows = {r["id"]: dict(r) for r in await tx.all(
            select(tasks).where(tasks.c.id.in_(sorted({e["task_id"] for e in expired})))
            .order_by(tasks.c.id).with_for_update(skip_locked=True)
        )}
        lease_rows = {r["id"]: dict(r) for r in await tx.all(
            select(leases).where(leases.c.id.in_(sorted(e["id"] for e in expired if e["task_id"] in task_rows)))
            .order_by(leases.c.id).with_for_update()
        )} if task_rows else {}
        w = _Writes()
        n = 0
        for lease in lease_rows.values():
            if lease["state"] not in (LEASED, RUNNING) or lease["expires_at"] > now:
                continue
            task = task_rows[lease["task_id"]]
            qid, aid = lease["queue_id"], task["application_id"]
            n += 1
            if lease["state"] == LEASED:
                w.task(task["id"], state=states.WAITING, updated_at=now)
                w.usage.add(qid, aid, permits=-1, reserved=-1 if lease["reserved"] else 0)
                w.lease(lease["id"], state=ENDED, ended_at=now, outcome="EXPIRED", reserved=False, push_pending=True)
                continue
            error = {"code": "LEASE_LOST", "message": "the lease expired while the attempt was running"}
            w.lease(lease["id"], state=ENDED, ended_at=now, outcome="LEASE_LOST", error=orjson.dumps(error).decode(),
                    push_pending=True)
            w.usage.add(qid, aid, permits=-1)
            w.events.append(_task_event(task, "task.lease_lost", task["state"], attempt=lease["attempt"],
                                        lease_id=lease["id"]))
            if task["on_lease_lost"] == "retry":
                _retry_or_fail(w, task, now, retryable=True, code="LEASE_LOST", message=error["message"])
            else:
                w.task(task["id"], state=states.NEEDS_REVIEW, error=orjson.dumps(error).decode(), updated_at=now)
                w.events.append(_task_event(task, "task.needs_review", states.NEEDS_REVIEW, attempt=lease["attempt"]))
        await w.flush(tx)
        return n

    if not await db.any_row("SELECT 1 FROM leases WHERE state IN ('LEASED', 'RUNNING') AND expires_at <= {now} LIMIT 1"):
        return 0
    return await db.transaction(body)


# ------------------------------------------------------------------ attempts


def attempt_json(lease: Any) -> dict[str, Any]:
    outcome = "RUNNING" if lease["state"] == RUNNING else (lease["outcome"] or "RUNNING")
    return {
        "number": int(lease["attempt"]),
        "node_id": lease["worker_node_id"],
        "worker_session_id": lease["session_id"],
        "leased_at": format_ts(lease["leased_at"]),
        "started_at": format_ts(lease["started_at"]),
        "ended_at": format_ts(lease["ended_at"]),
        "outcome": outcome,
        "error": _j(lease["error"]),
        "late_reports": _j(lease["late_reports"]) or [],
    }


async def list_attempts(tx: Tx, task_id: str, *, limit: int, after_number: int | None) -> list[dict[str, Any]]:
    stmt = (
        select(leases).where(leases.c.task_id == task_id, leases.c.started_at.is_not(None))
        .order_by(leases.c.attempt).limit(limit + 1)
    )
    if after_number is not None:
        stmt = stmt.where(leases.c.attempt > after_number)
    return [attempt_json(r) for r in await tx.all(stmt)]
