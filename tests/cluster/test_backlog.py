"""Backlog limit across two nodes: exactly N accepted, every other new submit 429, counter == COUNT(*)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest

from .nodes import async_client, fetch_all, post, warm_up

pytestmark = pytest.mark.cluster


async def _counter_and_count(url: str, queue_id: str) -> tuple[int, int]:
    (u,) = await fetch_all(url, "SELECT unfinished FROM queue_usage WHERE queue_id=:q", q=queue_id)
    (c,) = await fetch_all(
        url,
        "SELECT COUNT(*) AS n FROM tasks WHERE queue_id=:q AND state IN ('WAITING','LEASED','RUNNING','NEEDS_REVIEW')",
        q=queue_id,
    )
    return int(u["unfinished"]), int(c["n"])


def test_backlog_limit_is_exact_across_nodes(two_nodes, tenant, mariadb_url):
    nodes = two_nodes.nodes
    token = tenant["token"]
    limit = 37

    async def scenario():
        async with async_client() as client:
            await warm_up(client, nodes)
            q = await post(client, nodes[0], "/v1/queues",
                           {"name": f"backlog-{uuid.uuid4().hex[:8]}", "max_concurrency": 4,
                            "rate_per_second": 10, "max_unfinished_tasks": limit},
                           token=token, key=uuid.uuid4().hex)
            assert q.status == 201, q
            qid = q.data["queue"]["id"]
            path = f"/v1/queues/{qid}/tasks"
            singles = [post(client, nodes[i % 2], path, {"payload": {"i": i}}, token=token, key=f"s-{i}")
                       for i in range(120)]
            batches = [post(client, nodes[i % 2], path + ":batch",
                            {"tasks": [{"idempotency_key": f"b-{i}-{j}", "payload": j} for j in range(10)]},
                            token=token, key=f"batch-{i}") for i in range(8)]
            answers = await asyncio.gather(*singles, *batches)
            return qid, answers[:120], answers[120:]

    qid, singles, batches = asyncio.run(scenario())
    assert all(a.answered and a.status < 500 for a in singles + batches), [a for a in singles + batches if not a.answered or a.status >= 500]
    single_counts = Counter((a.status, a.code) for a in singles)
    assert set(single_counts) <= {(201, None), (429, "QUEUE_FULL")}, single_counts
    item_results = [r for b in batches for r in b.data["results"]]
    item_codes = Counter(r.get("error", {}).get("code") for r in item_results)
    assert set(item_codes) <= {None, "QUEUE_FULL"}, item_codes
    accepted = single_counts[(201, None)] + item_codes[None]
    assert accepted == limit, (single_counts, item_codes)
    for a in singles:
        if a.status == 429:
            assert a.body["error"]["message"] == (
                "queue unfinished task limit reached; retry later using the original identity")
    counter, count = asyncio.run(_counter_and_count(mariadb_url, qid))
    assert counter == count == limit
    rejected_keys = [f"s-{i}" for i, a in enumerate(singles) if a.status == 429]
    (recs,) = asyncio.run(fetch_all(
        mariadb_url, "SELECT COUNT(*) AS n FROM idempotency_records WHERE operation='tasks.submit' "
        "AND idem_key IN :keys", keys=tuple(rejected_keys) or ("-",)))
    assert int(recs["n"]) == 0, "a rejected submit left an idempotency record"
