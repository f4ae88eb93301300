"""The usage rows (`queue_usage`, `application_usage`, `resource_key_usage`, `queue_nodes`): live counters kept out of the configuration
rows, so that counter writes never touch `revision` or `updated_at`.

Rows are written sorted, queues before applications before resource keys, so that any two transactions touching the
same usage rows take their locks in the same order. Two rules of `core/limits.py` are also written
here as guarded SQL, which decides under the row lock the UPDATE itself takes (MySQL, strict mode):
a refusal sets a NOT NULL column to NULL, which fails the statement before the COMMIT runs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from ...core import states
from ...core.rate_window import RateWindow
from .. import tables
from ..dialect import PlanNoLongerHolds
from ..tx import Stmt, Tx, placeholders


def application_rows(application_ids: list[str], *, lock: bool = False) -> Stmt:
    """The applications' usage rows in id order; `lock` locks them (after the queues' rows)."""
    return Stmt(f"SELECT * FROM application_usage WHERE application_id IN ({placeholders(len(application_ids))}) "
                f"ORDER BY application_id{'{FOR_UPDATE}' if lock else ''}", application_ids)


def application_rows_of_queues(queue_ids: list[str], *, lock: bool = False) -> Stmt:
    """The usage rows of the applications these queues belong to, in id order (only those rows
    are locked with `lock`)."""
    return Stmt("SELECT * FROM application_usage WHERE application_id IN (SELECT n.application_id FROM queues q "
                f"JOIN namespaces n ON n.id = q.namespace_id WHERE q.id IN ({placeholders(len(queue_ids))})) "
                f"ORDER BY application_id{'{FOR_UPDATE}' if lock else ''}", queue_ids)


def queue_rows(queue_ids: list[str], *, lock: bool = False, clock: bool = False) -> Stmt:
    """The queues' usage rows (every counter) in queue order; `clock` adds `db_now`, `lock` locks them."""
    now = ", {NOW} AS db_now" if clock else ""
    return Stmt(f"SELECT *{now} FROM queue_usage WHERE queue_id IN ({placeholders(len(queue_ids))}) "
                f"ORDER BY queue_id{'{FOR_UPDATE}' if lock else ''}", queue_ids)


_QUEUE_COLUMNS = tuple(c.name for c in tables.queue_usage.columns)
_APPLICATION_COLUMNS = tuple(c.name for c in tables.application_usage.columns)
_VIEW_COLUMNS = ", ".join([*(f"u.{c} AS u__{c}" for c in _QUEUE_COLUMNS),
                           *(f"au.{c} AS au__{c}" for c in _APPLICATION_COLUMNS)])


def with_controls(queue_ids: list[str], *, clock: bool = False) -> Stmt:
    """`queue_rows`, `application_rows_of_queues` and `queues.controls` of these queues in one
    unlocked read (one statement for three; `split_with_controls` parts the rows again): `clock`
    adds `db_now` to the queue usage rows."""
    now = ", {NOW} AS db_now" if clock else ""
    return Stmt("SELECT q.*, a.id AS application_id, a.paused AS application_paused, "
                "a.max_concurrency AS application_max_concurrency, "
                f"a.rate_per_second AS application_rate_per_second, {_VIEW_COLUMNS}{now} FROM queues q "
                "JOIN namespaces n ON n.id = q.namespace_id JOIN applications a ON a.id = n.application_id "
                "JOIN queue_usage u ON u.queue_id = q.id JOIN application_usage au ON au.application_id = a.id "
                f"WHERE q.id IN ({placeholders(len(queue_ids))}) ORDER BY q.id", queue_ids)


def split_with_controls(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                               list[dict[str, Any]]]:
    """The rows of `with_controls` as the three reads it stands for would give them: queue usage
    rows (queue order, with `db_now` if read), application usage rows (id order, each once), controls."""
    usage, controls = [], []
    apps: dict[str, dict[str, Any]] = {}
    for r in rows:
        u = {c: r.pop(f"u__{c}") for c in _QUEUE_COLUMNS}
        a = {c: r.pop(f"au__{c}") for c in _APPLICATION_COLUMNS}
        if "db_now" in r:
            u["db_now"] = r.pop("db_now")
        usage.append(u)
        apps[a["application_id"]] = a
        controls.append(r)
    return usage, [apps[k] for k in sorted(apps)], controls


def note_freed(queue_ids: list[str], application_ids: list[str], resource_key_ids: list[str]) -> Stmt:
    """The latest database time these usage rows gave a permit back at, into `@orbit_freed` and
    read (one statement: it sets the variable as it answers): run after this transaction's own
    UPDATEs have locked them, so it can no longer move."""
    parts = [f"SELECT permits_freed_at AS f FROM {table} WHERE {column} IN ({placeholders(len(ids))})"
             for (table, column), ids in ((_TABLES[QUEUE], queue_ids), (_TABLES[APPLICATION], application_ids),
                                          (_TABLES[KEY], resource_key_ids)) if ids]
    params = [*queue_ids, *application_ids, *resource_key_ids]
    return Stmt(f"SELECT CAST(@orbit_freed := (SELECT MAX(f) FROM ({' UNION ALL '.join(parts)}) AS freed) "
                "AS DATETIME(6)) AS freed", params)


async def note_unleased(tx: Tx, freed: dict[str, int]) -> None:
    """`freed` permits were given back per queue by this transaction: once it commits,
    `tx.claimable` holds, per queue, how many of them a waiting task may take (at most its
    unfinished tasks that hold no lease). Read after this transaction's own UPDATEs, in the
    COMMIT's round trip where writes wait for it."""
    ids = sorted(freed)
    stmt = Stmt(f"SELECT queue_id, unfinished - permits_in_use AS unleased FROM queue_usage "
                f"WHERE queue_id IN ({placeholders(len(ids))})", ids)

    def note(rows: list[list[dict[str, Any]]]) -> None:
        for r in rows[0]:
            tx.work_in(r["queue_id"], min(freed[r["queue_id"]], int(r["unleased"])))

    await tx.read_after_writes([stmt], note)


def window_of(row: Any) -> RateWindow:
    """The rate window a queue's or an application's usage row holds."""
    return RateWindow(row["rate_window_start"], int(row["rate_window_used"]), int(row["rate_reserved"]))


def queue_unfinished(queue_id: str, *, lock: bool = False) -> Stmt:
    return Stmt(f"SELECT unfinished FROM queue_usage WHERE queue_id = ?{'{FOR_UPDATE}' if lock else ''}", (queue_id,))


def backlog(queue_id: str, application_id: str) -> Stmt:
    """Unlocked: the queue's and the application's unfinished counts and limits."""
    return Stmt("SELECT qu.unfinished AS queue_unfinished, q.max_unfinished_tasks AS queue_limit, "
                "au.unfinished AS app_unfinished, a.max_unfinished_tasks AS app_limit "
                "FROM queue_usage qu, queues q, application_usage au, applications a "
                "WHERE qu.queue_id = ? AND q.id = ? AND au.application_id = ? AND a.id = ?",
                (queue_id, queue_id, application_id, application_id))


def waiting_counts(queue_id: str) -> Stmt:
    """The queue's waiting tasks, due and not yet due at the database clock (from the dispatch
    index alone), with that clock."""
    return Stmt("SELECT COUNT(*) AS waiting, COALESCE(SUM(CASE WHEN available_at > {NOW} THEN 1 ELSE 0 END), 0) "
                "AS not_due, {NOW} AS db_now FROM tasks WHERE queue_id = ? AND waiting = 1", (queue_id,))


def held_counts(queue_id: str) -> Stmt:
    """The queue's unfinished tasks past WAITING, per state."""
    return Stmt("SELECT state, COUNT(*) AS n FROM tasks WHERE queue_id = ? "
                "AND state_group IN ('HELD', 'NEEDS_REVIEW') GROUP BY state", (queue_id,))


def live_queue_rows() -> Stmt:
    """Every queue not retired with its usage counters and the database clock: the per-queue
    gauges of one metrics read, for all queues at once."""
    return Stmt("SELECT q.id AS queue_id, q.namespace_id, q.paused, q.max_concurrency, q.rate_per_second, "
                "q.max_unfinished_tasks, u.unfinished, u.permits_in_use, u.rate_window_start, "
                "u.rate_window_used, u.rate_reserved, {NOW} AS db_now "
                "FROM queues q JOIN queue_usage u ON u.queue_id = q.id WHERE q.retired_at IS NULL")


def live_state_counts() -> Stmt:
    """Unfinished tasks per queue and state, with the waiting ones not yet due and when the longest
    waiting due one became due. Only queues whose `unfinished` counter is above zero are looked
    into: the waiting tasks in one range of the dispatch index (which holds `available_at`), the
    held ones in one range of `ix_tasks_queue_group` per state group, so that finished tasks are never
    read (the dispatch index keeps them all in its not-waiting range). The join order is fixed,
    so that neither backend scans an index whole instead."""
    held = "(SELECT 'HELD' AS state_group UNION ALL SELECT 'NEEDS_REVIEW') s"
    waiting = ("SELECT t.queue_id, 'WAITING' AS state, COUNT(*) AS n, "
               "COALESCE(SUM(CASE WHEN t.available_at > {NOW} THEN 1 ELSE 0 END), 0) AS not_due, "
               "MIN(CASE WHEN t.available_at <= {NOW} THEN t.available_at END) AS due_since_at ")
    others = "SELECT t.queue_id, t.state, COUNT(*) AS n, 0 AS not_due, NULL AS due_since_at "
    return Stmt(f"{waiting}FROM queue_usage u STRAIGHT_JOIN tasks t FORCE INDEX (ix_tasks_dispatch) "
                "ON t.queue_id = u.queue_id AND t.waiting = 1 WHERE u.unfinished > 0 GROUP BY t.queue_id "
                f"UNION ALL {others}FROM queue_usage u STRAIGHT_JOIN {held} STRAIGHT_JOIN tasks t "
                "FORCE INDEX (ix_tasks_queue_group) ON t.queue_id = u.queue_id AND t.state_group = s.state_group "
                "WHERE u.unfinished > 0 GROUP BY t.queue_id, t.state",
                sqlite=f"{waiting}FROM queue_usage u CROSS JOIN tasks t INDEXED BY ix_tasks_dispatch "
                "WHERE t.queue_id = u.queue_id AND t.waiting = 1 AND u.unfinished > 0 GROUP BY t.queue_id "
                f"UNION ALL {others}FROM queue_usage u CROSS JOIN {held} CROSS JOIN tasks t "
                "INDEXED BY ix_tasks_queue_group WHERE t.queue_id = u.queue_id AND t.state_group = s.state_group "
                "AND u.unfinished > 0 GROUP BY t.queue_id, t.state")


def insert_queue_row(queue_id: str) -> Stmt:
    return Stmt("INSERT INTO queue_usage (queue_id, unfinished, permits_in_use, rate_window_start, "
                "rate_window_used, rate_reserved, priority_levels) VALUES (?, 0, 0, NULL, 0, 0, 0)", (queue_id,))


def insert_resource_key_row(resource_key_id: str) -> Stmt:
    return Stmt("INSERT INTO resource_key_usage (resource_key_id, unfinished, permits_in_use) VALUES (?, 0, 0)",
                (resource_key_id,))


def resource_key_rows(resource_key_ids: list[str], *, lock: bool = False) -> Stmt:
    """The keys' usage rows in id order; `lock` locks them (after the queues' and applications' rows)."""
    return Stmt(f"SELECT * FROM resource_key_usage WHERE resource_key_id IN ({placeholders(len(resource_key_ids))}) "
                f"ORDER BY resource_key_id{'{FOR_UPDATE}' if lock else ''}", resource_key_ids)


def insert_application_row(application_id: str) -> Stmt:
    return Stmt("INSERT INTO application_usage (application_id, unfinished, permits_in_use, rate_window_start, "
                "rate_window_used, rate_reserved) VALUES (?, 0, 0, NULL, 0, 0)", (application_id,))


_KEPT = ("unfinished", "permits_in_use", "rate_reserved")  # the counters every usage row has


class Counters:
    """Changes to one usage row's counters: the three every queue keeps, plus any other a
    migration adds (by column name)."""

    __slots__ = ("unfinished", "permits_in_use", "rate_reserved", "other")

    def __init__(self) -> None:
        self.unfinished = self.permits_in_use = self.rate_reserved = 0
        self.other: dict[str, int] | None = None

    def absorb(self, changes: Iterable[tuple[str, int]]) -> None:
        for column, n in changes:
            if column in _KEPT:
                setattr(self, column, getattr(self, column) + n)
            else:
                self.other = self.other or {}
                self.other[column] = self.other.get(column, 0) + n

    def items(self) -> list[tuple[str, int]]:
        """(column, change) of every counter that changes, in a fixed order."""
        out = [(c, n) for c, n in zip(_KEPT, (self.unfinished, self.permits_in_use, self.rate_reserved),
                                      strict=True) if n]
        if self.other:
            out += [(c, self.other[c]) for c in sorted(self.other) if self.other[c]]
        return out


# The queue's cumulative throughput counters (core/throughput.py), per terminal state that has one.
_ENDED_TOTALS = {states.SUCCEEDED: "succeeded_total", states.FAILED: "failed_total"}

QUEUE, APPLICATION = "queue", "application"  # the layers whose usage rows keep a rate window
KEY = "resource_key"
_TABLES = {QUEUE: ("queue_usage", "queue_id"), APPLICATION: ("application_usage", "application_id"),
           KEY: ("resource_key_usage", "resource_key_id")}
_NODE_IN_FLIGHT = "UPDATE queue_nodes SET in_flight = GREATEST(in_flight, ?) - ? WHERE queue_id = ? AND worker_node_id = ?"


class UsageChanges:
    """Counter changes of one transaction, written to the usage rows together, last.

    Counters are named by their columns; a change without an application id counts on the
    queue's row only. A task's resource keys (`keys`) count its unfinished state and its
    permits as the queue does; the worker node holding a lease (`node`) counts its permits
    of the queue. Rate windows are kept per layer (`QUEUE`, `APPLICATION`) and row id."""

    def __init__(self) -> None:
        self.queues: dict[str, Counters] = defaultdict(Counters)
        self.apps: dict[str, Counters] = defaultdict(Counters)
        self.keys: dict[str, Counters] = defaultdict(Counters)
        self.nodes: dict[tuple[str, str], int] = defaultdict(int)
        self.windows: dict[tuple[str, str], tuple[datetime | None, int]] = {}
        self.starts: dict[tuple[str, str], tuple[int, int, datetime]] = {}
        self.grants: dict[tuple[str, str], datetime] = {}
        self.levels: dict[str, int] = {}

    def note_levels(self, queue_id: str, levels: int) -> None:
        """Tasks of these priority levels (bit mask) entered the queue."""
        self.levels[queue_id] = self.levels.get(queue_id, 0) | levels
        self.queues[queue_id]  # noqa: B018 - the queue's row is written even if no counter changes

    def add(self, queue_id: str, application_id: str | None, unfinished: int = 0, permits_in_use: int = 0,
            rate_reserved: int = 0, *, keys: Iterable[str] = (), node: str | None = None, **other: int) -> None:
        rows = (self.queues[queue_id],) if application_id is None else (self.queues[queue_id],
                                                                         self.apps[application_id])
        for row in rows:
            row.unfinished += unfinished
            row.permits_in_use += permits_in_use
            row.rate_reserved += rate_reserved
            if other:
                row.absorb(other.items())
        self.count_keys(keys, unfinished=unfinished, permits_in_use=permits_in_use)
        if node is not None and permits_in_use:
            self.nodes[(queue_id, node)] += permits_in_use

    def count_queue(self, queue_id: str, **columns: int) -> None:
        """Counters that only the queue's row keeps (`add` counts its `other` columns on the
        application's row too)."""
        self.queues[queue_id].absorb(columns.items())

    def count_started(self, queue_id: str) -> None:
        """An attempt of the queue's started (its throughput counter)."""
        self.count_queue(queue_id, started_total=1)

    def count_ended(self, queue_id: str, state: str) -> None:
        """A task of the queue ended in `state`: its throughput counter, if that state has one."""
        column = _ENDED_TOTALS.get(state)
        if column is not None:
            self.count_queue(queue_id, **{column: 1})

    def count_keys(self, keys: Iterable[str], *, unfinished: int = 0, permits_in_use: int = 0) -> None:
        for key in keys:
            row = self.keys[key]
            row.unfinished += unfinished
            row.permits_in_use += permits_in_use

    def merge(self, other: UsageChanges) -> None:
        for qid, counters in other.queues.items():
            self.queues[qid].absorb(counters.items())
        for aid, counters in other.apps.items():
            self.apps[aid].absorb(counters.items())
        for kid, counters in other.keys.items():
            self.keys[kid].absorb(counters.items())
        for node, n in other.nodes.items():
            self.nodes[node] += n
        self.windows.update(other.windows)

    def set_window(self, key: str, start: datetime | None, used: int, layer: str = QUEUE) -> None:
        """A rate window after this transaction (its reservations change through `add`)."""
        self.windows[(layer, key)] = (start, used)

    def count_starts_in_sql(self, tx: Tx, key: str, n: int, rate: int, now: datetime, layer: str = QUEUE) -> bool:
        """Count `n` Starts at `now` on a window *in the UPDATE itself*, instead of writing a
        window computed from a read: the window as the row holds it when the UPDATE locks it
        gets them exactly as `core.limits.count_starts` would, or the statement fails and the
        transaction raises `PlanNoLongerHolds`. False where the backend cannot (the caller then
        counts them on the window read under the lock)."""
        if not tx.deferring:
            return False
        tx.guard_refusal_means(PlanNoLongerHolds)
        self.windows.pop((layer, key), None)
        self.starts[(layer, key)] = (n, rate, now)
        return True

    def grant_permits_in_sql(self, tx: Tx, now: datetime) -> bool:
        """Take the permits (and rate reservations) a claim planned at `now` on an unlocked read
        *in the UPDATEs themselves*: each usage row as the UPDATE locks it takes them exactly
        when `core.limits.grant_still_fits` would (a key's row: when its limit holds them), or
        the statement fails and the transaction raises `PlanNoLongerHolds`. False where the
        backend cannot (the caller then checks them on rows read under the lock)."""
        if not tx.deferring:
            return False
        tx.guard_refusal_means(PlanNoLongerHolds)
        for layer, rows in ((QUEUE, self.queues), (APPLICATION, self.apps), (KEY, self.keys)):
            for key, counters in rows.items():
                if counters.permits_in_use > 0:
                    self.grants[(layer, key)] = now
        return True

    async def apply(self, tx: Tx) -> None:
        for layer, rows in ((QUEUE, self.queues), (APPLICATION, self.apps), (KEY, self.keys)):
            keys = set(rows) | {k for lay, k in self.windows if lay == layer} | {k for lay, k in self.starts
                                                                                 if lay == layer}
            for key in sorted(keys):
                await self._write(tx, layer, key, rows.get(key) or Counters())
        # A node's count is an attribution for fairness, not a limit: it never goes below zero.
        for (queue_id, node), n in sorted(self.nodes.items()):
            if n < 0:
                await tx.defer(Stmt(_NODE_IN_FLIGHT, (-n, -n, queue_id, node),
                                    sqlite=_NODE_IN_FLIGHT.replace("GREATEST", "MAX")))
            elif n > 0:
                await tx.defer(Stmt("UPDATE queue_nodes SET in_flight = in_flight + ? WHERE queue_id = ? "
                                    "AND worker_node_id = ?", (n, queue_id, node)))

    async def _write(self, tx: Tx, layer: str, key: str, counters: Counters) -> None:
        table, key_column = _TABLES[layer]
        granted = self.grants.get((layer, key))
        if granted is not None and counters.permits_in_use > 0:
            # First: the guard must read the row as it was (rate_reserved changes after it).
            n = counters.permits_in_use
            rest = [(c, m) for c, m in counters.items() if c != "permits_in_use"]
            sets = [_GRANT_PERMITS[layer]] + [f"{column} = {column} + ?" for column, _ in rest]
            params: list[Any] = [n, n] if layer == KEY else [granted, n, granted, n, n]
            params += [m for _, m in rest]
        else:
            sets, params = _counter_sets(counters)
        if counters.permits_in_use < 0:
            if layer == KEY:
                tx.keys_freed.add(key)
            # A claim that planned before locking this row re-times its leases after this.
            now = await tx.now()
            sets.append("permits_freed_at = CASE WHEN permits_freed_at IS NULL OR permits_freed_at < ? "
                        "THEN ? ELSE permits_freed_at END")
            params += [now, now]
        if layer == QUEUE and self.levels.get(key):
            sets.append("priority_levels = priority_levels | ?")
            params.append(self.levels[key])
        w = self.windows.get((layer, key))
        if w is not None:
            sets += ["rate_window_start = ?", "rate_window_used = ?"]
            params += [w[0], w[1]]
        counted = self.starts.get((layer, key))
        if counted is not None:
            n, rate, now = counted
            sets += [COUNT_STARTS_USED, COUNT_STARTS_START]  # in this order: the first reads the old start
            params += [now, now, n, rate, n, n, rate, n, now, now]
        if not sets:
            return
        waiting = tx.open_usage.pop((table, key), None)
        if waiting is not None:
            # The row's backlog slots, still waiting: one UPDATE takes both (slots first, as sent).
            handle, first_sets, first_params = waiting
            merged = Stmt(f"UPDATE {table} SET {first_sets}, {', '.join(sets)} WHERE {key_column} = ?",
                          [*first_params, *params, key])
            if tx.revise(handle, merged):
                return
        await tx.defer(Stmt(f"UPDATE {table} SET {', '.join(sets)} WHERE {key_column} = ?", [*params, key]))


# `core.limits.count_starts` in SQL. The window is open at `now` when it started at most a second
# before; one opened by a transaction with a later clock cannot take these Starts (NULL); a window
# that ended gives way to one at `now`.
COUNT_STARTS_USED = (
    "rate_window_used = CASE WHEN rate_window_start > ? THEN NULL "
    "WHEN rate_window_start + INTERVAL 1 SECOND > ? THEN "
    "CASE WHEN rate_window_used + ? <= ? THEN rate_window_used + ? END "
    "WHEN ? <= ? THEN ? END")
COUNT_STARTS_START = ("rate_window_start = CASE WHEN rate_window_start + INTERVAL 1 SECOND > ? "
                      "THEN rate_window_start ELSE ? END")


# `core.limits.grant_still_fits` in SQL for a claim's `n` leases planned at `now`, then its permits
# taken; every term is a sum, the counters being unsigned. Params: now, n, now, n, n.
def _grant_permits(table: str, key_column: str, controls: str) -> str:
    return (f"permits_in_use = CASE WHEN ({table}.rate_window_start IS NULL OR {table}.rate_window_start <= ?) "
            f"AND EXISTS (SELECT 1 FROM {controls} g WHERE g.id = {table}.{key_column} AND g.paused = 0 "
            f"AND {table}.permits_in_use + ? <= g.max_concurrency "
            f"AND CASE WHEN {table}.rate_window_start + INTERVAL 1 SECOND > ? THEN {table}.rate_window_used ELSE 0 END "
            f"+ {table}.rate_reserved + ? <= g.rate_per_second) THEN permits_in_use + ? END")


_GRANT_PERMITS = {
    QUEUE: _grant_permits("queue_usage", "queue_id", "queues"),
    APPLICATION: _grant_permits("application_usage", "application_id", "applications"),
    # A resource key's limit is its concurrency alone. Params: n, n.
    KEY: ("permits_in_use = CASE WHEN EXISTS (SELECT 1 FROM resource_keys g WHERE g.id = "
          "resource_key_usage.resource_key_id AND resource_key_usage.permits_in_use + ? <= g.max_concurrency) "
          "THEN permits_in_use + ? END"),
}


def _counter_sets(counters: Counters) -> tuple[list[str], list[Any]]:
    changes = counters.items()
    return [f"{column} = {column} + ?" for column, _ in changes], [n for _, n in changes]


# `core.limits.backlog_fits` in SQL, for the queue's and the application's usage rows.
_TAKE_QUEUE_SETS = ("unfinished = CASE WHEN unfinished + ? <= (SELECT max_unfinished_tasks FROM queues WHERE id = ?) "
                    "THEN unfinished + ? ELSE NULL END, priority_levels = priority_levels | ?")
_TAKE_APP_SETS = ("unfinished = CASE WHEN unfinished + ? <= (SELECT max_unfinished_tasks FROM applications "
                  "WHERE id = ?) THEN unfinished + ? ELSE NULL END")
_TAKE_QUEUE_SLOTS_IF = ("UPDATE queue_usage SET unfinished = unfinished + ?, priority_levels = priority_levels | ? "
                        "WHERE queue_id = ? "
                        "AND unfinished + ? <= (SELECT max_unfinished_tasks FROM queues WHERE id = ?)")
_TAKE_APP_SLOTS_IF = ("UPDATE application_usage SET unfinished = unfinished + ? WHERE application_id = ? "
                      "AND unfinished + ? <= (SELECT max_unfinished_tasks FROM applications WHERE id = ?)")


async def take_backlog_slots(tx: Tx, queue_id: str, application_id: str, n: int, levels: int = 0) -> str | None:
    """Take `n` unfinished-task slots in the queue and its application if both have room, and
    note the priority `levels` (bit mask) of the tasks taking them.

    Returns None when taken, else the limit that refused (`QUEUE_FULL`, `APPLICATION_FULL`;
    the rollback returns whatever was taken). On MySQL the guarded UPDATEs travel with the
    COMMIT, so the hot usage rows are locked for no round trip at all; a refusal then
    surfaces there as `PlanNoLongerHolds` and the caller decides again under the lock.
    """
    if tx.deferring:
        tx.guard_refusal_means(PlanNoLongerHolds)
        for layer, key, sets, params in ((QUEUE, queue_id, _TAKE_QUEUE_SETS, [n, queue_id, n, levels]),
                                         (APPLICATION, application_id, _TAKE_APP_SETS, [n, application_id, n])):
            table, key_column = _TABLES[layer]
            handle = await tx.defer_revisable(Stmt(f"UPDATE {table} SET {sets} WHERE {key_column} = ?", [*params, key]))
            tx.open_usage[(table, key)] = (handle, sets, params)
        return None
    taken, app_taken = await tx.counts([Stmt(_TAKE_QUEUE_SLOTS_IF, (n, levels, queue_id, n, queue_id)),
                                        Stmt(_TAKE_APP_SLOTS_IF, (n, application_id, n, application_id))])
    if taken == 1 and app_taken == 1:
        return None
    return "QUEUE_FULL" if taken != 1 else "APPLICATION_FULL"


def application_usage_unfinished(application_id: str, *, lock: bool = False) -> Stmt:
    """The application's unfinished count alone: locking it must not lock the `applications` row."""
    return Stmt(f"SELECT unfinished FROM application_usage WHERE application_id = ?{'{FOR_UPDATE}' if lock else ''}",
                (application_id,))


def application_limit(application_id: str) -> Stmt:
    return Stmt("SELECT max_unfinished_tasks FROM applications WHERE id = ?", (application_id,))
