"""Audit records and outbox events, written inside the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..core.ids import new_id
from ..store.queries import audit, events
from ..store.tx import Tx

Event = tuple[str, str, str, str, Any]  # namespace id, type, resource type, resource id, data


@dataclass(frozen=True)
class Actor:
    """Who made a change and through which request, for the audit trail."""

    credential_id: str | None = None
    name: str | None = None
    request_id: str | None = None
    idempotency_key: str | None = None


def _json(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


async def write_audit(
    tx: Tx,
    actor: Actor,
    *,
    namespace_id: str | None,
    action: str,
    resource_type: str,
    resource_id: str,
    reason: str | None = None,
    before: Any = None,
    after: Any = None,
) -> None:
    for stmt in audit.insert({
        "id": new_id(), "namespace_id": namespace_id, "time": await tx.now(),
        "actor_credential_id": actor.credential_id, "actor": actor.name, "action": action,
        "resource_type": resource_type, "resource_id": resource_id, "reason": reason,
        "request_id": actor.request_id, "idempotency_key": actor.idempotency_key,
        "before": _json(before), "after": _json(after),
    }):
        await tx.defer(stmt)


async def emit(tx: Tx, *, namespace_id: str, type: str, resource_type: str, resource_id: str, data: Any) -> None:
    await emit_many(tx, [(namespace_id, type, resource_type, resource_id, data)])


async def emit_many(tx: Tx, rows: list[Event]) -> None:
    """Several outbox events in one statement, with the transaction's next round trip."""
    if not rows:
        return
    now = await tx.now()
    await events.insert(tx, [(ns, type_, now, rtype, rid, orjson.dumps(data).decode())
                             for ns, type_, rtype, rid, data in rows])
