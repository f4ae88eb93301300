"""Resource keys: configuration rows (their live counters are in `resource_key_usage`, see usage.py)."""

from __future__ import annotations

from typing import Any

from ..tx import Stmt, Tx
from .bulk import insert_named

# A key row is read whole: its controls are columns named after the API's fields (see
# services/resource_keys.py), so a new control needs no change here.

_WITH_USAGE = ("SELECT k.*, ku.permits_in_use FROM resource_keys k "
               "JOIN resource_key_usage ku ON ku.resource_key_id = k.id")


async def insert(tx: Tx, row: dict[str, Any]) -> bool:
    """Insert the key; False when its name is taken in the namespace (a concurrent create)."""
    return await insert_named(tx, "resource_keys", row)


def name_taken(namespace_id: str, name: str) -> Stmt:
    return Stmt("SELECT id FROM resource_keys WHERE namespace_id = ? AND name = ?", (namespace_id, name))


def lock_for_update(namespace_id: str, resource_key_id: str) -> Stmt:
    """The key row, locked before its usage row (the lock order)."""
    return Stmt("SELECT * FROM resource_keys WHERE id = ? AND namespace_id = ?{FOR_UPDATE}",
                (resource_key_id, namespace_id))


def with_usage(namespace_id: str, resource_key_id: str) -> Stmt:
    """The key and its permits in use."""
    return Stmt(f"{_WITH_USAGE} WHERE k.id = ? AND k.namespace_id = ?", (resource_key_id, namespace_id))


def page(namespace_id: str, *, name: str | None, include_retired: bool, after_id: str | None, limit: int) -> Stmt:
    """Up to `limit` keys of the namespace with their permits in use, in id (creation) order."""
    where = ["k.namespace_id = ?"]
    params: list[Any] = [namespace_id]
    if name is not None:
        where.append("k.name = ?")
        params.append(name)
    if not include_retired:
        where.append("k.retired_at IS NULL")
    if after_id is not None:
        where.append("k.id > ?")
        params.append(after_id)
    params.append(limit)
    return Stmt(f"{_WITH_USAGE} WHERE {' AND '.join(where)} ORDER BY k.id LIMIT ?", params)


def configure(resource_key_id: str, values: dict[str, Any]) -> Stmt:
    """Set these columns (every control, the revision and `updated_at`)."""
    return Stmt(f"UPDATE resource_keys SET {', '.join(f'{c} = ?' for c in values)} WHERE id = ?",
                [*values.values(), resource_key_id])


def retire(resource_key_id: str, *, retired_at: Any, revision: int) -> Stmt:
    return Stmt("UPDATE resource_keys SET retired_at = ?, updated_at = ?, revision = ? WHERE id = ?",
                (retired_at, retired_at, revision, resource_key_id))
