"""A claim's first read finds its candidates without locks and locks them by primary key (on
MySQL: a locking scan would walk every entry that purge has not removed yet). Whatever that read
passes over, the claim still takes the due tasks in dispatch order, as a locking scan would."""

import asyncio

import pytest

from orbit.server.store.dialect import MYSQL
from orbit.server.store.queries import tasks as task_q
from orbit.server.store.tx import Stmt

from .test_worker_protocol import submit
from .worker_client import Worker

pytestmark = pytest.mark.anyio


async def _claim(base, tenant, queue_id: str, n: int) -> list[str]:
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(queue_id)
        got = await w.call("claim", queue_id=queue_id, max_tasks=n)
        assert got["ok"], got
        return [t["task_id"] for t in got["tasks"]]


async def test_a_claim_passes_over_a_task_another_transaction_holds_and_takes_the_next(tenant, base):
    if tenant.db.dialect != MYSQL:
        pytest.skip("SQLite has one writer: no other transaction holds a row while a claim runs")
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    ids = await submit(tenant, q["id"], 4)
    held, done = asyncio.Event(), asyncio.Event()

    async def hold(tx):
        await tx.rows(Stmt("SELECT id FROM tasks WHERE id = ?{FOR_UPDATE}", (ids[0],)))
        held.set()
        await done.wait()

    holder = asyncio.create_task(tenant.db.transaction(hold))
    await held.wait()
    try:
        # The first two candidates include the held task: the claim scans on and takes two.
        assert await _claim(base, tenant, q["id"], 2) == ids[1:3]
    finally:
        done.set()
        await holder
    assert await _claim(base, tenant, q["id"], 2) == [ids[0], ids[3]]


async def test_the_candidates_read_finds_what_a_locking_scan_finds(tenant):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    ids = [*await submit(tenant, q["id"], 2, priority=3), *await submit(tenant, q["id"], 3, priority=8)]

    async def both(tx):
        scan = await tx.rows(task_q.claimable(q["id"], 4, skip_locked=True))
        rows, passed_over = task_q.locked_candidates(
            await tx.rows(task_q.claimable(q["id"], 4, skip_locked=True, candidates=True)))
        return scan, rows, passed_over

    scan, rows, passed_over = await tenant.db.transaction(both)
    assert not passed_over
    assert rows == scan and sorted(r["id"] for r in rows) == sorted(ids)
    assert [r["id"] for r in rows] == [*ids[2:], *ids[:2]]  # each level in order, the highest first
