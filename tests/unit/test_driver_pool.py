"""The store's connection pool (store/pool.py): bounded waits, connections opened side by side,
broken or idle-too-long ones never handed out."""

from __future__ import annotations

import asyncio
import time

import pytest

from orbit.server.store.pool import DriverPool

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class FakeConn:
    def __init__(self, n: int) -> None:
        self.n = n
        self.connected = True
        self._stream_broken = False
        self.in_transaction = False
        self.last_usage = asyncio.get_running_loop().time()

    def get_transaction_status(self) -> bool:
        return self.in_transaction

    def close(self) -> None:
        self.connected = False

    async def ensure_closed(self) -> None:
        self.connected = False


def pool_of(maxsize: int, connect_s: float = 0.0, recycle_s: float = 1800) -> tuple[DriverPool, list[FakeConn]]:
    opened: list[FakeConn] = []

    async def connect() -> FakeConn:
        await asyncio.sleep(connect_s)
        opened.append(FakeConn(len(opened)))
        return opened[-1]

    return DriverPool(connect, maxsize=maxsize, recycle_s=recycle_s), opened


async def test_connections_are_opened_side_by_side_and_kept():
    pool, opened = pool_of(3, connect_s=0.1)
    started = time.monotonic()
    conns = await asyncio.gather(*(pool.acquire(1.0) for _ in range(3)))
    assert time.monotonic() - started < 0.25  # three connects at once, not one after another
    assert len(opened) == 3 and (pool.size, pool.freesize) == (3, 0)
    for c in conns:
        pool.release(c)
    assert (pool.size, pool.freesize) == (3, 3)
    assert await pool.acquire(1.0) is opened[0]  # the longest idle first


async def test_a_wait_for_a_connection_is_bounded():
    pool, _ = pool_of(1)
    held = await pool.acquire(1.0)
    started = time.monotonic()
    assert await pool.acquire(0.05) is None
    assert 0.04 <= time.monotonic() - started < 0.5
    waiter = asyncio.create_task(pool.acquire(1.0))
    await asyncio.sleep(0.01)
    assert pool.waiting == 1
    pool.release(held)
    assert await waiter is held


async def test_broken_idle_too_long_or_mid_transaction_connections_are_not_kept():
    pool, opened = pool_of(3, recycle_s=0.05)
    a, b, c = [await pool.acquire(1.0) for _ in range(3)]
    b.in_transaction = True
    pool.release(a)
    pool.release(b)  # closed: its transaction was left open
    assert not b.connected and pool.size == 2
    a._stream_broken = True  # the server closed it while it was idle
    fresh = await pool.acquire(1.0)
    assert fresh is opened[3] and not a.connected
    pool.release(fresh)
    await asyncio.sleep(0.06)
    again = await pool.acquire(1.0)
    assert again is opened[4] and not fresh.connected  # idle longer than recycle_s
    pool.release(again)
    pool.release(c)
    await pool.clear()
    assert (pool.size, pool.freesize) == (0, 0) and not c.connected


async def test_a_failed_connect_gives_its_slot_back():
    attempts = 0

    async def connect() -> FakeConn:
        nonlocal attempts
        attempts += 1
        raise OSError("refused")

    pool = DriverPool(connect, maxsize=1, recycle_s=1800)
    for _ in range(3):
        with pytest.raises(OSError):
            await pool.acquire(0.05)
    assert attempts == 3 and pool.size == 0
