"""The event feed on three nodes: a consumer long-polling through one node while producers
submit through all three sees every `task.submitted` exactly once, with strictly increasing seq."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from .nodes import async_client, post, warm_up

pytestmark = pytest.mark.cluster

PRODUCERS, PER_PRODUCER = 6, 40


def test_a_consumer_sees_every_submit_once_in_order(cluster, tenant):
    nodes = cluster.start_nodes(3)

    async def scenario() -> tuple[list[str], list[tuple[int, str, str]]]:
        async with async_client() as client:
            await warm_up(client, nodes, connections=2)
            r = await post(client, nodes[0], "/v1/queues", {"name": f"q-{uuid.uuid4().hex[:8]}",
                           "max_concurrency": 10, "rate_per_second": 100, "max_unfinished_tasks": 100000},
                           token=tenant["token"], key=uuid.uuid4().hex)
            qid = r.data["queue"]["id"]
            done = asyncio.Event()
            submitted: list[str] = []
            seen: list[tuple[int, str, str]] = []

            async def produce(p: int) -> None:
                for i in range(PER_PRODUCER):
                    node = nodes[(p + i) % 3]
                    s = await post(client, node, f"/v1/queues/{qid}/tasks", {"payload": {"p": p, "i": i}},
                                   token=tenant["token"], key=f"{qid}-{p}-{i}")
                    assert s.status == 201, s
                    submitted.append(s.data["task"]["id"])

            async def consume() -> None:
                after = "0"
                while True:
                    resp = await client.get(f"{nodes[1].base_url}/v1/events",
                                            params={"after": after, "wait_ms": 1000, "limit": 50},
                                            headers={"Authorization": f"Bearer {tenant['token']}"})
                    assert resp.status_code == 200, resp.text
                    page = resp.json()["data"]
                    seen.extend((int(e["seq"]), e["type"], e["resource_id"]) for e in page["items"])
                    after = page["next_after"]
                    if done.is_set() and not page["items"]:
                        return

            consumer = asyncio.create_task(consume())
            await asyncio.gather(*(produce(p) for p in range(PRODUCERS)))
            await asyncio.sleep(3)  # every node numbers within its sweep
            done.set()
            await asyncio.wait_for(consumer, 30)
            return submitted, seen

    submitted, seen = asyncio.run(scenario())
    seqs = [s for s, _, _ in seen]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    got = [rid for _, t, rid in seen if t == "task.submitted"]
    assert len(got) == len(set(got)) == PRODUCERS * PER_PRODUCER
    assert set(got) == set(submitted)
