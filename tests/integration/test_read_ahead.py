"""Reads queued with `Tx.read_ahead` travel with the transaction's next round trip where the
connection takes several statements at once (MySQL), never with its COMMIT; elsewhere they run
when their rows are asked for. A submit sends the reads of the claims it serves this way."""

from __future__ import annotations

import pytest

from orbit.server.store.dialect import MYSQL
from orbit.server.store.tx import Stmt

pytestmark = pytest.mark.anyio


async def test_reads_ahead_travel_with_the_next_round_trip(db):
    async def body(tx):
        ahead = tx.read_ahead([Stmt("SELECT 1 AS one"), Stmt("SELECT ? AS two", [2])])
        own = await tx.rows(Stmt("SELECT 3 AS three"))
        carried = ahead.results is not None
        return own, carried, await tx.rows_ahead(ahead)

    own, carried, rows = await db.transaction(body)
    assert own == [{"three": 3}]  # the round trip's own rows are not mixed with the reads ahead
    assert rows == [[{"one": 1}], [{"two": 2}]]
    assert carried == (db.dialect == MYSQL)


async def test_reads_ahead_never_ride_with_the_commit(db):
    queued = []

    async def body(tx):
        queued.append(tx.read_ahead([Stmt("SELECT 1 AS one")]))
        await tx.defer(Stmt("UPDATE queue_usage SET unfinished = unfinished WHERE queue_id = ?", ["none"]))

    await db.transaction(body)
    assert queued[0].results is None


async def test_reads_ahead_asked_for_before_any_round_trip_run_then(db):
    async def body(tx):
        ahead = tx.read_ahead([Stmt("SELECT 4 AS four")])
        rows = await tx.rows_ahead(ahead)
        # Read once: the next round trip does not carry them again.
        assert await tx.rows(Stmt("SELECT 5 AS five")) == [{"five": 5}]
        return rows, await tx.rows_ahead(ahead)

    first, again = await db.transaction(body)
    assert first == again == [[{"four": 4}]]
