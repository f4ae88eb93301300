"""Whatever a value is, it reads back as it was written through the store's write paths, on both
backends: multi-row INSERTs and deferred UPDATEs, which on MySQL travel as text built with
Orbit's own literals (`store/literals.py`) and on SQLite as parameters."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import strategies as st

from orbit.server.core.ids import new_id
from orbit.server.store.queries import tasks as task_q
from orbit.server.store.tx import Stmt

from .test_usage_guards import run_examples

TRICKY = st.sampled_from(['"', "'", "\\", "\\'", "''", "\0", "\n", "\r", "\032", "%", "%s", "%%", "\\%", "?",
                          "{NOW}", "{FOR_UPDATE}", "'); DROP TABLE events; --", "é ü 𝄞 😀", ""])
TEXT = st.one_of(TRICKY, st.text(max_size=40), st.lists(TRICKY, max_size=6).map("".join))
# Up to 2**63 - 1: SQLite integers are signed 64-bit (Orbit's counters never come near).
ROWS = st.lists(st.tuples(TEXT, st.integers(min_value=0, max_value=2**63 - 1)), min_size=1, max_size=8)
CASES = st.tuples(ROWS, TEXT)
INSERT_BATCH = Stmt("INSERT INTO event_batches (batch_id, namespace_id, seq, count, created_at, events) "
                    "VALUES (?, ?, ?, ?, ?, ?)")


async def _write_and_read(db, case: tuple[list[tuple[str, int]], str]) -> None:
    rows, changed = case
    ns = new_id()
    when = datetime(2026, 12, 1, 12, 0, 0, 123456)
    ids = [new_id() for _ in rows]

    async def write(tx):
        await tx.defer_rows(INSERT_BATCH, [(rid, ns, seq, 1, when, data)
                                           for rid, (data, seq) in zip(ids, rows, strict=True)])
        # A deferred UPDATE fills its parameters in (rather than a VALUES list) on MySQL.
        await tx.defer(Stmt("UPDATE event_batches SET events = ? WHERE namespace_id = ? AND batch_id = ?",
                            (changed, ns, ids[0])))

    await db.transaction(write)
    got = await db.read(lambda tx: tx.rows(Stmt(
        "SELECT seq, created_at, events FROM event_batches WHERE namespace_id = ? ORDER BY batch_id", (ns,))))
    assert [(r["events"], int(r["seq"])) for r in got] == [(changed, rows[0][1]), *rows[1:]]
    assert all(r["created_at"] == when for r in got)


def test_values_read_back_as_they_were_written(db_url):
    run_examples(db_url, _write_and_read, CASES, max_examples=150)


@pytest.mark.anyio
async def test_task_rows_read_back_whole_with_the_columns_null_in_all_of_them_left_out(db):
    """`task_q.insert` leaves out the columns NULL in every row it writes (they default to
    NULL): rows of one statement with different columns set, and rows with none, read back
    exactly as given."""
    when = datetime(2026, 12, 1, 12, 0, 0, 123456)
    ns, app, queue = new_id(), new_id(), new_id()

    def row(**set_: object) -> dict[str, object]:
        values = {c: None for c in task_q.COLUMNS}
        values.update(id=new_id(), namespace_id=ns, application_id=app, queue_id=queue, state="WAITING",
                      payload='{"n":1}', priority=5, resource_keys="[]", max_attempts=3, attempts=0,
                      retry_policy='{"initial_backoff_ms":1000}', on_lease_lost="review", available_at=when,
                      cancel_requested=False, created_at=when, updated_at=when, **set_)
        return values

    plain = row()
    rich = row(schedule_id=new_id(), trigger_at=when, deadline_at=when, sweep_at=when, traceparent="00-" + "a" * 32
               + "-" + "b" * 16 + "-01")
    alone = row(start_deadline_at=when)

    async def write(tx):
        await task_q.insert(tx, [plain, rich])
        await task_q.insert(tx, [alone])

    await db.transaction(write)
    for written in (plain, rich, alone):
        (got,) = await db.read(lambda tx, w=written: tx.rows(task_q.by_id(ns, w["id"], payload=True)))
        assert {c: got[c] for c in task_q.COLUMNS} == {**written, "cancel_requested": got["cancel_requested"]}
        assert not got["cancel_requested"]


@pytest.mark.anyio
async def test_rows_whose_shared_values_travel_as_session_variables_read_back_when_reordered(db):
    """Two multi-row INSERTs of one transaction, each with values shared by all its rows (on
    MySQL: session variables set just before it), and `lead_commit` moving the second before
    the first: each keeps its own values."""
    first_ns, second_ns = new_id(), new_id()
    first_at = datetime(2026, 12, 1, 12, 0, 0, 111111)
    second_at = datetime(2026, 12, 2, 12, 0, 0, 222222)
    written = {ns: [(new_id(), ns, None, 1, when, f"[{i}]") for i in range(3)]
               for ns, when in ((first_ns, first_at), (second_ns, second_at))}

    async def write(tx):
        await tx.defer_rows(INSERT_BATCH, written[first_ns])
        await tx.defer(Stmt("UPDATE event_batches SET count = 2 WHERE namespace_id = ?", (first_ns,)))
        await tx.defer_rows(Stmt("INSERT INTO event_batches (batch_id, namespace_id, seq, count, created_at, events) "
                                 "VALUES (?, ?, ?, ?, ?, ?)"), written[second_ns])
        tx.lead_commit("INSERT INTO event_batches (batch_id, namespace_id, seq, count, created_at, events) ")

    await db.transaction(write)
    for ns, count in ((first_ns, 2), (second_ns, 1)):
        got = await db.read(lambda tx, ns=ns: tx.rows(Stmt(
            "SELECT batch_id, namespace_id, count, created_at, events FROM event_batches WHERE namespace_id = ? "
            "ORDER BY batch_id", (ns,))))
        assert [(r["batch_id"], r["namespace_id"], int(r["count"]), r["created_at"], r["events"]) for r in got] == \
            [(b, n, count, when, events) for b, n, _, _, when, events in sorted(written[ns])]
