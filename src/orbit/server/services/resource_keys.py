"""Resource key management: create, read, list, configure, retire.

The permits a key's tasks hold are counted in `resource_key_usage`, so they never bump the
key's `revision` or `updated_at`; their enforcement is in the dispatch and submit paths.
"""

from __future__ import annotations

from typing import Any

import orjson

from ...models import (
    ConfigureResourceKeyRequest,
    CreateResourceKeyRequest,
    RetireResourceKeyRequest,
    configure_controls,
)
from ..core.ids import is_id, new_id
from ..core.timefmt import format_ts
from ..errors import DomainError, not_found, stale_revision, state_conflict
from ..store.db import Database
from ..store.queries import resource_keys as key_q
from ..store.queries import schedules as schedule_q
from ..store.queries import usage as usage_q
from ..store.tx import Tx
from .auth import Principal
from .idempotency import Outcome, WriteRequest, idempotent_write
from .outbox import emit, write_audit

OP_CREATE = "resource_keys.create"
OP_CONFIGURE = "resource_keys.configure"
OP_RETIRE = "resource_keys.retire"
WHAT = "resource key"

# Every control of a key (declared once, by the API's models), with its JSON type.
CONTROLS = configure_controls(ConfigureResourceKeyRequest)


def resource_key_json(row: Any, in_use: int) -> dict[str, Any]:
    return {
        "id": row["id"],
        "namespace_id": row["namespace_id"],
        "name": row["name"],
        **{name: kind(row[name]) for name, kind in CONTROLS.items()},
        "in_use": str(int(in_use)),
        "revision": str(int(row["revision"])),
        "retired_at": format_ts(row["retired_at"]),
        "created_at": format_ts(row["created_at"]),
        "updated_at": format_ts(row["updated_at"]),
    }


def _name_taken(name: str) -> DomainError:
    return state_conflict(f"a resource key named {name!r} already exists in this namespace", name=name)


async def _lock_for_change(tx: Tx, principal: Principal, resource_key_id: str, expected_revision: str
                           ) -> tuple[Any, Any]:
    """Lock the key row, check that it may change, then lock its usage row (the lock order).
    A key that is missing or in another namespace is not found; a retired key takes no change;
    a stale `expected_revision` is refused."""
    if not is_id(resource_key_id):
        raise not_found(WHAT)
    row = await tx.one(key_q.lock_for_update(principal.namespace_id, resource_key_id))
    if row is None:
        raise not_found(WHAT)
    if row["retired_at"] is not None:
        raise state_conflict("the resource key is retired", retired_at=format_ts(row["retired_at"]))
    current = int(row["revision"])
    if int(expected_revision) != current:
        raise stale_revision(expected_revision, current, WHAT)
    usage = await tx.one(usage_q.resource_key_rows([resource_key_id], lock=True))
    return row, usage


async def create_resource_key(db: Database, w: WriteRequest, req: CreateResourceKeyRequest) -> Outcome:
    """Insert the key and its usage row; names are unique in the namespace, retired keys included."""
    ns = w.principal.namespace_id

    async def effect(tx: Tx):
        now = await tx.now()
        if await tx.rows(key_q.name_taken(ns, req.name)):
            raise _name_taken(req.name)
        row = {"id": new_id(), "namespace_id": ns, "name": req.name,
               **{c: kind(getattr(req, c)) for c, kind in CONTROLS.items()},
               "revision": 1, "retired_at": None, "created_at": now, "updated_at": now}
        if not await key_q.insert(tx, row):
            raise _name_taken(req.name)
        await tx.defer(usage_q.insert_resource_key_row(row["id"]))
        snapshot = resource_key_json(row, 0)
        await write_audit(tx, w.actor, namespace_id=ns, action="resource_key.create", resource_type="resource_key",
                          resource_id=row["id"], after=snapshot)
        await emit(tx, namespace_id=ns, type="resource_key.created", resource_type="resource_key",
                   resource_id=row["id"], data={"resource_key": snapshot})
        return {"resource_key": snapshot}, row["id"]

    return await idempotent_write(db, w.scope, effect)


async def configure_resource_key(db: Database, w: WriteRequest, resource_key_id: str,
                                 req: ConfigureResourceKeyRequest) -> Outcome:
    """Replace every control at once, guarded by `expected_revision`. Lowering `max_concurrency`
    revokes no permit already held: new claims wait for the drain."""
    async def effect(tx: Tx):
        row, usage = await _lock_for_change(tx, w.principal, resource_key_id, req.expected_revision)
        in_use = usage["permits_in_use"]
        before = resource_key_json(row, in_use)
        changes = {**{c: getattr(req, c) for c in CONTROLS}, "revision": int(row["revision"]) + 1,
                   "updated_at": await tx.now()}
        await tx.defer(key_q.configure(resource_key_id, changes))
        if req.max_concurrency > int(row["max_concurrency"]):
            tx.keys_freed.add(resource_key_id)  # new permits: tasks parked on the key come back at once
        after = resource_key_json({**row, **changes}, in_use)
        await write_audit(tx, w.actor, namespace_id=row["namespace_id"], action="resource_key.configure",
                          resource_type="resource_key", resource_id=resource_key_id, reason=req.reason,
                          before=before, after=after)
        await emit(tx, namespace_id=row["namespace_id"], type="resource_key.configured",
                   resource_type="resource_key", resource_id=resource_key_id,
                   data={"resource_key": after, "reason": req.reason})
        return {"resource_key": after}, resource_key_id

    return await idempotent_write(db, w.scope, effect)


async def retire_resource_key(db: Database, w: WriteRequest, resource_key_id: str,
                              req: RetireResourceKeyRequest) -> Outcome:
    """Retire the key for good, only while no task holds a permit of it or still names it: the
    usage row is read under its lock, so a concurrent claim or submit is ordered before or after."""
    async def effect(tx: Tx):
        row, usage = await _lock_for_change(tx, w.principal, resource_key_id, req.expected_revision)
        in_use, unfinished = int(usage["permits_in_use"]), int(usage["unfinished"])
        if in_use:
            raise state_conflict("tasks still hold permits of the resource key", blocker="in_use",
                                 in_use=str(in_use))
        if unfinished:
            raise state_conflict("unfinished tasks still reference the resource key", blocker="unfinished_tasks",
                                 unfinished_tasks=str(unfinished))
        # A schedule naming the key could generate no task any more: it would stop without a word.
        naming = [r for r in await tx.rows(schedule_q.live_mentioning(row["namespace_id"], f'"{row["name"]}"'))
                  if row["name"] in (orjson.loads(r["task"]).get("resource_keys") or [])]
        if naming:
            first = naming[0]
            raise state_conflict(f"the schedule {first['name']!r} still names the resource key in its task template; "
                                 "retire it or configure it without the key first", blocker="schedule",
                                 schedule_id=first["id"], schedule_name=first["name"])
        now = await tx.now()
        before = resource_key_json(row, in_use)
        changes = {"retired_at": now, "updated_at": now, "revision": int(row["revision"]) + 1}
        await tx.defer(key_q.retire(resource_key_id, retired_at=now, revision=changes["revision"]))
        after = resource_key_json({**row, **changes}, in_use)
        await write_audit(tx, w.actor, namespace_id=row["namespace_id"], action="resource_key.retire",
                          resource_type="resource_key", resource_id=resource_key_id, reason=req.reason,
                          before=before, after=after)
        await emit(tx, namespace_id=row["namespace_id"], type="resource_key.retired", resource_type="resource_key",
                   resource_id=resource_key_id, data={"resource_key": after, "reason": req.reason})
        return {"resource_key": after}, resource_key_id

    return await idempotent_write(db, w.scope, effect)


async def get_resource_key(db: Database, principal: Principal, resource_key_id: str) -> dict[str, Any]:
    if not is_id(resource_key_id):
        raise not_found(WHAT)
    row = await db.read(lambda tx: tx.one(key_q.with_usage(principal.namespace_id, resource_key_id)))
    if row is None:
        raise not_found(WHAT)
    return resource_key_json(row, row["permits_in_use"])


async def list_resource_keys(
    db: Database,
    principal: Principal,
    *,
    name: str | None,
    include_retired: bool,
    limit: int,
    after_id: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page in creation order (ids are time-ordered); returns (items, last id if more)."""
    stmt = key_q.page(principal.namespace_id, name=name, include_retired=include_retired, after_id=after_id,
                      limit=limit + 1)
    rows = await db.read(lambda tx: tx.rows(stmt))
    items = [resource_key_json(r, r["permits_in_use"]) for r in rows[:limit]]
    return items, (items[-1]["id"] if len(rows) > limit else None)
