"""Migration 000017 copies each batch's event rows, in id order, into the batch's `events` array
(time formatted as the feed shows it, data as written) and drops the `events` table, on both
backends."""

from __future__ import annotations

import orjson
from sqlalchemy import inspect, text

from .migration_steps import run, to

BATCH = ("INSERT INTO event_batches (batch_id, namespace_id, seq, count, created_at) "
         "VALUES (:b, :ns, :seq, :n, '2026-01-01 00:00:00')")
EVENT = ("INSERT INTO events (namespace_id, batch_id, type, time, resource_type, resource_id, data) "
         "VALUES (:ns, :b, :type, :time, 'task', :rid, :data)")


def test_event_rows_move_into_their_batches(empty_db_url):
    run(empty_db_url, to("000016"))
    ns = "a" * 32
    batches = [(f"{i:032x}", i) for i in range(1, 4)]
    events = []
    for b, seq in batches:
        n = 600 if seq == 2 else seq
        for k in range(n):
            events.append({"ns": ns, "b": b, "type": f"task.t{k % 3}", "time": f"2026-01-01 00:00:0{seq}.123456",
                           "rid": f"{seq * 1000 + k:032x}", "data": orjson.dumps({"k": k, "s": "é'\""}).decode()})

    def write(conn) -> None:
        for b, seq in batches:
            conn.execute(text(BATCH), {"b": b, "ns": ns, "seq": seq, "n": sum(e["b"] == b for e in events)})
        for e in events:
            conn.execute(text(EVENT), e)

    run(empty_db_url, write)
    run(empty_db_url, to("000017"))
    found: dict[str, object] = {}

    def read(conn) -> None:
        found["bodies"] = {r[0]: orjson.loads(r[1]) for r in conn.execute(
            text("SELECT batch_id, events FROM event_batches ORDER BY batch_id"))}
        found["tables"] = inspect(conn).get_table_names()

    run(empty_db_url, read)
    assert "events" not in found["tables"]
    for b, seq in batches:
        want = [[e["type"], f"2026-01-01T00:00:0{seq}.123456Z", "task", e["rid"], orjson.loads(e["data"])]
                for e in events if e["b"] == b]
        assert found["bodies"][b] == want
