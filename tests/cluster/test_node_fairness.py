"""Node fairness across server nodes: a worker node at its fair share of a queue gets nothing
while a worker node connected to another server waits, and idle capacity is still granted."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.integration.worker_client import Worker

from .nodes import async_client, post, warm_up

pytestmark = pytest.mark.cluster


def test_a_greedy_node_yields_to_a_waiting_node_on_another_server(cluster, tenant):
    nodes = cluster.start_nodes(2)

    async def scenario():
        async with async_client() as client:
            await warm_up(client, nodes, connections=1)
            q = await post(client, nodes[0], "/v1/queues", {"name": f"q-{uuid.uuid4().hex[:8]}",
                           "max_concurrency": 4, "rate_per_second": 1000}, token=tenant["token"],
                           key=uuid.uuid4().hex)
            qid = q.data["queue"]["id"]
            b = await post(client, nodes[1], f"/v1/queues/{qid}/tasks:batch",
                           {"tasks": [{"idempotency_key": f"t-{i}", "payload": i} for i in range(12)]},
                           token=tenant["token"], key=uuid.uuid4().hex)
            assert b.status == 200, b
        async with Worker.connect(nodes[0].base_url, tenant["token"]) as greedy, \
                Worker.connect(nodes[1].base_url, tenant["token"]) as modest:
            await greedy.hello(qid, node_id="greedy")
            await modest.hello(qid, node_id="modest")
            held = (await greedy.call("claim", queue_id=qid, max_tasks=4))["tasks"]
            assert len(held) == 4
            waiting = asyncio.create_task(modest.call("claim", queue_id=qid, max_tasks=2, wait_ms=5000))
            await asyncio.sleep(0.3)  # its first claim found nothing: it waits, re-polling
            for t in held[:2]:
                assert (await greedy.call("release", lease_id=t["lease_id"]))["ok"]
            # Two active nodes, fair share 2: the greedy node already holds 2 while the other waits.
            assert (await greedy.call("claim", queue_id=qid, max_tasks=4))["tasks"] == []
            got = (await waiting)["tasks"]
            # A claim answers once it leased a task: its node's poll may have woken it between
            # the two releases. The rest of its fair share is still there for it.
            if len(got) < 2:
                got += (await modest.call("claim", queue_id=qid, max_tasks=2 - len(got), wait_ms=2000))["tasks"]
            assert len(got) == 2
            for t in got:
                assert (await modest.call("release", lease_id=t["lease_id"]))["ok"]
            # Nobody waits now: the greedy node may take the idle capacity beyond its share.
            assert len((await greedy.call("claim", queue_id=qid, max_tasks=4))["tasks"]) == 2

    asyncio.run(scenario())
