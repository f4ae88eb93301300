"""`orbit.Worker` claiming ahead (`prefetch`): never more handlers than `concurrency`, a Start only
once a slot is free, tasks claimed ahead given back when no slot frees in time or on a drain. On
both backends, against a real server."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import func, select

import orbit
from orbit.server.store.tables import leases

from .test_sdk_worker import running, server, submit, wait_states, wait_until  # noqa: F401

pytestmark = pytest.mark.anyio


async def _lease_rows(db, queue_id):
    async with db.engine.connect() as conn:
        return (await conn.execute(select(leases.c.task_id, leases.c.outcome, leases.c.started_at)
                                   .where(leases.c.queue_id == queue_id))).all()


async def test_claimed_ahead_never_runs_more_than_concurrency_and_starts_only_with_a_slot(tenant, server, db):
    q = await tenant.create_queue(max_concurrency=100)
    ids = await submit(tenant, q["id"], 40)
    running_now = peak = 0
    started_while_full = []
    worker = orbit.Worker(server, token=tenant.token, queues=[q["id"]], concurrency=4, prefetch=4,
                          claim_wait_ms=200)

    @worker.handler
    async def handle(task: orbit.TaskContext):
        nonlocal running_now, peak
        running_now += 1
        peak = max(peak, running_now)
        if running_now > 4:
            started_while_full.append(task.id)
        await asyncio.sleep(0.02)
        running_now -= 1

    async with running(worker):
        tasks = await wait_states(tenant, ids, timeout=60)
    assert {t["state"] for t in tasks} == {"SUCCEEDED"}
    assert peak <= 4 and not started_while_full
    rows = await _lease_rows(db, q["id"])
    assert sorted(r.task_id for r in rows if r.outcome == "SUCCEEDED") == sorted(ids)


async def test_a_task_claimed_ahead_is_given_back_when_no_slot_frees_in_time(tenant, server, db):
    """One slot, busy far longer than a quarter of the lease: the task claimed ahead is released
    unstarted (no attempt spent) and runs later."""
    q = await tenant.create_queue(max_concurrency=100)
    ids = await submit(tenant, q["id"], 2)
    release_first = asyncio.Event()
    ran: list[str] = []
    worker = orbit.Worker(server, token=tenant.token, queues=[q["id"]], concurrency=1, prefetch=1,
                          lease_ms=2_000, claim_wait_ms=100)

    @worker.handler
    async def handle(task: orbit.TaskContext):
        ran.append(task.id)
        if len(ran) == 1:
            await release_first.wait()

    async with running(worker):
        await wait_until(lambda: len(ran) == 1, 15, "the first handler")

        async def given_back():
            rows = await _lease_rows(db, q["id"])
            return any(r.outcome == "RELEASED" and r.started_at is None for r in rows)

        for _ in range(200):
            if await given_back():
                break
            await asyncio.sleep(0.05)
        assert await given_back()
        release_first.set()
        tasks = await wait_states(tenant, ids, timeout=30)
    assert {t["state"] for t in tasks} == {"SUCCEEDED"}
    assert all(t["attempts"] == 1 for t in tasks)


async def test_draining_gives_the_tasks_claimed_ahead_back(tenant, server, db):
    q = await tenant.create_queue(max_concurrency=100)
    ids = await submit(tenant, q["id"], 6)
    gate = asyncio.Event()
    ran: list[str] = []
    worker = orbit.Worker(server, token=tenant.token, queues=[q["id"]], concurrency=2, prefetch=2,
                          claim_wait_ms=100)

    @worker.handler
    async def handle(task: orbit.TaskContext):
        ran.append(task.id)
        await gate.wait()

    task = asyncio.create_task(worker.arun())
    await wait_until(lambda: len(ran) == 2 and len(worker._ahead) == 2, 15, "two running, two claimed ahead")
    worker.stop()
    await asyncio.sleep(0.3)
    gate.set()
    await asyncio.wait_for(task, 30)
    assert worker.drained and len(ran) == 2
    async with db.engine.connect() as conn:
        open_leases = (await conn.execute(select(func.count()).select_from(leases).where(
            leases.c.queue_id == q["id"], leases.c.ended_at.is_(None)))).scalar()
    assert open_leases == 0
    states = [(await tenant.get(f"/v1/tasks/{t}")).json()["data"]["state"] for t in ids]
    assert sorted(states) == ["SUCCEEDED"] * 2 + ["WAITING"] * 4


def test_prefetch_is_bounded_by_concurrency():
    with pytest.raises(ValueError):
        orbit.Worker("http://127.0.0.1:1", token="t", queues=["q"], concurrency=2, prefetch=3)
