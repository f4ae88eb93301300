"""The SDK worker against real server processes on MariaDB: kill -9 and restart of its node
mid-run; every task ends exactly once and every handler runs exactly once."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

import orbit

from .nodes import fetch_all

pytestmark = pytest.mark.cluster

TASKS = 30


def test_sdk_worker_survives_its_node_being_killed(cluster, tenant, mariadb_url):
    a, b = cluster.start_nodes(2)
    token = tenant["token"]
    runs: Counter = Counter()

    async def scenario():
        async with orbit.AsyncClient(a.base_url, token=token) as client:
            q = await client.create_queue(uuid.uuid4().hex, orbit.CreateQueueRequest(
                name=f"sdk-{uuid.uuid4().hex[:8]}", max_concurrency=4, rate_per_second=100))
            qid = q.queue.id
            await client.submit_tasks(qid, uuid.uuid4().hex, [
                orbit.SubmitTaskItem(idempotency_key=f"t-{i}", payload={"i": i}) for i in range(TASKS)])
            worker = orbit.Worker(url=b.base_url, token=token, queues=[qid], concurrency=8, node_id="sdk-host",
                                  reconnect_initial=0.1, reconnect_max=0.5)

            @worker.handler
            async def handle(task: orbit.TaskContext):
                runs[task.id] += 1
                await asyncio.sleep(0.3)
                return {"i": task.payload["i"]}

            run = asyncio.create_task(worker.arun())
            for _ in range(200):
                if sum(runs.values()) >= 6:
                    break
                await asyncio.sleep(0.05)
            b.kill()
            await asyncio.sleep(0.5)
            b.start()
            await asyncio.to_thread(b.wait_ready)
            for _ in range(600):
                rows = await fetch_all(mariadb_url,
                                       "SELECT COUNT(*) AS n FROM tasks WHERE queue_id=:q AND state='SUCCEEDED'", q=qid)
                if int(rows[0]["n"]) == TASKS:
                    break
                await asyncio.sleep(0.1)
            await worker.astop()
            await asyncio.wait_for(run, 30)
            return qid, worker.drained

    qid, drained = asyncio.run(scenario())
    assert drained
    rows = asyncio.run(fetch_all(mariadb_url, "SELECT id, state, attempts FROM tasks WHERE queue_id=:q", q=qid))
    assert all(r["state"] == "SUCCEEDED" and r["attempts"] == 1 for r in rows), rows
    assert len(runs) == TASKS and set(runs.values()) == {1}, runs
    (u,) = asyncio.run(fetch_all(mariadb_url, "SELECT * FROM queue_usage WHERE queue_id=:q", q=qid))
    assert (u["unfinished"], u["permits_in_use"], u["rate_reserved"]) == (0, 0, 0)
