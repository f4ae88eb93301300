"""Reading the audit trail: a namespace's records in the order they committed.

Records are written by each management operation in its own transaction (`outbox.write_audit`),
which numbers them in its namespace's log as it commits; this module only reads them. `after` (the
last id seen) pages forward in that order, so a record that commits late is never behind a cursor.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from ..core.ids import is_id
from ..core.timefmt import format_ts
from ..errors import invalid_argument
from ..store.db import Database
from ..store.queries import audit as audit_q
from .auth import Principal

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# Actions are `<resource type>.<verb>` (queue.configure, credential.revoke), at most the column's 64 characters.
ACTION_PATTERN = r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$"
_ACTION_RE = re.compile(ACTION_PATTERN.replace("$", r"\Z"))
ACTION_MAX = 64


def _snapshot(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def audit_record_json(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "time": format_ts(row["time"]),
        "actor_credential_id": row["actor_credential_id"],
        "actor": row["actor"],
        "action": row["action"],
        "resource_type": row["resource_type"],
        "resource_id": row["resource_id"],
        "reason": row["reason"],
        "request_id": row["request_id"],
        "idempotency_key": row["idempotency_key"],
        "before": _snapshot(row["before"]),
        "after": _snapshot(row["after"]),
    }


async def list_audit_records(
    db: Database,
    principal: Principal,
    *,
    resource_id: str | None,
    action: str | None,
    after_id: str | None,
    limit: int,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the credential's namespace; returns (items, next_after). `next_after` is the last id
    returned, or `after_id` itself when nothing is newer, so a reader can always resume from it."""
    for field, value in (("resource_id", resource_id), ("after", after_id)):
        if value is not None and not is_id(value):
            raise invalid_argument(f"{field}: must be an id (32 lowercase hex characters)", field)
    if action is not None and (len(action) > ACTION_MAX or not _ACTION_RE.match(action)):
        raise invalid_argument("action: must be an action such as 'queue.configure' (at most 64 characters)",
                               "action")
    stmt = audit_q.page(principal.namespace_id, resource_id=resource_id, action=action, after_id=after_id,
                        limit=limit)
    rows = await db.read(lambda tx: tx.rows(stmt))
    items = [audit_record_json(r) for r in rows]
    return items, (items[-1]["id"] if items else after_id)
