"""A worker's node_id (hello) is stored and reported whole up to its 128 characters, and one
beyond the rule is refused INVALID_ARGUMENT at hello, changing nothing; both backends."""

from __future__ import annotations

import pytest

from .queue_helpers import ok
from .test_worker_protocol import submit, usage
from .worker_client import Worker

pytestmark = pytest.mark.anyio


async def test_a_128_character_node_id_is_stored_and_reported_whole(tenant, base):
    q = await tenant.create_queue(max_concurrency=4)
    [task_id] = await submit(tenant, q["id"], 1)
    # Distinct in its last characters only: a cut at 64 would make the two nodes one.
    long_a, long_b = "n" * 63 + "-" + "a" * 63 + "A", "n" * 63 + "-" + "a" * 63 + "B"
    async with Worker.connect(base, tenant.token) as a, Worker.connect(base, tenant.token) as b:
        await a.hello(q["id"], node_id=long_a)
        await b.hello(q["id"], node_id=long_b)
        [lease] = (await a.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
        assert (await b.call("claim", queue_id=q["id"], max_tasks=1))["tasks"] == []
        live = ok(await tenant.get(f"/v1/queues/{q['id']}/usage"))
        assert {n["node_id"]: n["in_flight"] for n in live["active_nodes"]} == {long_a: "1", long_b: "0"}
        assert (await a.call("start", lease_id=lease["lease_id"]))["ok"]
        assert (await a.call("complete", lease_id=lease["lease_id"], outcome="succeeded"))["ok"]
    [attempt] = ok(await tenant.get(f"/v1/tasks/{task_id}/attempts"))["items"]
    assert attempt["node_id"] == long_a and len(attempt["node_id"]) == 128


@pytest.mark.parametrize("node_id", ["x" * 129, "", "wörker", " lead", "trail ", "tab\there", 7, None])
async def test_a_node_id_beyond_the_rule_is_refused_and_changes_nothing(tenant, base, node_id):
    q = await tenant.create_queue()
    await submit(tenant, q["id"], 1)
    before = await usage(tenant, q["id"])
    async with Worker.connect(base, tenant.token) as w:
        refused = await w.call("hello", node_id=node_id, queues=[q["id"]])
        assert refused["error"]["code"] == "INVALID_ARGUMENT" and "node_id" in refused["error"]["message"]
        # No session was opened by it: commands still need a hello, and a good one is accepted.
        assert (await w.call("claim", queue_id=q["id"]))["error"]["code"] == "STATE_CONFLICT"
        await w.hello(q["id"], node_id="x" * 128)
    assert await usage(tenant, q["id"]) == before
    assert ok(await tenant.get(f"/v1/queues/{q['id']}/usage"))["active_nodes"] == []
