"""Tasks: the rows producers submit, read, cancel and review, and the deadline sweep's work."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from ..tx import Stmt, Tx, placeholders

# Insert order; `payload` is read only where a task object carries it.
COLUMNS = ("id", "namespace_id", "application_id", "queue_id", "schedule_id", "trigger_at", "state", "payload",
           "priority", "resource_keys", "max_attempts", "attempts", "retry_policy", "on_lease_lost", "available_at",
           "start_deadline_at", "deadline_at", "cancel_requested", "cancel_reason", "sweep_at", "result", "error",
           "created_at", "updated_at", "finished_at", "resource_key_ids", "parked_on", "traceparent")
_ALL = ", ".join(COLUMNS)
_WITHOUT_PAYLOAD = ", ".join(c for c in COLUMNS if c != "payload")
NEW_ROWS = "INSERT INTO tasks "  # how `insert`'s statements begin (`Tx.lead_commit`)
_INSERTS: dict[tuple[str, ...], Stmt] = {}


async def insert(tx: Tx, rows: Sequence[dict[str, Any]]) -> None:
    """New task rows (dicts with every column), with the transaction's next round trip.

    A column NULL in every row is left out, as no tasks column has another default: a new task
    has a dozen, and leaving them out spares MariaDB about a tenth of its CPU per row
    (`python bench/statement_forms.py`). One statement is kept per set of columns."""
    if not rows:
        return
    cols = tuple(c for c in COLUMNS if any(r[c] is not None for r in rows))
    stmt = _INSERTS.get(cols)
    if stmt is None:
        stmt = _INSERTS[cols] = Stmt(f"INSERT INTO tasks ({', '.join(cols)}) VALUES ({placeholders(len(cols))})")
    await tx.defer_rows(stmt, [[r[c] for c in cols] for r in rows])


def resource_key_ids(row: Any) -> tuple[str, ...]:
    """The ids of the resource keys a task row names (`resource_key_ids`, JSON or NULL)."""
    text = row["resource_key_ids"]
    return tuple(orjson.loads(text)) if text else ()


def by_id(namespace_id: str, task_id: str, *, payload: bool = False, lock: bool = False) -> Stmt:
    """The task of the namespace; `lock` takes its row (before any lease row: the global lock order)."""
    return Stmt(f"SELECT {_ALL if payload else _WITHOUT_PAYLOAD} FROM tasks WHERE id = ? AND namespace_id = ?"
                f"{'{FOR_UPDATE}' if lock else ''}", (task_id, namespace_id))


def for_replay(task_ids: list[str], *, full: bool) -> Stmt:
    """What replaying stored snapshots needs: the payloads, or (`full`) whole rows."""
    return Stmt(f"SELECT {_ALL if full else 'id, payload'} FROM tasks WHERE id IN ({placeholders(len(task_ids))})",
                task_ids)


def state_group(state: str) -> str:
    """A state's key in the state index (`tasks.state_group`): LEASED and RUNNING are one group."""
    return "HELD" if state in ("LEASED", "RUNNING") else state


def page(queue_id: str, *, states: Sequence[str], schedule_id: str | None, created_after: datetime | None,
         created_before: datetime | None, before_id: str | None, limit: int) -> Stmt:
    """Up to `limit` tasks of the queue, newest (highest id) first."""
    where = ["queue_id = ?"]
    params: list[Any] = [queue_id]
    if states:
        groups = sorted({state_group(s) for s in states})
        where.append(f"state_group IN ({placeholders(len(groups))}) AND state IN ({placeholders(len(states))})")
        params.extend([*groups, *states])
    if schedule_id is not None:
        where.append("schedule_id = ?")
        params.append(schedule_id)
    if created_after is not None:
        where.append("created_at > ?")
        params.append(created_after)
    if created_before is not None:
        where.append("created_at < ?")
        params.append(created_before)
    if before_id is not None:
        where.append("id < ?")
        params.append(before_id)
    params.append(limit)
    return Stmt(f"SELECT {_ALL} FROM tasks WHERE {' AND '.join(where)} ORDER BY id DESC LIMIT ?", params)


def update(task_id: str, changes: dict[str, Any]) -> Stmt:
    """Set these columns of the task (a management write's decided change)."""
    unknown = set(changes) - set(COLUMNS)
    if unknown:
        raise ValueError(f"not task columns: {sorted(unknown)}")
    return Stmt(f"UPDATE tasks SET {', '.join(f'{c} = ?' for c in changes)} WHERE id = ?",
                [*changes.values(), task_id])


# ---------------------------------------------------------------- deadline sweep

_SWEEP_COLS = "id, namespace_id, queue_id, application_id, state, attempts, deadline_at, start_deadline_at, " \
              "cancel_requested, resource_key_ids, parked_on"


def any_sweep_due() -> Stmt:
    return Stmt("SELECT 1 AS due FROM tasks WHERE sweep_at <= {NOW} LIMIT 1")


def sweep_due(now: datetime, limit: int) -> Stmt:
    """Tasks whose `sweep_at` has come, locked; rows another node holds are skipped (it sweeps them)."""
    return Stmt(f"SELECT {_SWEEP_COLS} FROM tasks WHERE sweep_at <= ? ORDER BY sweep_at LIMIT ?{{SKIP_LOCKED}}",
                (now, limit))


def fail_swept(task_id: str, error: str, now: datetime) -> Stmt:
    return Stmt("UPDATE tasks SET state = 'FAILED', error = ?, updated_at = ?, finished_at = ?, sweep_at = NULL, "
                "parked_on = NULL WHERE id = ?", (error, now, now, task_id))


def request_cancel_swept(task_id: str, reason: str, now: datetime) -> Stmt:
    return Stmt("UPDATE tasks SET cancel_requested = ?, cancel_reason = ?, updated_at = ?, sweep_at = NULL "
                "WHERE id = ?", (True, reason, now, task_id))


def move_sweep(task_id: str, sweep_at: datetime | None) -> Stmt:
    return Stmt("UPDATE tasks SET sweep_at = ? WHERE id = ?", (sweep_at, task_id))


# ---------------------------------------------------------------- dispatch

_DISPATCH_COLS = ("id, namespace_id, application_id, queue_id, state, priority, attempts, max_attempts, "
                  "retry_policy, on_lease_lost, start_deadline_at, deadline_at, cancel_requested, cancel_reason, "
                  "resource_keys, resource_key_ids, parked_on, created_at, started_at, start_msg_id, start_response")


_CLAIM_COLS = ("id, namespace_id, application_id, queue_id, priority, attempts, payload, resource_keys, "
               "resource_key_ids, available_at, start_deadline_at, deadline_at, traceparent")


def claim_row(task: dict[str, Any], now: datetime) -> dict[str, Any] | None:
    """What `claimable` would read of a task this transaction wrote (its full row), or None when
    it would not read it at `now`: not waiting, parked on a resource key, or not due yet."""
    if task["state"] != "WAITING" or task["parked_on"] is not None or task["available_at"] > now:
        return None
    return {name: task[name] for name in _CLAIM_NAMES}


_CLAIM_NAMES = tuple(name.strip() for name in _CLAIM_COLS.split(","))
_CLAIM_COLS_T = ", ".join(f"t.{name}" for name in _CLAIM_NAMES)
ALL_LEVELS = (1 << 10) - 1


def claimable(queue_id: str, limit: int, *, levels: int = ALL_LEVELS, now: datetime | None = None,
              skip_locked: bool = False, candidates: bool = False) -> Stmt:
    """Up to `limit` due, claimable (not parked) waiting tasks of each priority in `levels` (a
    bit mask), each level in due time then acceptance order: one index range per level, whose
    merge by effective priority (`core.dispatch_order`) is exact under aging. `now` defaults to
    the database clock; with `skip_locked`, rows another claim holds are passed over.

    With `candidates` (and `skip_locked`), MySQL reads the range without locks and then locks the
    rows it found by primary key: a locking scan walks every entry a recent claim delete-marked
    and purge has not removed yet (thousands in a drain, one clustered lookup each), a consistent
    read passes over them. A candidate another transaction holds or changed meanwhile comes back
    empty: `locked_candidates` tells the caller whether the rows stand for the locking scan."""
    due_by = "?" if now is not None else "{NOW}"
    where = (f"WHERE queue_id = ? AND waiting = 1 AND parked_on IS NULL AND priority = ? "
             f"AND available_at <= {due_by} ORDER BY available_at, id LIMIT ?")
    level = f"SELECT {_CLAIM_COLS} FROM tasks {{DISPATCH_INDEX}} {where}"
    ps = _priorities(levels)
    params: list[Any] = []
    for p in ps:
        params += (queue_id, p, now, limit) if now is not None else (queue_id, p, limit)
    stmt = _per_level(level, len(ps), params, lock="{SKIP_LOCKED}" if skip_locked else "")
    if not (skip_locked and candidates):
        return stmt
    by_key = (f"SELECT {_CLAIM_COLS_T}, c.priority AS candidate FROM (SELECT id, priority, available_at FROM tasks "
              f"{_FORCE_DISPATCH} {where}) c LEFT JOIN tasks t ON t.id = c.id AND t.waiting = 1 "
              "AND t.parked_on IS NULL AND t.priority = c.priority AND t.available_at = c.available_at "
              "ORDER BY c.available_at, c.id{SKIP_LOCKED}")
    mysql = by_key if len(ps) == 1 else " UNION ALL ".join(f"({by_key})" for _ in ps)
    return Stmt(mysql, params, sqlite=stmt.sqlite or stmt.sql)


def locked_candidates(rows: list[dict[str, Any]], limit: int, wanted: int) -> tuple[list[dict[str, Any]], bool]:
    """The rows a `claimable(..., candidates=True)` read of `limit` candidates per level locked,
    and whether they stand for the level-wise locking scan of `wanted`: no level passed over a
    candidate (held by another transaction, or no longer claimable) and came out short of
    `wanted` while its range had more than it read. SQLite's rows are the scan's own."""
    if not rows or "candidate" not in rows[0]:
        return rows, True
    read: dict[int, int] = {}
    took: dict[int, int] = {}
    locked = []
    for r in rows:
        level = r.pop("candidate")
        read[level] = read.get(level, 0) + 1
        if r["id"] is not None:
            took[level] = took.get(level, 0) + 1
            locked.append(r)
    whole = all(took.get(level, 0) >= wanted or n < limit for level, n in read.items())
    return locked, whole


def due(queue_levels: Sequence[tuple[str, int]], limit: int) -> Stmt:
    """Up to `limit` due, claimable waiting tasks (their queue ids) of each queue at each priority
    level in its bit mask: the dispatch index's ranges that `claimable` reads, without payloads,
    locks or rows, so that a node may learn cheaply whether its waiting claims would find work."""
    level = ("SELECT queue_id FROM tasks {DISPATCH_INDEX} WHERE queue_id = ? AND waiting = 1 "
             "AND parked_on IS NULL AND priority = ? AND available_at <= {NOW} LIMIT ?")
    params: list[Any] = []
    for queue_id, levels in queue_levels:
        for p in _priorities(levels):
            params += (queue_id, p, limit)
    return _per_level(level, len(params) // 3, params)


def _priorities(levels: int) -> list[int]:
    """The priorities a bit mask of levels names, highest first (an empty mask: priority 0)."""
    return [p for p in range(9, -1, -1) if levels >> p & 1] or [0]


_FORCE_DISPATCH, _INDEXED_DISPATCH = "FORCE INDEX (ix_tasks_dispatch)", "INDEXED BY ix_tasks_dispatch"


def _per_level(level: str, parts: int, params: list[Any], lock: str = "") -> Stmt:
    """`level`, one index range of the dispatch index, read `parts` times (its params in order),
    as one statement. The index is named where `{DISPATCH_INDEX}` stands: `parked_on IS NULL AND
    priority = ?` also fits ix_tasks_parked, which would walk every claimable task of every queue."""
    mysql, sqlite = (level.replace("{DISPATCH_INDEX}", hint) for hint in (_FORCE_DISPATCH, _INDEXED_DISPATCH))
    if parts == 1:
        return Stmt(mysql + lock, params, sqlite=sqlite)
    return Stmt(" UNION ALL ".join(f"({mysql}{lock})" for _ in range(parts)), params,
                sqlite=" UNION ALL ".join(f"SELECT * FROM ({sqlite})" for _ in range(parts)))


def park(task_ids: list[str], resource_key_id: str) -> Stmt:
    """Take these waiting tasks out of the claimable part until the key gives a permit back."""
    return Stmt(f"UPDATE tasks SET parked_on = ? WHERE id IN ({placeholders(len(task_ids))}) AND state = 'WAITING'",
                (resource_key_id, *task_ids))


def parked_on(resource_key_id: str, limit: int) -> Stmt:
    """The waiting tasks parked on the key that a freed permit serves first (dispatch order)."""
    return Stmt("SELECT id, queue_id FROM tasks WHERE parked_on = ? AND state = 'WAITING' "
                "ORDER BY priority DESC, available_at, id LIMIT ?", (resource_key_id, limit))


def unpark(task_ids: list[str], resource_key_id: str) -> Stmt:
    return Stmt(f"UPDATE tasks SET parked_on = NULL WHERE id IN ({placeholders(len(task_ids))}) AND parked_on = ?",
                (*task_ids, resource_key_id))


def mark_leased(task_ids: list[str], now: datetime, *, only_waiting: bool = False) -> Stmt:
    guard = " AND state = 'WAITING'" if only_waiting else ""
    return Stmt(f"UPDATE tasks SET state = 'LEASED', updated_at = ? WHERE id IN ({placeholders(len(task_ids))}){guard}",
                (now, *task_ids))


def lease_unwritten(row: dict[str, Any] | None, now: datetime) -> bool:
    """Lease a task whose row this transaction has not written yet, as `mark_leased` would once it
    is: the row is then inserted LEASED, and never enters the dispatch index. False without a row."""
    if row is None:
        return False
    row["state"] = "LEASED"
    row["updated_at"] = now
    return True


def leased_among(task_ids: list[str]) -> Stmt:
    return Stmt(f"SELECT id FROM tasks WHERE id IN ({placeholders(len(task_ids))}) AND state = 'LEASED'", task_ids)


def lock_for_dispatch(task_ids: list[str]) -> Stmt:
    """The task rows a grouped Start/complete decides on, locked in id order (the global lock order)."""
    return Stmt(f"SELECT {_DISPATCH_COLS} FROM tasks WHERE id IN ({placeholders(len(task_ids))}) "
                "ORDER BY id{FOR_UPDATE}", task_ids)


def cancel_requested(task_ids: list[str]) -> Stmt:
    return Stmt(f"SELECT id, cancel_requested FROM tasks WHERE id IN ({placeholders(len(task_ids))})", task_ids)


def lock_skipping_locked(task_ids: list[str]) -> Stmt:
    """Whole task rows, locked in id order; rows another transaction holds are left to it."""
    return Stmt(f"SELECT * FROM tasks WHERE id IN ({placeholders(len(task_ids))}) ORDER BY id{{SKIP_LOCKED}}",
                task_ids)
