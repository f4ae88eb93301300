"""Queue management: create, read, list, configure (pause/resume), retire.

Live counters live in `queue_usage`, so counter changes never bump a queue's
`revision` or `updated_at`.
"""

from __future__ import annotations

from typing import Any

from ...models import ConfigureQueueRequest, CreateQueueRequest, RetireQueueRequest, configure_controls
from ..core.ids import is_id, new_id
from ..core.timefmt import format_ts
from ..errors import not_found, stale_revision, state_conflict
from ..store.db import Database
from ..store.queries import queues as queue_q
from ..store.queries import usage as usage_q
from ..store.tx import Tx
from .auth import Principal
from .idempotency import Outcome, WriteRequest, idempotent_write
from .outbox import emit, write_audit

DEFAULT_MAX_UNFINISHED_TASKS = 100_000

# Every control of a queue (declared once, by the API's models), with its JSON type.
CONTROLS = configure_controls(ConfigureQueueRequest)


# What a new queue starts with where its create request says nothing: not paused, and the
# create model's defaults.
NEW_QUEUE = {"paused": False, **{name: field.default for name, field in CreateQueueRequest.model_fields.items()
                                 if name in CONTROLS and not field.is_required()}}


def queue_json(row: Any, unfinished: int) -> dict[str, Any]:
    return {
        "id": row["id"],
        "namespace_id": row["namespace_id"],
        "name": row["name"],
        **{name: kind(row[name]) for name, kind in CONTROLS.items()},
        "unfinished_tasks": str(int(unfinished)),
        "revision": str(int(row["revision"])),
        "retired_at": format_ts(row["retired_at"]),
        "created_at": format_ts(row["created_at"]),
        "updated_at": format_ts(row["updated_at"]),
    }


async def lock_queue(tx: Tx, principal: Principal, queue_id: str) -> Any:
    """Lock the queue row, or not found when it is missing, foreign or out of scope."""
    if not is_id(queue_id) or not principal.can_see_queue(queue_id):
        raise not_found("queue")
    row = await tx.one(queue_q.lock_for_update(principal.namespace_id, queue_id))
    if row is None:
        raise not_found("queue")
    return row


async def _unfinished(tx: Tx, queue_id: str, *, lock: bool = False) -> int:
    row = await tx.one(usage_q.queue_unfinished(queue_id, lock=lock))
    return int(row["unfinished"]) if row is not None else 0


async def insert_queue(tx: Tx, *, namespace_id: str, name: str, controls: dict[str, Any]) -> dict[str, Any]:
    """Insert a queue and its usage row; a conflict when the name is taken in the namespace.
    Controls missing from `controls` take their `NEW_QUEUE` values."""
    now = await tx.now()
    if await tx.rows(queue_q.name_taken(namespace_id, name)):
        raise state_conflict(f"a queue named {name!r} already exists in this namespace", name=name)
    values = {**NEW_QUEUE, **controls}
    values["max_unfinished_tasks"] = values["max_unfinished_tasks"] or DEFAULT_MAX_UNFINISHED_TASKS
    row = {"id": new_id(), "namespace_id": namespace_id, "name": name,
           **{c: kind(values[c]) for c, kind in CONTROLS.items()},
           "revision": 1, "retired_at": None, "created_at": now, "updated_at": now}
    if not await queue_q.insert(tx, row):
        raise state_conflict(f"a queue named {name!r} already exists in this namespace", name=name)
    await tx.defer(usage_q.insert_queue_row(row["id"]))
    return queue_json(row, 0)


async def create_queue(db: Database, w: WriteRequest, req: CreateQueueRequest) -> Outcome:
    ns = w.principal.namespace_id

    async def effect(tx: Tx):
        controls = {c: getattr(req, c) for c in CONTROLS if c in req.model_fields_set}
        snapshot = await insert_queue(tx, namespace_id=ns, name=req.name, controls=controls)
        await write_audit(
            tx, w.actor, namespace_id=ns, action="queue.create", resource_type="queue",
            resource_id=snapshot["id"], after=snapshot,
        )
        await emit(
            tx, namespace_id=ns, type="queue.created", resource_type="queue",
            resource_id=snapshot["id"], data={"queue": snapshot},
        )
        return {"queue": snapshot}, snapshot["id"]

    return await idempotent_write(db, w.scope, effect)


def _check_revision(row: Any, expected: str) -> None:
    current = int(row["revision"])
    if int(expected) != current:
        raise stale_revision(expected, current, "queue")


def _check_not_retired(row: Any) -> None:
    if row["retired_at"] is not None:
        raise state_conflict("the queue is retired", retired_at=format_ts(row["retired_at"]))


async def configure_queue(
    db: Database, w: WriteRequest, queue_id: str, req: ConfigureQueueRequest
) -> Outcome:
    async def effect(tx: Tx):
        row = await lock_queue(tx, w.principal, queue_id)
        _check_not_retired(row)
        _check_revision(row, req.expected_revision)
        unfinished = await _unfinished(tx, queue_id)
        before = queue_json(row, unfinished)
        changes = {**{c: getattr(req, c) for c in CONTROLS}, "revision": int(row["revision"]) + 1,
                   "updated_at": await tx.now()}
        await tx.defer(queue_q.configure(queue_id, changes))
        after = queue_json({**row, **changes}, unfinished)
        await write_audit(
            tx, w.actor, namespace_id=row["namespace_id"], action="queue.configure",
            resource_type="queue", resource_id=queue_id, reason=req.reason, before=before, after=after,
        )
        await emit(
            tx, namespace_id=row["namespace_id"], type="queue.configured", resource_type="queue",
            resource_id=queue_id, data={"queue": after, "reason": req.reason},
        )
        return {"queue": after}, queue_id

    return await idempotent_write(db, w.scope, effect)


async def retire_queue(db: Database, w: WriteRequest, queue_id: str, req: RetireQueueRequest) -> Outcome:
    async def effect(tx: Tx):
        row = await lock_queue(tx, w.principal, queue_id)
        _check_not_retired(row)
        _check_revision(row, req.expected_revision)
        # Locking the usage row orders us against concurrent submits.
        unfinished = await _unfinished(tx, queue_id, lock=True)
        if unfinished:
            raise state_conflict(
                "the queue still has unfinished tasks",
                blocker="unfinished_tasks",
                unfinished_tasks=str(unfinished),
            )
        for blocker in await retirement_blockers(tx, queue_id):
            raise state_conflict(blocker["message"], **blocker["details"])
        now = await tx.now()
        before = queue_json(row, unfinished)
        changes = {"retired_at": now, "updated_at": now, "revision": int(row["revision"]) + 1}
        await tx.defer(queue_q.retire(queue_id, retired_at=now, revision=changes["revision"]))
        after = queue_json({**row, **changes}, unfinished)
        await write_audit(
            tx, w.actor, namespace_id=row["namespace_id"], action="queue.retire",
            resource_type="queue", resource_id=queue_id, reason=req.reason, before=before, after=after,
        )
        await emit(
            tx, namespace_id=row["namespace_id"], type="queue.retired", resource_type="queue",
            resource_id=queue_id, data={"queue": after, "reason": req.reason},
        )
        return {"queue": after}, queue_id

    return await idempotent_write(db, w.scope, effect)


async def retirement_blockers(tx: Tx, queue_id: str) -> list[dict[str, Any]]:
    """Other resources that keep a queue from retiring: a non-retired schedule targeting it would
    generate tasks into a retired queue."""
    rows = await tx.rows(queue_q.live_schedules(queue_id, limit=1))
    return [{"message": f"the schedule {r['name']!r} still targets the queue; retire it first",
             "details": {"blocker": "schedule", "schedule_id": r["id"], "schedule_name": r["name"]}} for r in rows]


async def get_queue(db: Database, principal: Principal, queue_id: str) -> dict[str, Any]:
    if not is_id(queue_id) or not principal.can_see_queue(queue_id):
        raise not_found("queue")

    row = await db.read(lambda tx: tx.one(queue_q.with_usage(principal.namespace_id, queue_id)))
    if row is None:
        raise not_found("queue")
    return queue_json(row, row["unfinished"])


async def list_queues(
    db: Database,
    principal: Principal,
    *,
    name: str | None,
    include_retired: bool,
    limit: int,
    after_id: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page in creation order (ids are time-ordered); returns (items, last id if more)."""
    stmt = queue_q.page(principal.namespace_id, name=name, include_retired=include_retired, after_id=after_id,
                        limit=limit + 1)
    rows = await db.read(lambda tx: tx.rows(stmt))
    items = [queue_json(r, r["unfinished"]) for r in rows[:limit]]
    return items, (items[-1]["id"] if len(rows) > limit else None)
