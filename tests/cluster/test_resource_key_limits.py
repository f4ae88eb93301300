"""Three server nodes, one namespace, two queues sharing resource keys: a key's permits hold
exactly across nodes (from the stored lease history), keyless tasks are never held up by a
saturated key, and every key's usage row returns to zero."""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from tests.integration.worker_client import Worker
from tests.support.history import max_overlap

from .nodes import async_client, fetch_all, post, warm_up

pytestmark = pytest.mark.cluster

SHARED = 2  # permits of the key both queues' tasks name
NARROW = 1  # permits of the key some of them also name
TASKS_PER_QUEUE = 24


async def _worker(base: str, token: str, queue_ids: list[str], node: str, stop: asyncio.Event) -> None:
    async with Worker.connect(base, token) as w:
        await w.hello(*queue_ids, node_id=node)
        while not stop.is_set():
            for qid in queue_ids:
                c = await w.call("claim", queue_id=qid, max_tasks=3, wait_ms=100, lease_ms=20000)
                for lease in c.get("tasks", []):
                    s = await w.call("start", lease_id=lease["lease_id"])
                    assert s["ok"], s
                    await asyncio.sleep(random.uniform(0.005, 0.03))
                    d = await w.call("complete", lease_id=lease["lease_id"], outcome="succeeded")
                    assert d["ok"], d


def _keys_of(i: int, shared: str, narrow: str) -> list[str]:
    return [[], [shared], [shared, narrow], [narrow]][i % 4]


def test_resource_key_permits_hold_across_queues_and_three_nodes(cluster, tenant_factory, mariadb_url):
    tenant = tenant_factory(application=f"keys-{uuid.uuid4().hex[:8]}", namespace="one")
    nodes = cluster.start_nodes(3)
    names = {"shared": f"db-{uuid.uuid4().hex[:6]}", "narrow": f"api-{uuid.uuid4().hex[:6]}"}

    async def scenario() -> list[str]:
        async with async_client() as client:
            await warm_up(client, nodes, connections=2)
            key_ids = {}
            for label, permits in (("shared", SHARED), ("narrow", NARROW)):
                r = await post(client, nodes[0], "/v1/resource-keys",
                               {"name": names[label], "max_concurrency": permits}, token=tenant["token"],
                               key=uuid.uuid4().hex)
                assert r.status == 201, r
                key_ids[label] = r.data["resource_key"]["id"]
            ids = []
            for n in range(2):
                q = await post(client, nodes[n], "/v1/queues",
                               {"name": f"q-{uuid.uuid4().hex[:8]}", "max_concurrency": 20, "rate_per_second": 1000},
                               token=tenant["token"], key=uuid.uuid4().hex)
                qid = q.data["queue"]["id"]
                ids.append(qid)
                b = await post(client, nodes[n + 1], f"/v1/queues/{qid}/tasks:batch",
                               {"tasks": [{"idempotency_key": f"{qid}-{i}", "payload": i,
                                           "resource_keys": _keys_of(i, names["shared"], names["narrow"])}
                                          for i in range(TASKS_PER_QUEUE)]},
                               token=tenant["token"], key=uuid.uuid4().hex)
                assert b.status == 200 and all("task" in item for item in b.data["results"]), b
        stop = asyncio.Event()
        workers = [asyncio.create_task(_worker(nodes[i % 3].base_url, tenant["token"], ids[::(-1) ** i], f"host-{i}",
                                               stop)) for i in range(6)]
        total = 2 * TASKS_PER_QUEUE
        for _ in range(600):
            (row,) = await fetch_all(mariadb_url, "SELECT COUNT(*) AS n FROM tasks WHERE namespace_id=:ns "
                                     "AND state = 'SUCCEEDED'", ns=tenant["namespace_id"])
            if int(row["n"]) == total:
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*workers), 30)
        return [key_ids["shared"], key_ids["narrow"]]

    shared_id, narrow_id = asyncio.run(scenario())
    leases = asyncio.run(fetch_all(
        mariadb_url, "SELECT l.leased_at, l.ended_at, l.outcome, t.resource_key_ids FROM leases l "
                     "JOIN tasks t ON t.id = l.task_id WHERE t.namespace_id=:ns", ns=tenant["namespace_id"]))
    assert sum(1 for lease in leases if lease["outcome"] == "SUCCEEDED") == 2 * TASKS_PER_QUEUE
    for key_id, permits in ((shared_id, SHARED), (narrow_id, NARROW)):
        spans = [(lease["leased_at"], lease["ended_at"]) for lease in leases
                 if lease["resource_key_ids"] and key_id in lease["resource_key_ids"]]
        assert spans and max_overlap(spans) <= permits
    # Keyless tasks ran beside the saturated keys, not after them.
    keyless = [(lease["leased_at"], lease["ended_at"]) for lease in leases if not lease["resource_key_ids"]]
    assert max_overlap(keyless) >= 2
    usage = asyncio.run(fetch_all(mariadb_url, "SELECT * FROM resource_key_usage WHERE resource_key_id IN (:a, :b)",
                                  a=shared_id, b=narrow_id))
    assert [(int(u["unfinished"]), int(u["permits_in_use"])) for u in usage] == [(0, 0), (0, 0)]
    parked = asyncio.run(fetch_all(mariadb_url, "SELECT COUNT(*) AS n FROM tasks WHERE namespace_id=:ns "
                                   "AND parked_on IS NOT NULL", ns=tenant["namespace_id"]))
    assert int(parked[0]["n"]) == 0
