"""A write deferred with `Tx.defer_revisable` can be replaced while it still waits for its round
trip (a transaction's later steps add their events to the batch row an earlier step deferred);
once that round trip went, or where writes do not wait (SQLite), it cannot."""

from __future__ import annotations

import pytest

from orbit.server.store.dialect import MYSQL
from orbit.server.store.tx import Stmt

pytestmark = pytest.mark.anyio

_SET = "UPDATE queue_usage SET priority_levels = ? WHERE queue_id = ?"


async def _levels(db, queue_id: str) -> int:
    async def read(tx):
        return (await tx.rows(Stmt("SELECT priority_levels FROM queue_usage WHERE queue_id = ?", [queue_id])))[0]

    return int((await db.read(read))["priority_levels"])


async def test_a_waiting_write_is_replaced_before_its_round_trip(db, tenant):
    queue_id = (await tenant.create_queue())["id"]

    async def body(tx):
        handle = await tx.defer_revisable(Stmt(_SET, [3, queue_id]))
        return tx.revise(handle, Stmt(_SET, [5, queue_id]))

    revised = await db.transaction(body)
    assert revised == (db.dialect == MYSQL)
    assert await _levels(db, queue_id) == (5 if db.dialect == MYSQL else 3)


async def test_a_write_that_went_with_a_round_trip_is_not_replaced(db, tenant):
    queue_id = (await tenant.create_queue())["id"]

    async def body(tx):
        handle = await tx.defer_revisable(Stmt(_SET, [7, queue_id]))
        await tx.rows(Stmt("SELECT 1 AS one"))  # carries the deferred write
        return tx.revise(handle, Stmt(_SET, [9, queue_id]))

    assert await db.transaction(body) is False
    assert await _levels(db, queue_id) == 7
