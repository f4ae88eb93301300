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


async def _holding(tenant, task_ids: list[str], body):
    """Run `body()` while another transaction holds these tasks' rows."""
    held, done = asyncio.Event(), asyncio.Event()

    async def hold(tx):
        # By primary key: on a small table MariaDB may read `id IN (…)` through a covering
        # secondary index instead, and then holds every row it passed, not only these.
        await tx.rows(Stmt(f"SELECT id FROM tasks FORCE INDEX (PRIMARY) WHERE id IN ({', '.join('?' * len(task_ids))})"
                           "{FOR_UPDATE}", task_ids))
        held.set()
        await done.wait()

    holder = asyncio.create_task(tenant.db.transaction(hold))
    await held.wait()
    try:
        return await body()
    finally:
        done.set()
        await holder


@pytest.mark.parametrize("held, taken", [
    ([0], [1, 2]),  # the candidates read on past the held task once
    ([0, 2], [1, 3]),  # that is not enough: the claim scans with locks
])
async def test_a_claim_passes_over_tasks_another_transaction_holds_and_takes_the_next(tenant, base, held, taken):
    if tenant.db.dialect != MYSQL:
        pytest.skip("SQLite has one writer: no other transaction holds a row while a claim runs")
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    ids = await submit(tenant, q["id"], 5)
    got = await _holding(tenant, [ids[i] for i in held], lambda: _claim(base, tenant, q["id"], 2))
    assert got == [ids[i] for i in taken]
    rest = [i for i in ids if i not in got]
    assert await _claim(base, tenant, q["id"], 3) == rest


async def test_the_candidates_read_finds_what_a_locking_scan_finds(tenant):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    ids = [*await submit(tenant, q["id"], 2, priority=3), *await submit(tenant, q["id"], 3, priority=8)]

    async def both(tx):
        scan = await tx.rows(task_q.claimable(q["id"], 4, skip_locked=True))
        rows, whole = task_q.locked_candidates(
            await tx.rows(task_q.claimable(q["id"], 4, skip_locked=True, candidates=True)), 4, 4)
        return scan, rows, whole

    scan, rows, whole = await tenant.db.transaction(both)
    assert whole
    assert rows == scan and sorted(r["id"] for r in rows) == sorted(ids)
    assert [r["id"] for r in rows] == [*ids[2:], *ids[:2]]  # each level in order, the highest first
