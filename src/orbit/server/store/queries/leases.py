"""Leases: a task's execution grants to worker sessions."""

from __future__ import annotations

from datetime import datetime

from ..tx import Stmt, placeholders

# ---------------------------------------------------------------- dispatch

COLUMNS = ("id", "task_id", "queue_id", "application_id", "namespace_id", "credential_id", "session_id",
           "worker_node_id", "server_node_id", "attempt", "state", "reserved", "leased_at", "expires_at",
           "push_pending")
_LOCKED_COLS = ("id, task_id, queue_id, application_id, namespace_id, credential_id, worker_node_id, state, "
                "reserved, attempt, leased_at, expires_at, started_at, outcome, start_msg_id, start_response, "
                "complete_msg_id, complete_response, late_reports")

# A live lease whose Start is on its task's row (`core.lease.as_started`), in SQL over
# `leases l JOIN tasks t`, and when such a lease's attempt started: for every read of leases
# joined with their tasks, the benchmarks' and the chaos runner's included.
STARTED_ON_TASK = "l.state = 'LEASED' AND t.state = 'RUNNING'"
STARTED_AT = f"CASE WHEN {STARTED_ON_TASK} THEN t.started_at ELSE l.started_at END"

INSERT = Stmt(f"INSERT INTO leases ({', '.join(COLUMNS)}) VALUES ({placeholders(len(COLUMNS))})")
NEW_ROWS = "INSERT INTO leases "  # how `INSERT`'s statements begin (`Tx.lead_commit`)


def locate(lease_ids: list[str]) -> Stmt:
    """Where leases live (their task and queue never change), with the clock before any lock."""
    return Stmt("SELECT id, task_id, queue_id, {NOW} AS db_now FROM leases "
                f"WHERE id IN ({placeholders(len(lease_ids))})", lease_ids)


def lock(lease_ids: list[str]) -> Stmt:
    """Lease rows a grouped command decides on, locked in id order (after their task rows)."""
    return Stmt(f"SELECT {_LOCKED_COLS} FROM leases WHERE id IN ({placeholders(len(lease_ids))}) "
                "ORDER BY id{FOR_UPDATE}", lease_ids)


def lock_for_renew(lease_ids: list[str]) -> Stmt:
    return Stmt("SELECT id, task_id, credential_id, state, expires_at, outcome FROM leases "
                f"WHERE id IN ({placeholders(len(lease_ids))}) ORDER BY id{{FOR_UPDATE}}", lease_ids)


def lock_all_columns(lease_ids: list[str]) -> Stmt:
    return Stmt(f"SELECT * FROM leases WHERE id IN ({placeholders(len(lease_ids))}) ORDER BY id{{FOR_UPDATE}}",
                lease_ids)


def clock() -> Stmt:
    """The database clock, read in the round trip that takes the locks."""
    return Stmt("SELECT {NOW} AS db_now")


def retime(lease_ids: list[str], leased_at, expires_at) -> Stmt:
    return Stmt(f"UPDATE leases SET leased_at = ?, expires_at = ? WHERE id IN ({placeholders(len(lease_ids))})",
                (leased_at, expires_at, *lease_ids))


def retime_after_freed(lease_ids: list[str], planned_at: datetime) -> Stmt:
    """Move leases written at a plan's clock (`planned_at`) to just after `@orbit_freed`
    (`usage.note_freed`) when a permit was given back at or after that clock, keeping each
    lease's length. The guard on the variable alone is constant to MariaDB: when no permit came
    back that late (the usual case) the statement reads no lease row at all."""
    return Stmt("UPDATE leases SET expires_at = expires_at + INTERVAL "
                "(TIMESTAMPDIFF(MICROSECOND, leased_at, @orbit_freed) + 1) MICROSECOND, "
                "leased_at = @orbit_freed + INTERVAL 1 MICROSECOND "
                "WHERE CAST(@orbit_freed AS DATETIME(6)) >= ? "
                f"AND id IN ({placeholders(len(lease_ids))}) AND leased_at <= @orbit_freed",
                (planned_at, *lease_ids))


def granted(lease_ids: list[str]) -> Stmt:
    """What a claim told the worker about its leases: lease rows (claim time) and task rows
    (immutable fields), for answering a resent claim."""
    return Stmt("SELECT l.id, l.attempt, l.leased_at, t.id AS task_id, t.queue_id, t.priority, t.start_deadline_at, "
                "t.deadline_at, t.resource_keys, t.traceparent, t.payload FROM leases l JOIN tasks t ON t.id = l.task_id "
                f"WHERE l.id IN ({placeholders(len(lease_ids))})", lease_ids)


def expired(now, limit: int) -> Stmt:
    return Stmt("SELECT id, task_id FROM leases WHERE live = 1 AND expires_at <= ? "
                "ORDER BY expires_at LIMIT ?", (now, limit))


def any_expired() -> Stmt:
    return Stmt("SELECT 1 AS one FROM leases WHERE live = 1 AND expires_at <= {NOW} LIMIT 1")


# ---------------------------------------------------------------- worker sessions of one node (ws hub)


def held_by_node(server_node_id: str) -> Stmt:
    """One current lease held through this server process's sessions, if any."""
    return Stmt("SELECT id FROM leases WHERE server_node_id = ? AND state IN ('LEASED', 'RUNNING') LIMIT 1",
                (server_node_id,))


def pending_pushes(server_node_id: str, limit: int = 500) -> Stmt:
    """Leases of this process's sessions with a push to deliver, and their task's cancel request."""
    return Stmt("SELECT l.id, l.session_id, l.state, l.outcome, l.task_id, t.cancel_requested, t.cancel_reason "
                "FROM leases l JOIN tasks t ON t.id = l.task_id WHERE l.server_node_id = ? AND l.push_pending = 1 "
                "LIMIT ?", (server_node_id, limit))


def clear_push_pending(lease_ids: list[str]) -> Stmt:
    return Stmt(f"UPDATE leases SET push_pending = 0 WHERE id IN ({placeholders(len(lease_ids))})", lease_ids)


# ---------------------------------------------------------------- a task's leases (cancel, deadline sweep, attempts)


def live_for_task(task_id: str) -> Stmt:
    """The task's current lease, locked (after the task row: the global lock order)."""
    return Stmt("SELECT id, task_id, state, reserved, worker_node_id FROM leases WHERE task_id = ? "
                "AND state IN ('LEASED', 'RUNNING'){FOR_UPDATE}", (task_id,))


def live_for_tasks(task_ids: list[str]) -> Stmt:
    """The current leases of these tasks, locked in id order."""
    return Stmt("SELECT id, task_id, state, reserved, worker_node_id FROM leases "
                f"WHERE task_id IN ({placeholders(len(task_ids))}) AND state IN ('LEASED', 'RUNNING') "
                "ORDER BY id{FOR_UPDATE}", task_ids)


def request_push(lease_id: str) -> Stmt:
    """Have the lease's session told about its task (a cancel request)."""
    return Stmt("UPDATE leases SET push_pending = 1 WHERE id = ?", (lease_id,))


def end_for_task(lease_id: str, outcome: str, now) -> Stmt:
    """End the lease because its task ended (cancelled, failed by a deadline); its session is told."""
    return Stmt("UPDATE leases SET state = 'ENDED', ended_at = ?, outcome = ?, reserved = 0, push_pending = 1 "
                "WHERE id = ?", (now, outcome, lease_id))


def attempts(task_id: str, *, after_number: int | None, limit: int) -> Stmt:
    """The task's started leases in attempt order: those whose row says so, and its live lease
    while the task is RUNNING, with the task's state and Start (`core.lease.as_started`)."""
    after = " AND l.attempt > ?" if after_number is not None else ""
    params = (task_id, after_number, limit) if after_number is not None else (task_id, limit)
    return Stmt("SELECT l.id, l.attempt, l.worker_node_id, l.session_id, l.state, l.reserved, l.leased_at, "
                "l.expires_at, l.started_at, l.start_msg_id, l.start_response, l.ended_at, l.outcome, l.error, "
                "l.late_reports, t.state AS task_state, t.started_at AS task_started_at, "
                "t.start_msg_id AS task_start_msg_id, t.start_response AS task_start_response "
                "FROM leases l JOIN tasks t ON t.id = l.task_id WHERE l.task_id = ? "
                f"AND (l.started_at IS NOT NULL OR ({STARTED_ON_TASK})){after} "
                "ORDER BY l.attempt LIMIT ?", params)
