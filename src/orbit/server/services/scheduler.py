"""Schedule generation: every node's loop turns due trigger points into tasks or SKIPPED
records, exactly once per point.

A batch locks due schedules with SKIP LOCKED (one node advances a schedule at a time),
walks each one's points from its cursor up to now (at most 1000), decides each point
(`core.schedule_time.decide`: misfire, overlap), and in one transaction inserts the
tasks (identity: schedule id + trigger point, a unique index), the run records, the
events and the new cursors. Generated tasks take backlog slots like submits: a point
that meets a full queue or application stops its schedule's batch and stays the cursor,
with no task and no record, to be decided again on a later tick.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from ..core import states
from ..core.deadlines import next_sweep
from ..core.ids import new_id
from ..core.schedule_time import (
    MAX_POINTS_PER_BATCH,
    SUBMIT,
    Timing,
    decide,
    due_points,
    next_point,
    relative_deadline,
)
from ..core.timefmt import format_ts
from ..errors import DomainError
from ..store.db import Database
from ..store.queries import key_permits as key_q
from ..store.queries import schedule_runs as run_q
from ..store.queries import tasks as task_q
from ..store.queries import usage as usage_q
from ..store.queries.usage import UsageChanges
from ..store.tx import Tx
from . import metrics
from .outbox import Event, emit_many
from .tasks import DEFAULT_RETRY, NamedKeys

SCHEDULES_PER_BATCH = 500
TICK_BUDGET_S = 3.0  # a tick goes on while full batches come back, for at most this long
UNFINISHED = frozenset({states.WAITING, states.LEASED, states.RUNNING, states.NEEDS_REVIEW})


def timing_of(row: Any) -> Timing:
    return Timing(row["cron"], int(row["interval_seconds"]) if row["interval_seconds"] is not None else None,
                  row["timezone"], row["start_at"], row["end_at"], row["anchor_at"])


async def run_once(db: Database) -> int:
    """Handle the due points of every due schedule this node can lock; returns the points handled."""
    handled = 0
    started = time.monotonic()
    while time.monotonic() - started < TICK_BUDGET_S:
        if not await db.any_row(run_q.any_due()):
            break
        n, full, created = await db.lock_last(lambda tx, optimistic: _batch(tx, optimistic=optimistic))
        metrics.submitted(created)
        handled += n
        if not full or n == 0:
            break
    return handled


@dataclass
class _Room:
    """Backlog room left in each queue and application as this batch takes it."""

    queues: dict[str, int] = field(default_factory=dict)
    apps: dict[str, int] = field(default_factory=dict)

    def take(self, queue_id: str, application_id: str) -> bool:
        if self.queues[queue_id] <= 0 or self.apps[application_id] <= 0:
            return False
        self.queues[queue_id] -= 1
        self.apps[application_id] -= 1
        return True


async def _batch(tx: Tx, *, optimistic: bool) -> tuple[int, bool, int]:
    """One transaction: the due schedules it could lock, each advanced as far as it may go.
    Returns (points handled, whether the batch was full, tasks generated)."""
    due = await tx.rows(run_q.lock_due(SCHEDULES_PER_BATCH))
    if not due:
        return 0, False, 0
    tx.adopt_clock(due[0])
    now = await tx.now()
    room = await _room(tx, due, locked=not optimistic)
    previous = await _previous_states(tx, due)
    keys = await _named_keys(tx, due)
    tasks: list[dict[str, Any]] = []
    runs: list[tuple[Any, ...]] = []
    events: list[Event] = []
    usage = UsageChanges()
    handled = 0
    for s in due:
        handled += _advance(s, now, room, previous, keys, tasks, runs, events, usage)
    if tasks:
        await task_q.insert(tx, tasks)
        for t in tasks:
            if t["parked_on"] is None and t["available_at"] <= now:
                tx.work_in(t["queue_id"], 1)  # the claims waiting here take it at once
    await run_q.insert_runs(tx, runs)
    await emit_many(tx, events)
    for s in due:
        await tx.defer(run_q.advance(s["id"], next_trigger_at=s["next_trigger_at"], due_at=s["next_trigger_at"],
                                     last_trigger_at=s["last_trigger_at"], last_task_id=s["last_task_id"]))
    await _take_slots(tx, tasks, usage)
    return handled, len(due) == SCHEDULES_PER_BATCH, len(tasks)


async def _room(tx: Tx, due: list[dict[str, Any]], *, locked: bool) -> _Room:
    """The backlog room of the schedules' queues and applications: an unlocked snapshot when
    planning (the guarded UPDATEs decide at the commit), exact under the usage rows' locks."""
    room = _Room()
    pairs = sorted({(s["queue_id"], s["application_id"]) for s in due})
    if locked:
        queue_ids = sorted({q for q, _ in pairs})
        app_ids = sorted({a for _, a in pairs})
        reads = [usage_q.queue_unfinished(q, lock=True) for q in queue_ids]
        reads += [usage_q.application_usage_unfinished(a, lock=True) for a in app_ids]
        reads += [usage_q.backlog(q, a) for q, a in pairs]
        results = await tx.rows_multi(reads)
        rows = results[len(queue_ids) + len(app_ids):]
    else:
        rows = await tx.rows_multi([usage_q.backlog(q, a) for q, a in pairs])
    for (q, a), (b,) in zip(pairs, rows, strict=True):
        room.queues[q] = int(b["queue_limit"]) - int(b["queue_unfinished"])
        room.apps[a] = int(b["app_limit"]) - int(b["app_unfinished"])
    return room


async def _previous_states(tx: Tx, due: list[dict[str, Any]]) -> dict[str, str]:
    """The state of each overlap-skipping schedule's previous task."""
    ids = sorted({s["last_task_id"] for s in due if s["overlap"] != "allow" and s["last_task_id"]})
    if not ids:
        return {}
    return {r["id"]: r["state"] for r in await tx.rows(run_q.task_states(ids))}


async def _named_keys(tx: Tx, due: list[dict[str, Any]]) -> dict[str, NamedKeys]:
    """Per namespace, the resource keys the templates name (share-locked, as a submit reads them)."""
    names: dict[str, set[str]] = {}
    for s in due:
        template = orjson.loads(s["task"])
        s["_template"] = template
        if template.get("resource_keys"):
            names.setdefault(s["namespace_id"], set()).update(template["resource_keys"])
    out: dict[str, NamedKeys] = {}
    for ns, wanted in sorted(names.items()):
        named = sorted(wanted)
        shared, rooms = await tx.rows_multi([key_q.share_named(ns, named), key_q.rooms_named(ns, named)])
        out[ns] = NamedKeys(shared, rooms)
    return out


def _advance(s: dict[str, Any], now: datetime, room: _Room, previous: dict[str, str], keys: dict[str, NamedKeys],
             tasks: list[dict[str, Any]], runs: list[tuple[Any, ...]], events: list[Event],
             usage: UsageChanges) -> int:
    """Decide the schedule's due points and write what they become into the batch; updates the
    row's cursor fields in place. Returns the points handled."""
    timing = timing_of(s)
    points = due_points(timing, s["next_trigger_at"], now)
    unfinished = s["overlap"] != "allow" and previous.get(s["last_task_id"] or "") in UNFINISHED
    later = next_point(timing, points[-1]) if len(points) == MAX_POINTS_PER_BATCH else None
    decisions = decide(points, now, policy=s["misfire_policy"], window_s=int(s["catch_up_window_seconds"]),
                       overlap=s["overlap"], previous_unfinished=unfinished,
                       more_due=later is not None and later <= now)
    handled = 0
    for d in decisions:
        if d.action == SUBMIT:
            try:
                row = _task_row(s, d.trigger_at, now, keys.get(s["namespace_id"]) or NamedKeys([], []))
            except DomainError:
                break  # a template key was retired meanwhile: the point waits like a full queue's
            if not room.take(s["queue_id"], s["application_id"]):
                break  # backpressure: this point stays the cursor
            tasks.append(row)
            usage.count_keys(task_q.resource_key_ids(row), unfinished=1)
            runs.append((s["id"], d.trigger_at, "SUBMITTED", row["id"], None, now))
            events.append((s["namespace_id"], "task.submitted", "task", row["id"],
                           {"task_id": row["id"], "queue_id": s["queue_id"], "state": states.WAITING,
                            "priority": row["priority"], "schedule_id": s["id"]}))
            s["last_task_id"] = row["id"]
        else:
            runs.append((s["id"], d.trigger_at, "SKIPPED", None, d.reason, now))
            events.append((s["namespace_id"], "schedule.point_skipped", "schedule", s["id"],
                           {"schedule_id": s["id"], "trigger_at": format_ts(d.trigger_at),
                            "reason": d.reason}))
        s["last_trigger_at"] = d.trigger_at
        handled += 1
    if handled:
        s["next_trigger_at"] = next_point(timing, s["last_trigger_at"])
    return handled


def _task_row(s: dict[str, Any], trigger_at: datetime, now: datetime, keys: NamedKeys) -> dict[str, Any]:
    """A generated task: the template's frozen policy, due at its trigger point, with the
    template's deadlines counted from it."""
    t = s["_template"]
    key_ids, parked_on = keys.resolve(list(t.get("resource_keys") or []))
    deadline_at = relative_deadline(trigger_at, t.get("deadline_seconds"))
    start_deadline_at = relative_deadline(trigger_at, t.get("start_deadline_seconds"))
    return {
        "id": new_id(), "namespace_id": s["namespace_id"], "application_id": s["application_id"],
        "queue_id": s["queue_id"], "schedule_id": s["id"], "trigger_at": trigger_at, "state": states.WAITING,
        "payload": orjson.dumps(t.get("payload")).decode(), "priority": int(t.get("priority", 0)),
        "resource_keys": orjson.dumps(list(t.get("resource_keys") or [])).decode(),
        "max_attempts": int(t.get("max_attempts", 3)),
        "attempts": 0, "retry_policy": orjson.dumps(t.get("retry") or DEFAULT_RETRY).decode(),
        "on_lease_lost": t.get("on_lease_lost") or "review", "available_at": trigger_at,
        "start_deadline_at": start_deadline_at, "deadline_at": deadline_at, "cancel_requested": False,
        "cancel_reason": None, "sweep_at": next_sweep(states.WAITING, 0, deadline_at, start_deadline_at, False),
        "result": None, "error": None, "created_at": now, "updated_at": now, "finished_at": None,
        "resource_key_ids": orjson.dumps(key_ids).decode() if key_ids else None, "parked_on": parked_on,
        "traceparent": None,
    }


async def _take_slots(tx: Tx, tasks: list[dict[str, Any]], usage: UsageChanges) -> None:
    """The generated tasks' backlog slots (guarded like a submit's), then the keys' counts,
    written last: the usage rows are locked until the commit only."""
    per_queue: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for t in tasks:
        per_queue.setdefault((t["queue_id"], t["application_id"]), []).append(t)
    for (qid, aid), mine in sorted(per_queue.items()):
        levels = 0
        for t in mine:
            levels |= 1 << int(t["priority"])
        refused = await usage_q.take_backlog_slots(tx, qid, aid, len(mine), levels)
        if refused is not None:
            raise AssertionError(f"backlog slots planned under the lock were refused ({refused})")
    await usage.apply(tx)
