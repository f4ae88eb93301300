"""Migration 000015 numbers the audit records already written, per namespace in id order (the
order they were read in before), and starts each namespace's sequencer after them, on both
backends."""

from __future__ import annotations

from sqlalchemy import text

from .migration_steps import run, to

RECORD = ("INSERT INTO audit_records (id, namespace_id, time, action, resource_type, resource_id) "
          "VALUES (:id, :ns, '2026-01-01 00:00:00', 'queue.create', 'queue', :id)")


def test_existing_records_are_numbered_in_id_order_per_namespace(empty_db_url):
    run(empty_db_url, to("000014"))
    a, b = "a" * 32, "b" * 32
    rows = [("01" + "0" * 30, a), ("02" + "0" * 30, b), ("03" + "0" * 30, a), ("04" + "0" * 30, None),
            ("05" + "0" * 30, a)]
    run(empty_db_url, lambda conn: [conn.execute(text(RECORD), {"id": i, "ns": ns}) for i, ns in rows])
    run(empty_db_url, to("000015"))
    found: dict[str, list] = {}

    def read(conn) -> None:
        found["records"] = [tuple(r) for r in conn.execute(text("SELECT id, seq FROM audit_records ORDER BY id"))]
        found["sequencers"] = [tuple(r) for r in conn.execute(
            text("SELECT namespace_id, last_seq FROM audit_sequencers ORDER BY namespace_id"))]

    run(empty_db_url, read)
    assert found["records"] == [("01" + "0" * 30, 1), ("02" + "0" * 30, 1), ("03" + "0" * 30, 2),
                                ("04" + "0" * 30, None), ("05" + "0" * 30, 3)]
    assert found["sequencers"] == [(a, 3), (b, 1)]
