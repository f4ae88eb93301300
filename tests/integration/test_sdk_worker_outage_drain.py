"""The SDK worker told that its node lost the database: it reconnects and keeps what it holds,
where a shutdown's `drain` would end its run (test_sdk_worker.py). Both backends; the outage
notice is the hub's own reaction to the database's health, triggered directly."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import orbit
from orbit.server.app import create_app
from orbit.server.config import Settings

from .test_sdk_worker import get_task, make_worker, submit, wait_until
from .worker_client import serve

pytestmark = pytest.mark.anyio


async def test_a_database_outage_drain_makes_the_worker_reconnect_with_its_running_work(tenant, db, db_url):
    q = await tenant.create_queue(max_concurrency=8, rate_per_second=100)
    first = await submit(tenant, q["id"], 2)
    gate = asyncio.Event()
    calls: Counter[str] = Counter()
    app = create_app(Settings(database_url=db_url, node_id="lost-db", background_loops=True), db)
    async with serve(app) as url:
        hub = app.state.node.hub
        w = make_worker(url, tenant, [q["id"]], concurrency=2)

        @w.handler
        async def handle(task: orbit.TaskContext):
            calls[task.id] += 1
            await gate.wait()
            return "finished"

        run = asyncio.create_task(w.arun())
        try:
            await wait_until(lambda: sum(calls.values()) == 2, 20, "two running handlers")
            (before,) = hub.sessions
            hub._database_changed(False)  # what the hub hears when the database becomes unreachable
            await wait_until(lambda: len(hub.sessions) == 1 and before not in hub.sessions, 10, "a new session")
            assert not run.done() and not w.drained
            gate.set()  # the running handlers finish; their reports go through the new session
            later = await submit(tenant, q["id"], 2)
            await wait_until(lambda: sum(calls.values()) == 4, 20, "the later tasks worked")
            for task_id in first + later:
                for _ in range(100):
                    if (await get_task(tenant, task_id))["state"] == "SUCCEEDED":
                        break
                    await asyncio.sleep(0.05)
                assert (await get_task(tenant, task_id))["state"] == "SUCCEEDED"
            await asyncio.wait_for(w.astop(), 20)
            await asyncio.wait_for(run, 20)
        finally:
            if not run.done():
                run.cancel()
    assert w.drained and set(calls.values()) == {1}
