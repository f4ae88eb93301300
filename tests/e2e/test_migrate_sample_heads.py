"""Migration 000013 fills `queue_sample_heads` with each queue's latest sample, on both backends."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text

from .migration_steps import run, to

SAMPLE = ("INSERT INTO queue_samples (queue_id, at, started_total, succeeded_total, failed_total) "
          "VALUES (:q, :at, :s, :ok, :f)")


def test_the_heads_are_filled_from_the_latest_samples(empty_db_url):
    run(empty_db_url, to("000012"))
    # As the store writes timestamps (SQLite keeps them as this text).
    samples = [("a" * 32, "2026-01-01 00:00:00.000000", 1, 0, 0), ("a" * 32, "2026-01-01 00:00:05.000000", 4, 2, 1),
               ("a" * 32, "2026-01-01 00:00:10.500000", 9, 3, 1), ("b" * 32, "2026-01-01 00:30:00.000000", 7, 7, 0),
               ("c" * 32, "2025-12-31 23:59:55.000000", 0, 0, 0), ("c" * 32, "2025-12-31 23:00:00.000000", 5, 1, 1)]

    def insert(conn) -> None:
        for q, at, s, ok, f in samples:
            conn.execute(text(SAMPLE), {"q": q, "at": at, "s": s, "ok": ok, "f": f})

    run(empty_db_url, insert)
    run(empty_db_url, to("000013"))
    heads = run(empty_db_url, lambda conn: [
        (r[0], datetime.fromisoformat(str(r[1])), int(r[2]), int(r[3]), int(r[4])) for r in conn.execute(text(
            "SELECT queue_id, at, started_total, succeeded_total, failed_total FROM queue_sample_heads "
            "ORDER BY queue_id"))])
    assert heads == [("a" * 32, datetime(2026, 1, 1, 0, 0, 10, 500000), 9, 3, 1),
                     ("b" * 32, datetime(2026, 1, 1, 0, 30), 7, 7, 0),
                     ("c" * 32, datetime(2025, 12, 31, 23, 59, 55), 0, 0, 0)]
