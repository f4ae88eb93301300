"""Schedule generation: due schedules, the state of their previous tasks, run records, cursors."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..tx import Stmt, Tx, placeholders


def any_due() -> Stmt:
    return Stmt("SELECT 1 AS due FROM schedules WHERE due_at <= {NOW} LIMIT 1")


def lock_due(limit: int) -> Stmt:
    """Due schedules, oldest cursor first, locked with the clock; a schedule another node is
    advancing is skipped (it handles it), so each is advanced by one node at a time."""
    return Stmt("SELECT *, {NOW} AS db_now FROM schedules WHERE due_at <= {NOW} ORDER BY due_at LIMIT ?"
                "{SKIP_LOCKED}", (limit,))


def task_states(task_ids: list[str]) -> Stmt:
    return Stmt(f"SELECT id, state FROM tasks WHERE id IN ({placeholders(len(task_ids))})", task_ids)


_INSERT_RUN = Stmt("INSERT INTO schedule_runs (schedule_id, trigger_at, outcome, task_id, reason, created_at) "
                   "VALUES (?, ?, ?, ?, ?, ?)")


async def insert_runs(tx: Tx, rows: Sequence[Sequence[Any]]) -> None:
    """(schedule id, trigger point, outcome, task id, reason, created at), with the next round trip."""
    await tx.defer_rows(_INSERT_RUN, rows)


def advance(schedule_id: str, *, next_trigger_at: datetime | None, due_at: datetime | None,
            last_trigger_at: datetime | None, last_task_id: str | None) -> Stmt:
    """Move the schedule's cursor past the points a batch handled."""
    return Stmt("UPDATE schedules SET next_trigger_at = ?, due_at = ?, last_trigger_at = ?, last_task_id = ? "
                "WHERE id = ?", (next_trigger_at, due_at, last_trigger_at, last_task_id, schedule_id))
