"""Claims served by submits' transactions on two server nodes at once keep the limits exact:
each node's sparse submits, or its batches, lease their tasks to the claims waiting on that
node, while the other node does the same on the same queue."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from tests.integration.worker_client import Worker

from .nodes import async_client, fetch_all, post, warm_up

pytestmark = pytest.mark.cluster

SESSIONS_PER_NODE = 3
SUBMITS_PER_NODE = 12
BATCHES_PER_NODE = 6
BATCH_SIZE = 4


def _served_on_two_nodes(cluster, tenant, mariadb_url, max_concurrency: int, submit) -> tuple[list[str], list]:
    """Claims wait on both nodes of a queue limited to `max_concurrency`, while `submit(client,
    node, qid)` sends each node's tasks (returning their ids); then checks what every claim was
    granted against the stored leases and counters. Returns the submitted ids and the grants."""
    nodes = cluster.start_nodes(2)
    token = tenant["token"]

    async def scenario():
        async with async_client() as client:
            await warm_up(client, nodes, connections=1)
            q = await post(client, nodes[0], "/v1/queues", {"name": f"q-{uuid.uuid4().hex[:8]}",
                           "max_concurrency": max_concurrency, "rate_per_second": 1000},
                           token=token, key=uuid.uuid4().hex)
            qid = q.data["queue"]["id"]
            async with contextlib.AsyncExitStack() as stack:
                workers = [await stack.enter_async_context(Worker.connect(node.base_url, token))
                           for node in nodes for _ in range(SESSIONS_PER_NODE)]
                for i, w in enumerate(workers):
                    await w.hello(qid, node_id=f"w{i}")
                claims = [asyncio.create_task(w.call("claim", queue_id=qid, max_tasks=2, wait_ms=3000))
                          for w in workers]
                await asyncio.sleep(0.4)  # every claim found nothing and waits on its node
                sent = await asyncio.gather(*(submit(client, node, qid, token) for node in nodes))
                replies = await asyncio.gather(*claims)
            return qid, [i for ids in sent for i in ids], [t for r in replies for t in r["tasks"]]

    qid, submitted, granted = asyncio.run(scenario())
    assert len(granted) == max_concurrency  # the queue's concurrency, no more
    assert len({t["task_id"] for t in granted}) == max_concurrency
    assert {t["task_id"] for t in granted} <= set(submitted)
    rows = asyncio.run(fetch_all(mariadb_url, (
        "SELECT l.task_id, l.leased_at, t.created_at FROM leases l JOIN tasks t ON t.id = l.task_id "
        "WHERE l.queue_id = :q"), q=qid))
    assert len(rows) == max_concurrency
    assert any(r["leased_at"] == r["created_at"] for r in rows)  # some were served by their submit
    (usage,) = asyncio.run(fetch_all(mariadb_url, "SELECT permits_in_use, unfinished FROM queue_usage "
                                                  "WHERE queue_id = :q", q=qid))
    assert usage["permits_in_use"] == max_concurrency and usage["unfinished"] == len(submitted)
    return submitted, granted


def test_claims_served_by_submits_on_two_nodes_stay_within_the_concurrency_limit(cluster, tenant, mariadb_url):
    async def sparse_submits(client, node, qid, token):
        ids = []
        for i in range(SUBMITS_PER_NODE):
            r = await post(client, node, f"/v1/queues/{qid}/tasks", {"payload": {"i": i}},
                           token=token, key=uuid.uuid4().hex)
            assert r.status == 201, r
            ids.append(r.data["task"]["id"])
            await asyncio.sleep(0.03)  # sparse: each may serve a waiting claim
        return ids

    submitted, _ = _served_on_two_nodes(cluster, tenant, mariadb_url, 3, sparse_submits)
    assert len(submitted) == 2 * SUBMITS_PER_NODE  # 24 tasks, 3 leased


def test_claims_served_by_batches_on_two_nodes_stay_within_the_concurrency_limit(cluster, tenant, mariadb_url):
    async def batches(client, node, qid, token):
        ids = []
        for b in range(BATCHES_PER_NODE):
            items = [{"idempotency_key": uuid.uuid4().hex, "payload": {"b": b, "i": i}} for i in range(BATCH_SIZE)]
            r = await post(client, node, f"/v1/queues/{qid}/tasks:batch", {"tasks": items},
                           token=token, key=uuid.uuid4().hex)
            assert r.status == 200, r
            ids += [item["task"]["id"] for item in r.data["results"]]
        return ids

    submitted, _ = _served_on_two_nodes(cluster, tenant, mariadb_url, 5, batches)
    assert len(submitted) == 2 * BATCHES_PER_NODE * BATCH_SIZE
