"""Whatever a value is, it reads back as it was written through the store's write paths, on both
backends: multi-row INSERTs and deferred UPDATEs, which on MySQL travel as text built with
Orbit's own literals (`store/literals.py`) and on SQLite as parameters."""

from __future__ import annotations

from datetime import datetime

from hypothesis import strategies as st

from orbit.server.core.ids import new_id
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
