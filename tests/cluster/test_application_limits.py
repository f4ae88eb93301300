"""Three server nodes, two namespaces, four queues of one application: the application's
concurrency and Start rate hold exactly across all of them, from the stored history."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from tests.integration.worker_client import Worker
from tests.support.history import max_overlap, rate_windows

from .nodes import async_client, fetch_all, post, warm_up

pytestmark = pytest.mark.cluster

APP_CONCURRENCY = 3
APP_RATE = 12
TASKS_PER_QUEUE = 20


async def _worker(base: str, token: str, queue_ids: list[str], node: str, stop: asyncio.Event) -> None:
    async with Worker.connect(base, token) as w:
        await w.hello(*queue_ids, node_id=node)
        while not stop.is_set():
            for qid in queue_ids:
                c = await w.call("claim", queue_id=qid, max_tasks=2, wait_ms=100, lease_ms=20000)
                for lease in c.get("tasks", []):
                    while True:
                        s = await w.call("start", lease_id=lease["lease_id"])
                        if s["ok"] or s["error"]["code"] != "RATE_LIMITED":
                            break
                        await asyncio.sleep(s["error"]["retry_after_ms"] / 1000)
                    assert s["ok"], s
                    await asyncio.sleep(random.uniform(0.005, 0.03))
                    d = await w.call("complete", lease_id=lease["lease_id"], outcome="succeeded")
                    assert d["ok"], d


def test_application_limits_hold_across_namespaces_queues_and_three_nodes(cluster, tenant_factory, mariadb_url):
    app = f"apps-{uuid.uuid4().hex[:8]}"
    first = tenant_factory(application=app, namespace="one", permissions=["applications:manage"])
    second = tenant_factory(application=app, namespace="two")
    assert first["application_id"] == second["application_id"]
    nodes = cluster.start_nodes(3)

    async def scenario():
        async with async_client() as client:
            await warm_up(client, nodes, connections=2)
            r = await post(client, nodes[0], f"/v1/applications/{first['application_id']}:configure",
                           {"expected_revision": "1", "reason": "cap", "paused": False,
                            "max_concurrency": APP_CONCURRENCY, "rate_per_second": APP_RATE,
                            "max_unfinished_tasks": 1000}, token=first["token"], key=uuid.uuid4().hex)
            assert r.status == 200, r
            plan = []
            for tenant in (first, second):
                ids = []
                for n in range(2):
                    q = await post(client, nodes[n], "/v1/queues",
                                   {"name": f"q-{uuid.uuid4().hex[:8]}", "max_concurrency": 10,
                                    "rate_per_second": 100}, token=tenant["token"], key=uuid.uuid4().hex)
                    qid = q.data["queue"]["id"]
                    ids.append(qid)
                    b = await post(client, nodes[n + 1], f"/v1/queues/{qid}/tasks:batch",
                                   {"tasks": [{"idempotency_key": f"{qid}-{i}", "payload": i}
                                              for i in range(TASKS_PER_QUEUE)]},
                                   token=tenant["token"], key=uuid.uuid4().hex)
                    assert b.status == 200 and all("task" in item for item in b.data["results"]), b
                plan.append((tenant["token"], ids))
        stop = asyncio.Event()
        workers = [asyncio.create_task(_worker(nodes[i % 3].base_url, token, ids, f"host-{i}", stop))
                   for i, (token, ids) in enumerate(plan * 3)]
        total = 4 * TASKS_PER_QUEUE
        for _ in range(600):
            (row,) = await fetch_all(mariadb_url, "SELECT COUNT(*) AS n FROM tasks WHERE application_id=:a "
                                     "AND state = 'SUCCEEDED'", a=first["application_id"])
            if int(row["n"]) == total:
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 30)

    asyncio.run(scenario())
    leases = asyncio.run(fetch_all(
        mariadb_url, "SELECT leased_at, started_at, ended_at, outcome FROM leases WHERE application_id=:a",
        a=first["application_id"]))
    assert sum(1 for lease in leases if lease["outcome"] == "SUCCEEDED") == 4 * TASKS_PER_QUEUE
    assert max_overlap([(lease["leased_at"], lease["ended_at"]) for lease in leases]) <= APP_CONCURRENCY
    windows = rate_windows([lease["started_at"] for lease in leases if lease["started_at"] is not None])
    assert max(windows) <= APP_RATE, windows
    (u,) = asyncio.run(fetch_all(mariadb_url, "SELECT * FROM application_usage WHERE application_id=:a",
                                 a=first["application_id"]))
    assert (u["unfinished"], u["permits_in_use"], u["rate_reserved"]) == (0, 0, 0)
