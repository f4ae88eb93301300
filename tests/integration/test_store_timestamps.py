"""Timestamps written and read back through the store's transactions keep their value and their
order on both backends, from year 1 to 9999 (SQLite keeps them as text, whose order must be
time order: a year before 1000 is zero-padded)."""

from __future__ import annotations

from datetime import datetime

import pytest

from orbit.server.core.ids import new_id
from orbit.server.store.tx import Stmt

pytestmark = pytest.mark.anyio

TIMES = [datetime(1, 1, 1), datetime(136, 10, 25, 6, 16, 36), datetime(999, 12, 31, 23, 59, 59, 999999),
         datetime(1000, 1, 1), datetime(2026, 12, 2, 12, 0, 0, 123456), datetime(9999, 12, 31, 23, 59, 59)]


async def test_timestamps_round_trip_in_time_order(db):
    resource = new_id()

    async def write(tx):
        for at in TIMES:
            await tx.count(Stmt("INSERT INTO audit_records (id, namespace_id, time, action, resource_type, "
                                "resource_id) VALUES (?, NULL, ?, 'test.time', 'test', ?)", (new_id(), at, resource)))

    await db.transaction(write)
    rows = await db.read(lambda tx: tx.rows(Stmt(
        "SELECT time FROM audit_records WHERE resource_id = ? ORDER BY time", (resource,))))
    assert [r["time"] for r in rows] == TIMES
    later = await db.read(lambda tx: tx.rows(Stmt(
        "SELECT time FROM audit_records WHERE resource_id = ? AND time > ? ORDER BY time",
        (resource, datetime(500, 1, 1)))))
    assert [r["time"] for r in later] == TIMES[2:]
