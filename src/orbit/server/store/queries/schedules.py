"""Schedules and their run records, as the management API reads and changes them (the
scheduler's statements, which advance the cursor, are elsewhere)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..tx import Stmt, Tx, placeholders
from .bulk import insert_named


async def insert(tx: Tx, row: dict[str, Any]) -> bool:
    """Insert the schedule; False when its name is taken in the namespace (a concurrent create)."""
    return await insert_named(tx, "schedules", row)


def name_taken(namespace_id: str, name: str) -> Stmt:
    return Stmt("SELECT id FROM schedules WHERE namespace_id = ? AND name = ?", (namespace_id, name))


def live_mentioning(namespace_id: str, text: str) -> Stmt:
    """Schedules of the namespace, not retired, whose task template contains `text` (a candidate
    filter: the caller reads the template to be sure)."""
    pattern = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    sql = "SELECT id, name, task FROM schedules WHERE namespace_id = ? AND retired_at IS NULL AND task LIKE ?"
    # MySQL's LIKE escapes with a backslash by default; SQLite's only when told to.
    return Stmt(sql + " ORDER BY id", (namespace_id, pattern), sqlite=sql + " ESCAPE '\\' ORDER BY id")


def by_id(namespace_id: str, schedule_id: str) -> Stmt:
    return Stmt("SELECT * FROM schedules WHERE id = ? AND namespace_id = ?", (schedule_id, namespace_id))


def lock_for_update(namespace_id: str, schedule_id: str) -> Stmt:
    """The schedule row, locked: the scheduler locks it too while it advances the cursor."""
    return Stmt("SELECT * FROM schedules WHERE id = ? AND namespace_id = ?{FOR_UPDATE}", (schedule_id, namespace_id))


def page(namespace_id: str, *, queue_scope: tuple[str, ...] | None, queue_id: str | None, name: str | None,
         include_retired: bool, after_id: str | None, limit: int) -> Stmt:
    """Up to `limit` schedules of the namespace in id (creation) order; with `queue_scope`, only
    those whose queue is in it."""
    where = ["namespace_id = ?"]
    params: list[Any] = [namespace_id]
    if queue_scope is not None:
        where.append(f"queue_id IN ({placeholders(len(queue_scope))})")
        params.extend(queue_scope)
    if queue_id is not None:
        where.append("queue_id = ?")
        params.append(queue_id)
    if name is not None:
        where.append("name = ?")
        params.append(name)
    if not include_retired:
        where.append("retired_at IS NULL")
    if after_id is not None:
        where.append("id > ?")
        params.append(after_id)
    params.append(limit)
    return Stmt(f"SELECT * FROM schedules WHERE {' AND '.join(where)} ORDER BY id LIMIT ?", params)


def configure(schedule_id: str, values: dict[str, Any]) -> Stmt:
    """Set these columns (the settings, the cursor, the revision and `updated_at`)."""
    return Stmt(f"UPDATE schedules SET {', '.join(f'{c} = ?' for c in values)} WHERE id = ?",
                [*values.values(), schedule_id])


def retire(schedule_id: str, *, retired_at: Any, revision: int) -> Stmt:
    """Retired for good: off the scheduler's index (`due_at`)."""
    return Stmt("UPDATE schedules SET retired_at = ?, updated_at = ?, revision = ?, due_at = NULL WHERE id = ?",
                (retired_at, retired_at, revision, schedule_id))


def runs(schedule_id: str, *, after: datetime | None, limit: int) -> Stmt:
    """Up to `limit` run records of the schedule, oldest trigger point first."""
    if after is None:
        return Stmt("SELECT * FROM schedule_runs WHERE schedule_id = ? ORDER BY trigger_at LIMIT ?",
                    (schedule_id, limit))
    return Stmt("SELECT * FROM schedule_runs WHERE schedule_id = ? AND trigger_at > ? ORDER BY trigger_at LIMIT ?",
                (schedule_id, after, limit))
