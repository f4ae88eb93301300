"""Schedule management: create, read, list, configure, retire, and the run records.

The scheduler advances a schedule's cursor (`next_trigger_at`, `due_at`, `last_trigger_at`)
without a revision; this module sets the cursor only where the timing is defined: at creation,
and by a configure that changes it. `due_at` is the scheduler's index: the cursor while the
schedule generates, null while it is paused or retired.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson

from ...models import ConfigureScheduleRequest, CreateScheduleRequest, RetireScheduleRequest, TaskTemplate
from ..core import json_values
from ..core.ids import is_id, new_id
from ..core.permissions import ALL_QUEUES
from ..core.schedule_time import Timing, cron_error, first_point, next_point, timezone_error
from ..core.timefmt import format_ts, parse_rfc3339
from ..errors import DomainError, invalid_argument, not_found, stale_revision, state_conflict
from ..store.db import Database
from ..store.queries import key_permits as key_q
from ..store.queries import queues as queue_q
from ..store.queries import schedules as schedule_q
from ..store.tx import Tx
from .auth import Principal
from .idempotency import Outcome, WriteRequest, idempotent_write
from .outbox import emit, write_audit
from .tasks import DEFAULT_RETRY

OP_CREATE = "schedules.create"
OP_CONFIGURE = "schedules.configure"
OP_RETIRE = "schedules.retire"
WHAT = "schedule"

# The fields whose change moves the cursor.
TIMING = ("cron", "interval_seconds", "timezone", "start_at", "end_at")

Body = CreateScheduleRequest | ConfigureScheduleRequest


def schedule_json(row: Any) -> dict[str, Any]:
    """The schedule object of the API; the stored template passes through unparsed."""
    interval = row["interval_seconds"]
    return {
        "id": row["id"],
        "namespace_id": row["namespace_id"],
        "queue_id": row["queue_id"],
        "name": row["name"],
        "paused": bool(row["paused"]),
        "cron": row["cron"],
        "interval_seconds": None if interval is None else int(interval),
        "timezone": row["timezone"],
        "start_at": format_ts(row["start_at"]),
        "end_at": format_ts(row["end_at"]),
        "misfire": {"policy": row["misfire_policy"],
                    "catch_up_window_seconds": int(row["catch_up_window_seconds"])},
        "overlap": row["overlap"],
        "task": orjson.Fragment(row["task"]),
        "next_trigger_at": format_ts(row["next_trigger_at"]),
        "last_trigger_at": format_ts(row["last_trigger_at"]),
        "revision": str(int(row["revision"])),
        "retired_at": format_ts(row["retired_at"]),
        "created_at": format_ts(row["created_at"]),
        "updated_at": format_ts(row["updated_at"]),
    }


def run_json(row: Any) -> dict[str, Any]:
    return {
        "trigger_at": format_ts(row["trigger_at"]),
        "outcome": row["outcome"],
        "task_id": row["task_id"],
        "reason": row["reason"],
        "created_at": format_ts(row["created_at"]),
    }


# ---------------------------------------------------------------- rules of the body


def _instant(text: str | None, field: str) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_rfc3339(text)
    except ValueError as exc:
        raise invalid_argument(f"{field}: {exc}", field) from None


def _template(task: TaskTemplate, payload_limit: int) -> str:
    """The template as stored: the fields given plus a submit's defaults (the whole retry policy)."""
    try:
        json_values.encode(task.payload, payload_limit)
    except json_values.JsonValueError as exc:
        raise invalid_argument(f"task.payload: {exc}", "task.payload") from None
    template = task.model_dump(mode="json")
    retry = template["retry"] = template["retry"] or dict(DEFAULT_RETRY)
    if retry["max_backoff_ms"] < retry["initial_backoff_ms"]:
        raise invalid_argument("task.retry.max_backoff_ms: must be at least task.retry.initial_backoff_ms "
                               "(default 60000)", "task.retry.max_backoff_ms")
    return orjson.dumps(template).decode()


def _settings(req: Body, payload_limit: int) -> dict[str, Any]:
    """The stored columns of what a configure replaces, after the rules a model cannot state:
    one of cron and interval, a valid cron and zone, the bounds in order."""
    if req.cron is None and req.interval_seconds is None:
        raise invalid_argument("cron: give cron or interval_seconds", "cron")
    if req.cron is not None and req.interval_seconds is not None:
        raise invalid_argument("interval_seconds: give cron or interval_seconds, not both", "interval_seconds")
    if req.cron is not None and (error := cron_error(req.cron)):
        raise invalid_argument(error, "cron")
    if error := timezone_error(req.timezone):
        raise invalid_argument(error, "timezone")
    start_at, end_at = _instant(req.start_at, "start_at"), _instant(req.end_at, "end_at")
    if start_at is not None and end_at is not None and end_at <= start_at:
        raise invalid_argument("end_at: must be after start_at", "end_at")
    return {"paused": req.paused, "cron": req.cron, "interval_seconds": req.interval_seconds,
            "timezone": req.timezone, "start_at": start_at, "end_at": end_at,
            "misfire_policy": req.misfire.policy, "catch_up_window_seconds": req.misfire.catch_up_window_seconds,
            "overlap": req.overlap, "task": _template(req.task, payload_limit)}


def _check_keys(names: list[str], rows: list[dict[str, Any]]) -> None:
    """Every key the template names exists in the namespace and is not retired (read share-locked,
    so a key's retire waits for this write)."""
    found = {r["name"]: r for r in rows}
    for name in names:
        row = found.get(name)
        if row is None:
            raise invalid_argument(f"task.resource_keys: unknown resource key {name!r}", "task.resource_keys")
        if row["retired_at"] is not None:
            raise invalid_argument(f"task.resource_keys: the resource key {name!r} is retired", "task.resource_keys")


# ---------------------------------------------------------------- the cursor


def _timing(values: dict[str, Any], now: datetime) -> Timing:
    """Interval points are `anchor_at + k * interval_seconds`: from `start_at` when given (its
    first point), otherwise from now."""
    anchor = values["start_at"] if values["start_at"] is not None else now
    return Timing(values["cron"], values["interval_seconds"], values["timezone"], values["start_at"],
                  values["end_at"], anchor)


def _point(timing: Timing, compute: Callable[[Timing], datetime | None]) -> datetime | None:
    """A trigger point, or 400 when none can be found (a cron date that never comes, such as
    Feb 30, or one past the calendar's end)."""
    try:
        return compute(timing)
    except (ValueError, OverflowError):
        field = "cron" if timing.cron is not None else "start_at"
        raise invalid_argument(f"{field}: no trigger point can be computed from it", field) from None


def _first_cursor(timing: Timing, now: datetime) -> datetime | None:
    """The first trigger point. A schedule never replays points from before it existed: from a
    `start_at` in the past it starts at its first point after now."""
    if timing.start_at is not None and timing.start_at < now:
        return _point(timing, lambda t: next_point(t, now))
    return _point(timing, first_point)


def _due(values: dict[str, Any], next_trigger_at: datetime | None) -> datetime | None:
    return None if values["paused"] else next_trigger_at


# ---------------------------------------------------------------- writes


def _name_taken(name: str) -> DomainError:
    return state_conflict(f"a schedule named {name!r} already exists in this namespace", name=name)


async def _lock_for_change(tx: Tx, principal: Principal, schedule_id: str, expected_revision: str) -> Any:
    """Lock the schedule row and check that it may change: one that is missing, in another
    namespace or whose queue is outside the credential's scope is not found; a retired one takes
    no change; a stale `expected_revision` is refused."""
    if not is_id(schedule_id):
        raise not_found(WHAT)
    row = await tx.one(schedule_q.lock_for_update(principal.namespace_id, schedule_id))
    if row is None or not principal.can_see_queue(row["queue_id"]):
        raise not_found(WHAT)
    if row["retired_at"] is not None:
        raise state_conflict("the schedule is retired", retired_at=format_ts(row["retired_at"]))
    current = int(row["revision"])
    if int(expected_revision) != current:
        raise stale_revision(expected_revision, current, WHAT)
    return row


async def create_schedule(db: Database, w: WriteRequest, req: CreateScheduleRequest, *,
                          payload_limit: int) -> Outcome:
    """Insert the schedule with its first trigger point. The queue row is share-locked, so a queue
    retire (which locks it exclusively) either sees the schedule or is seen as retired here."""
    ns = w.principal.namespace_id
    values = _settings(req, payload_limit)
    names = sorted(set(req.task.resource_keys))

    async def effect(tx: Tx):
        reads = [queue_q.share_for_admission(ns, req.queue_id), schedule_q.name_taken(ns, req.name)]
        if names:
            reads.append(key_q.share_named(ns, names))
        queues, taken, *keys = await tx.rows_multi(reads)
        if not queues:
            raise not_found("queue")
        tx.adopt_clock(queues[0])
        if queues[0]["retired_at"] is not None:
            raise state_conflict("the queue is retired", retired_at=format_ts(queues[0]["retired_at"]))
        if taken:
            raise _name_taken(req.name)
        _check_keys(req.task.resource_keys, keys[0] if keys else [])
        now = await tx.now()
        timing = _timing(values, now)
        cursor = _first_cursor(timing, now)
        row = {"id": new_id(), "namespace_id": ns, "application_id": w.principal.application_id,
               "queue_id": req.queue_id, "name": req.name, **values, "anchor_at": timing.anchor_at,
               "next_trigger_at": cursor, "due_at": _due(values, cursor), "last_trigger_at": None,
               "last_task_id": None, "revision": 1, "retired_at": None, "created_at": now, "updated_at": now}
        if not await schedule_q.insert(tx, row):
            raise _name_taken(req.name)
        snapshot = schedule_json(row)
        await write_audit(tx, w.actor, namespace_id=ns, action="schedule.create", resource_type="schedule",
                          resource_id=row["id"], after=snapshot)
        await emit(tx, namespace_id=ns, type="schedule.created", resource_type="schedule", resource_id=row["id"],
                   data={"schedule": snapshot})
        return {"schedule": snapshot}, row["id"]

    return await idempotent_write(db, w.scope, effect)


async def configure_schedule(db: Database, w: WriteRequest, schedule_id: str, req: ConfigureScheduleRequest, *,
                             payload_limit: int) -> Outcome:
    """Replace every field but the name and the queue, guarded by `expected_revision`. A new
    timing restarts the cursor at its first point after now (points before the change are not
    replayed); otherwise the cursor stays, and resuming lets the misfire policy judge the points
    missed while paused."""
    values = _settings(req, payload_limit)
    names = sorted(set(req.task.resource_keys))

    async def effect(tx: Tx):
        row = await _lock_for_change(tx, w.principal, schedule_id, req.expected_revision)
        if names:
            _check_keys(req.task.resource_keys, await tx.rows(key_q.share_named(row["namespace_id"], names)))
        now = await tx.now()
        changes = dict(values)
        if any(values[c] != row[c] for c in TIMING):
            timing = _timing(values, now)
            changes["anchor_at"] = timing.anchor_at
            changes["next_trigger_at"] = _point(timing, lambda t: next_point(t, now))
        cursor = changes.get("next_trigger_at", row["next_trigger_at"])
        changes.update(due_at=_due(values, cursor), revision=int(row["revision"]) + 1, updated_at=now)
        await tx.defer(schedule_q.configure(schedule_id, changes))
        before, after = schedule_json(row), schedule_json({**row, **changes})
        await write_audit(tx, w.actor, namespace_id=row["namespace_id"], action="schedule.configure",
                          resource_type="schedule", resource_id=schedule_id, reason=req.reason,
                          before=before, after=after)
        await emit(tx, namespace_id=row["namespace_id"], type="schedule.configured", resource_type="schedule",
                   resource_id=schedule_id, data={"schedule": after, "reason": req.reason})
        return {"schedule": after}, schedule_id

    return await idempotent_write(db, w.scope, effect)


async def retire_schedule(db: Database, w: WriteRequest, schedule_id: str, req: RetireScheduleRequest) -> Outcome:
    """Retire the schedule for good: no more generation; it stays readable and keeps its name."""
    async def effect(tx: Tx):
        row = await _lock_for_change(tx, w.principal, schedule_id, req.expected_revision)
        now = await tx.now()
        changes = {"retired_at": now, "updated_at": now, "revision": int(row["revision"]) + 1, "due_at": None}
        await tx.defer(schedule_q.retire(schedule_id, retired_at=now, revision=changes["revision"]))
        before, after = schedule_json(row), schedule_json({**row, **changes})
        await write_audit(tx, w.actor, namespace_id=row["namespace_id"], action="schedule.retire",
                          resource_type="schedule", resource_id=schedule_id, reason=req.reason,
                          before=before, after=after)
        await emit(tx, namespace_id=row["namespace_id"], type="schedule.retired", resource_type="schedule",
                   resource_id=schedule_id, data={"schedule": after, "reason": req.reason})
        return {"schedule": after}, schedule_id

    return await idempotent_write(db, w.scope, effect)


# ---------------------------------------------------------------- reads


async def _visible(tx: Tx, principal: Principal, schedule_id: str) -> Any:
    """The schedule row; a schedule whose queue is outside the credential's scope is not found."""
    if not is_id(schedule_id):
        raise not_found(WHAT)
    row = await tx.one(schedule_q.by_id(principal.namespace_id, schedule_id))
    if row is None or not principal.can_see_queue(row["queue_id"]):
        raise not_found(WHAT)
    return row


async def get_schedule(db: Database, principal: Principal, schedule_id: str) -> dict[str, Any]:
    return schedule_json(await db.read(lambda tx: _visible(tx, principal, schedule_id)))


async def list_schedules(
    db: Database,
    principal: Principal,
    *,
    queue_id: str | None,
    name: str | None,
    include_retired: bool,
    limit: int,
    after_id: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page in creation order (ids are time-ordered) of the schedules whose queue the
    credential sees; returns (items, last id if more)."""
    scope = None if principal.queue_scope == ALL_QUEUES else tuple(principal.queue_scope)
    if scope == ():
        return [], None
    stmt = schedule_q.page(principal.namespace_id, queue_scope=scope, queue_id=queue_id, name=name,
                           include_retired=include_retired, after_id=after_id, limit=limit + 1)
    rows = await db.read(lambda tx: tx.rows(stmt))
    items = [schedule_json(r) for r in rows[:limit]]
    return items, (items[-1]["id"] if len(rows) > limit else None)


async def list_runs(db: Database, principal: Principal, schedule_id: str, *, limit: int,
                    after: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the schedule's run records, oldest trigger point first; the cursor is the last
    trigger point returned."""
    try:
        after_at = None if after is None else parse_rfc3339(after)
    except ValueError:
        raise invalid_argument("cursor is not valid", "cursor") from None

    async def read(tx: Tx):
        await _visible(tx, principal, schedule_id)
        return await tx.rows(schedule_q.runs(schedule_id, after=after_at, limit=limit + 1))

    rows = await db.read(read)
    items = [run_json(r) for r in rows[:limit]]
    return items, (items[-1]["trigger_at"] if len(rows) > limit else None)
