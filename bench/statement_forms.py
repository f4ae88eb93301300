"""MariaDB's CPU per row for other spellings of the store's multi-row statements, measured before
one is written.

    python bench/statement_forms.py [--rounds 4] [--statements 40]

On a fresh database with Orbit's schema, each form runs `--statements` times per round, the
rounds interleaved (the UPDATEs as many times more as they have fewer rows), every statement rolled back (the same cost for all forms); mariadbd's CPU
comes from /proc. The forms:

- a 500-row `INSERT INTO tasks` as the store writes a batch submit's tasks (every value a
  literal), with the batch's shared values in session variables, without the columns that are
  NULL in every row, and both;
- an `UPDATE` of a report's lease rows (64 and 150 rows, five columns that differ per row) as
  `CASE id WHEN …` (the store's), as a JOIN on a `UNION ALL` of rows, and as a JOIN on a
  `VALUES` table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import asyncmy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._harness import (
    cpu_seconds,
    create_mysql_database,
    drop_mysql_database,
    mysql_params,
    pid_of,
)
from orbit.server.store import migrate
from orbit.server.store.literals import Literals
from orbit.server.store.queries.tasks import COLUMNS

NOW = "'2026-12-05 09:10:21.093649'"
RETRY = "'{\"initial_backoff_ms\":1000,\"max_backoff_ms\":60000,\"multiplier\":2.0,\"jitter\":0.2}'"
NULL_IN_EVERY_ROW = ("schedule_id", "trigger_at", "start_deadline_at", "deadline_at", "cancel_reason", "sweep_at",
                     "result", "error", "finished_at", "resource_key_ids", "parked_on", "traceparent")


# A value as the store quotes it in the statements it sends.
_q = Literals().literal


def insert_forms(ns: str, app: str, queue: str) -> dict[str, Callable[[], str]]:
    """Each form's 500-row statement, new task ids each time."""
    every = f"INSERT INTO tasks ({', '.join(COLUMNS)}) VALUES "
    some = f"INSERT INTO tasks ({', '.join(c for c in COLUMNS if c not in NULL_IN_EVERY_ROW)}) VALUES "

    def full(ns_: str, app_: str, q_: str, retry: str, now: str) -> Callable[[int], str]:
        return lambda i: (f"('{uuid.uuid4().hex}',{ns_},{app_},{q_},NULL,NULL,'WAITING','{{\"n\":{i}}}',5,'[]',3,0,"
                          f"{retry},'review',{now},NULL,NULL,0,NULL,NULL,NULL,NULL,{now},{now},NULL,NULL,NULL,NULL)")

    def short(ns_: str, app_: str, q_: str, retry: str, now: str) -> Callable[[int], str]:
        return lambda i: (f"('{uuid.uuid4().hex}',{ns_},{app_},{q_},'WAITING','{{\"n\":{i}}}',5,'[]',3,0,{retry},"
                          f"'review',{now},0,{now},{now})")

    literals = (_q(ns), _q(app), _q(queue), RETRY, NOW)
    variables = ("@ns", "@app", "@q", "@retry", "@now")
    forms = {"INSERT, every value a literal (the store's)": (every, full(*literals)),
             "INSERT, shared values in session variables": (every, full(*variables)),
             "INSERT, without the columns NULL in every row": (some, short(*literals)),
             "INSERT, both": (some, short(*variables))}
    return {name: (lambda head=head, row=row: head + ",".join(row(i) for i in range(500)))
            for name, (head, row) in forms.items()}


UPDATE_COLUMNS = ("complete_msg_id", "complete_response", "start_msg_id", "start_response", "started_at")


def _lease_values(lease_id: str) -> dict[str, str]:
    return {"complete_msg_id": "m4-" + lease_id[:12], "complete_response": '{"task_state":"SUCCEEDED"}',
            "start_msg_id": "s-" + lease_id,
            "start_response": '{"attempt":1,"started_at":"2026-12-05T09:10:21.099248Z","start_receipt_id":"'
                              + lease_id + '","deadline_at":null}',
            "started_at": "2026-12-05 09:10:21.099248"}


_ENDED = "state = 'ENDED', ended_at = '2026-12-05 09:10:22.000000', outcome = 'SUCCEEDED'"


def update_forms() -> dict[str, Callable[[list[str]], str]]:
    def case(ids: list[str]) -> str:
        rows = {i: _lease_values(i) for i in ids}
        sets = [_ENDED] + [f"{c} = CASE id " + " ".join(f"WHEN {_q(i)} THEN {_q(rows[i][c])}" for i in ids) + " END"
                           for c in UPDATE_COLUMNS]
        return f"UPDATE leases SET {', '.join(sets)} WHERE id IN ({', '.join(_q(i) for i in ids)})"

    def joined(table: str) -> str:
        sets = ", ".join(f"l.{c} = v.{c}" for c in UPDATE_COLUMNS)
        return f"UPDATE leases l JOIN ({table}) v ON l.id = v.id SET {_ENDED.replace('state', 'l.state')}, {sets}"

    def union(ids: list[str]) -> str:
        first, *rest = ids
        rows = [f"SELECT {_q(first)} AS id, " + ", ".join(f"{_q(_lease_values(first)[c])} AS {c}" for c in UPDATE_COLUMNS)]
        rows += ["SELECT " + ", ".join([_q(i)] + [_q(_lease_values(i)[c]) for c in UPDATE_COLUMNS]) for i in rest]
        return joined(" UNION ALL ".join(rows))

    def values(ids: list[str]) -> str:
        rows = ",".join("(" + ", ".join([_q(i)] + [_q(_lease_values(i)[c]) for c in UPDATE_COLUMNS]) + ")" for i in ids)
        return joined(f"WITH v (id, {', '.join(UPDATE_COLUMNS)}) AS (VALUES {rows}) SELECT * FROM v")

    return {"UPDATE, CASE id WHEN (the store's)": case, "UPDATE, JOIN on UNION ALL": union,
            "UPDATE, JOIN on VALUES": values}


async def _cpu_per_row(cur, stmts: list[str], rows: int, mariadbd: int) -> float:
    c0 = cpu_seconds(mariadbd)
    for s in stmts:
        await cur.execute(s)
        assert cur.rowcount == rows, (cur.rowcount, rows)
        await cur.execute("ROLLBACK")
    return (cpu_seconds(mariadbd) - c0) / (len(stmts) * rows) * 1e6


async def run(url: str, rounds: int, statements: int, mariadbd: int) -> None:
    ns, app, queue = (uuid.uuid4().hex for _ in range(3))
    conn = await asyncmy.connect(**mysql_params(url), autocommit=False)
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"SET @ns={_q(ns)}, @app={_q(app)}, @q={_q(queue)}, @now={NOW}, @retry={RETRY}")
            lease_ids = [uuid.uuid4().hex for _ in range(20000)]
            for i in range(0, len(lease_ids), 500):
                await cur.execute(
                    "INSERT INTO leases (id, task_id, queue_id, application_id, namespace_id, credential_id, session_id, "
                    "worker_node_id, server_node_id, attempt, state, reserved, leased_at, expires_at, push_pending) "
                    "VALUES " + ",".join(f"({_q(x)},{_q(x)},{_q(queue)},{_q(app)},{_q(ns)},{_q(ns)},{_q(ns)},'w','s',1,"
                                         f"'LEASED',0,{NOW},{NOW},0)" for x in lease_ids[i:i + 500]))
            await cur.execute("COMMIT")
            figures: dict[str, list[float]] = {}
            inserts = insert_forms(ns, app, queue)
            updates = update_forms()
            pos = 0
            for _ in range(rounds):
                for name, build in inserts.items():
                    figures.setdefault(name, []).append(
                        await _cpu_per_row(cur, [build() for _ in range(statements)], 500, mariadbd))
                for size in (64, 150):
                    for name, build_update in updates.items():
                        stmts = []
                        for _ in range(statements * 500 // size):  # as many rows as the INSERTs
                            start = pos % (len(lease_ids) - size)
                            stmts.append(build_update(lease_ids[start:start + size]))
                            pos += size
                        figures.setdefault(f"{name}, {size} rows", []).append(
                            await _cpu_per_row(cur, stmts, size, mariadbd))
    finally:
        conn.close()
    for name, values in figures.items():
        print(f"{name:58s} MariaDB CPU per row, us: " + " ".join(f"{v:5.1f}" for v in values))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--statements", type=int, default=40, help="statements per form and round")
    args = ap.parse_args()
    mariadbd = pid_of("-x", "mariadbd")
    if mariadbd is None:
        sys.exit("no mariadbd process on this machine")
    url = create_mysql_database()
    try:
        asyncio.run(migrate.upgrade(url))
        asyncio.run(run(url, args.rounds, args.statements, mariadbd))
    finally:
        drop_mysql_database(url)


if __name__ == "__main__":
    main()
