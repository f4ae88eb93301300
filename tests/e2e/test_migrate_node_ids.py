"""Migration 000014 widens the worker node_id columns to 128 characters and keeps their rows,
on both backends (SQLite rebuilds the tables, MariaDB alters them in place)."""

from __future__ import annotations


from sqlalchemy import text

from .migration_steps import run, to

LEASE = ("INSERT INTO leases (id, task_id, queue_id, application_id, namespace_id, credential_id, session_id, "
         "worker_node_id, server_node_id, attempt, state, reserved, leased_at, expires_at, push_pending) VALUES "
         "(:id, :id, :id, :id, :id, :id, :id, :node, 'server', 1, 'ENDED', 0, :at, :at, 0)")
NODE = ("INSERT INTO queue_nodes (queue_id, worker_node_id, last_claim_at, wanting_at, in_flight) "
        "VALUES (:id, :node, :at, NULL, 0)")


def test_node_id_columns_widen_and_keep_their_rows(empty_db_url):
    at = "2026-01-01 00:00:00"
    run(empty_db_url, to("000013"))
    run(empty_db_url, lambda conn: (conn.execute(text(LEASE), {"id": "a" * 32, "node": "n" * 64, "at": at}),
                                     conn.execute(text(NODE), {"id": "a" * 32, "node": "n" * 64, "at": at})))
    run(empty_db_url, to("000014"))
    long = "m" * 127 + "Z"
    run(empty_db_url, lambda conn: (conn.execute(text(LEASE), {"id": "b" * 32, "node": long, "at": at}),
                                     conn.execute(text(NODE), {"id": "b" * 32, "node": long, "at": at})))
    found: dict[str, list] = {}

    def read(conn) -> None:
        for table, key in (("leases", "id"), ("queue_nodes", "queue_id")):
            found[table] = [tuple(r) for r in conn.execute(
                text(f"SELECT {key}, worker_node_id FROM {table} ORDER BY {key}"))]

    run(empty_db_url, read)
    expected = [("a" * 32, "n" * 64), ("b" * 32, long)]
    assert found == {"leases": expected, "queue_nodes": expected}
