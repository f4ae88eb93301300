"""Queues: configuration rows (their live counters are in `queue_usage`, see usage.py)."""

from __future__ import annotations

from typing import Any

from ..tx import Stmt, Tx, placeholders
from .bulk import insert_named

# A queue row is read whole: its controls are columns named after the API's fields (see
# services/queues.py), so a new control needs no change here.


async def insert(tx: Tx, row: dict[str, Any]) -> bool:
    """Insert the queue; False when its name is taken in the namespace (a concurrent create)."""
    return await insert_named(tx, "queues", row)


def name_taken(namespace_id: str, name: str) -> Stmt:
    return Stmt("SELECT id FROM queues WHERE namespace_id = ? AND name = ?", (namespace_id, name))


def by_name(namespace_id: str, name: str) -> Stmt:
    return Stmt("SELECT * FROM queues WHERE namespace_id = ? AND name = ?", (namespace_id, name))


def lock_for_update(namespace_id: str, queue_id: str) -> Stmt:
    return Stmt("SELECT * FROM queues WHERE id = ? AND namespace_id = ?{FOR_UPDATE}", (queue_id, namespace_id))


def with_usage(namespace_id: str, queue_id: str) -> Stmt:
    """The queue and its unfinished count."""
    return Stmt("SELECT q.*, qu.unfinished FROM queues q JOIN queue_usage qu ON qu.queue_id = q.id "
                "WHERE q.id = ? AND q.namespace_id = ?", (queue_id, namespace_id))


def page(namespace_id: str, *, name: str | None, include_retired: bool, after_id: str | None, limit: int) -> Stmt:
    """Up to `limit` queues of the namespace with their unfinished counts, in id (creation) order."""
    where = ["q.namespace_id = ?"]
    params: list[Any] = [namespace_id]
    if name is not None:
        where.append("q.name = ?")
        params.append(name)
    if not include_retired:
        where.append("q.retired_at IS NULL")
    if after_id is not None:
        where.append("q.id > ?")
        params.append(after_id)
    params.append(limit)
    return Stmt("SELECT q.*, qu.unfinished FROM queues q JOIN queue_usage qu ON qu.queue_id = q.id "
                f"WHERE {' AND '.join(where)} ORDER BY q.id LIMIT ?", params)


def ids_in_namespace(namespace_id: str, queue_ids: list[str]) -> Stmt:
    """Which of these queue ids are queues of the namespace."""
    return Stmt(f"SELECT id FROM queues WHERE namespace_id = ? AND id IN ({placeholders(len(queue_ids))})",
                [namespace_id, *queue_ids])


def configure(queue_id: str, values: dict[str, Any]) -> Stmt:
    """Set these columns (every control, the revision and `updated_at`)."""
    return Stmt(f"UPDATE queues SET {', '.join(f'{c} = ?' for c in values)} WHERE id = ?",
                [*values.values(), queue_id])


def retire(queue_id: str, *, retired_at: Any, revision: int) -> Stmt:
    return Stmt("UPDATE queues SET retired_at = ?, updated_at = ?, revision = ? WHERE id = ?",
                (retired_at, retired_at, revision, queue_id))


def live_schedules(queue_id: str, limit: int) -> Stmt:
    """Up to `limit` non-retired schedules targeting the queue (they keep it from retiring). A
    schedule created meanwhile share-locked the queue row, so the retire that locked it sees it."""
    return Stmt("SELECT id, name FROM schedules WHERE queue_id = ? AND retired_at IS NULL ORDER BY id LIMIT ?",
                (queue_id, limit))


# ---------------------------------------------------------------- dispatch


def controls(queue_ids: list[str]) -> Stmt:
    """The queues whose controls a claim or a Start checks, with their application's controls
    (unlocked: a configure that commits meanwhile is caught when the plan is re-checked under
    the usage row's lock)."""
    return Stmt("SELECT q.*, a.id AS application_id, a.paused AS application_paused, "
                "a.max_concurrency AS application_max_concurrency, "
                "a.rate_per_second AS application_rate_per_second FROM queues q "
                "JOIN namespaces n ON n.id = q.namespace_id JOIN applications a ON a.id = n.application_id "
                f"WHERE q.id IN ({placeholders(len(queue_ids))})", queue_ids)


def share_for_admission(namespace_id: str, queue_id: str) -> Stmt:
    """The queue row share-locked for a submit (configure and retire, which lock it exclusively,
    wait for the submit), with the clock."""
    return Stmt("SELECT *, {NOW} AS db_now FROM queues WHERE id = ? AND namespace_id = ?{SHARE}",
                (queue_id, namespace_id))
