"""bench/dispatch_db.py --driver: the timed cursor passes every call through and counts it."""

from __future__ import annotations

import pytest
from bench import dispatch_db
from bench.dispatch_db import DRIVER, _driver_figures, _TimedConnection


class _Cursor:
    description = (("a",), ("b",))
    rowcount = 2

    def __init__(self) -> None:
        self.sets = 2

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None

    async def execute(self, text):
        self.text = text

    async def fetchall(self):
        return [(1, 2), (3, 4)]

    async def nextset(self):
        self.sets -= 1
        return self.sets > 0


class _Connection:
    server_status = 0

    def cursor(self):
        return _Cursor()


@pytest.mark.anyio
async def test_calls_go_through_and_are_counted() -> None:
    DRIVER.clear()
    conn = _TimedConnection(_Connection())
    async with conn.cursor() as cur:
        await cur.execute("SELECT 1; SELECT 2")
        assert cur.text == "SELECT 1; SELECT 2" and cur.rowcount == 2
        assert await cur.fetchall() == [(1, 2), (3, 4)]
        assert await cur.nextset() is True
        assert await cur.nextset() is False
    conn.server_status = 7
    assert conn._conn.server_status == 7
    DRIVER["transactions"] = 2
    DRIVER["transaction"] = 0.004
    figures = _driver_figures()["per transaction"]
    assert figures["round trips"] == 0.5 and figures["results"] == 1.0
    assert figures["result sets with rows"] == 0.5 and figures["columns"] == 1.0
    assert figures["transaction"] == 2000
    assert figures["rest of the transaction"] == 2000 - figures["execute"] - figures["nextset"] - figures["fetchall"]
    assert not DRIVER and dispatch_db.DRIVER is DRIVER
