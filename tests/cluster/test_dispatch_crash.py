"""kill -9 of a server node: its sessions' leases either continue through another node
(reconnect within the lease, same lease ids and message ids) or are recovered by the
surviving node exactly as the task's policy says. Nothing is lost or done twice."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.integration.worker_client import Worker

from .nodes import async_client, fetch_all, post, warm_up

pytestmark = pytest.mark.cluster


def test_node_crash_recovery_and_reconnect(cluster, tenant, mariadb_url):
    a, b = cluster.start_nodes(2)
    token = tenant["token"]

    async def setup():
        async with async_client() as client:
            await warm_up(client, [a, b], connections=2)
            q = await post(client, a, "/v1/queues", {"name": f"crash-{uuid.uuid4().hex[:8]}",
                                                     "max_concurrency": 10, "rate_per_second": 100},
                           token=token, key=uuid.uuid4().hex)
            qid = q.data["queue"]["id"]
            ids = {}
            for name, policy in (("review", "review"), ("retry", "retry"), ("moved", "review"), ("leased", "review")):
                r = await post(client, a, f"/v1/queues/{qid}/tasks",
                               {"payload": name, "on_lease_lost": policy}, token=token, key=f"t-{name}")
                ids[name] = r.data["task"]["id"]
            return qid, ids

    qid, ids = asyncio.run(setup())

    async def phase1():
        """A worker on node b holds every task: three started, one only leased."""
        ws = Worker.connect(b.base_url, token)
        w = await ws.__aenter__()
        await w.hello(qid, node_id="host-1")
        c = await w.call("claim", queue_id=qid, max_tasks=4, lease_ms=3000)
        leases = {t["payload"]: t for t in c["tasks"]}
        assert set(leases) == {"review", "retry", "moved", "leased"}
        starts = {}
        for name in ("review", "retry", "moved"):
            starts[name] = await w.call("start", id=f"start-{name}", lease_id=leases[name]["lease_id"])
            assert starts[name]["ok"]
        return ws, leases, starts

    async def scenario():
        ws, leases, starts = await phase1()
        b.kill()
        try:
            await ws.__aexit__(None, None, None)
        except Exception:
            pass
        # The worker reconnects to node a within the lease and carries on with the same identities.
        async with Worker.connect(a.base_url, token) as w:
            await w.hello(qid, node_id="host-1")
            again = await w.call("start", id="start-moved", lease_id=leases["moved"]["lease_id"])
            assert again["ok"] and again["attempt"] == starts["moved"]["attempt"]
            rn = await w.call("renew", lease_id=leases["moved"]["lease_id"], lease_ms=10000)
            assert rn["ok"], rn
            done = await w.call("complete", id="done-moved", lease_id=leases["moved"]["lease_id"],
                                outcome="succeeded", result="ok")
            assert done["task_state"] == "SUCCEEDED"
            # The other leases expire; node a's recovery sweep handles them.
            for _ in range(100):
                rows = await fetch_all(mariadb_url, "SELECT id, state FROM tasks WHERE queue_id=:q", q=qid)
                states = {r["id"]: r["state"] for r in rows}
                if states[ids["review"]] == "NEEDS_REVIEW" and states[ids["retry"]] == "WAITING" \
                        and states[ids["leased"]] == "WAITING":
                    break
                await asyncio.sleep(0.1)
            assert states[ids["review"]] == "NEEDS_REVIEW", states
            got = {}
            for _ in range(10):  # the retried task waits out its backoff (1 s +/- 20 %)
                c = await w.call("claim", queue_id=qid, max_tasks=5, wait_ms=1000)
                got.update({t["payload"]: t for t in c["tasks"]})
                if len(got) == 2:
                    break
            assert set(got) == {"retry", "leased"}, got
            assert got["retry"]["attempt"] == 2 and got["leased"]["attempt"] == 1
            for t in got.values():
                assert (await w.call("start", lease_id=t["lease_id"]))["ok"]
                assert (await w.call("complete", lease_id=t["lease_id"], outcome="succeeded"))["ok"]
            late = await w.call("complete", lease_id=leases["review"]["lease_id"], outcome="succeeded")
            assert late["error"]["code"] == "LEASE_LOST"

    asyncio.run(scenario())
    rows = asyncio.run(fetch_all(mariadb_url, "SELECT id, state, attempts FROM tasks WHERE queue_id=:q", q=qid))
    by = {r["id"]: r for r in rows}
    assert by[ids["moved"]]["state"] == "SUCCEEDED" and by[ids["moved"]]["attempts"] == 1
    assert by[ids["retry"]]["state"] == "SUCCEEDED" and by[ids["retry"]]["attempts"] == 2
    assert by[ids["leased"]]["state"] == "SUCCEEDED" and by[ids["leased"]]["attempts"] == 1
    assert by[ids["review"]]["state"] == "NEEDS_REVIEW"
    (u,) = asyncio.run(fetch_all(mariadb_url, "SELECT * FROM queue_usage WHERE queue_id=:q", q=qid))
    assert (u["unfinished"], u["permits_in_use"], u["rate_reserved"]) == (1, 0, 0)
    outcomes = asyncio.run(fetch_all(
        mariadb_url, "SELECT task_id, outcome FROM leases WHERE queue_id=:q AND outcome='SUCCEEDED'", q=qid))
    assert sorted(o["task_id"] for o in outcomes) == sorted([ids["moved"], ids["retry"], ids["leased"]])


def test_pushes_follow_a_worker_that_reconnected_to_another_node(cluster, tenant):
    a, b = cluster.start_nodes(2)
    token = tenant["token"]

    async def scenario():
        async with async_client() as client:
            q = await post(client, a, "/v1/queues", {"name": f"follow-{uuid.uuid4().hex[:8]}", "max_concurrency": 2,
                                                     "rate_per_second": 10}, token=token, key=uuid.uuid4().hex)
            qid = q.data["queue"]["id"]
            r = await post(client, a, f"/v1/queues/{qid}/tasks", {"payload": 1}, token=token, key="follow")
            task_id = r.data["task"]["id"]
            async with Worker.connect(a.base_url, token) as w:
                await w.hello(qid)
                lease = (await w.call("claim", queue_id=qid, max_tasks=1))["tasks"][0]
                assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
            async with Worker.connect(b.base_url, token) as w:
                await w.hello(qid)
                assert (await w.call("renew", lease_id=lease["lease_id"], lease_ms=30000))["ok"]
                c = await post(client, a, f"/v1/tasks/{task_id}:cancel", {"reason": "stop"}, token=token, key="c")
                assert c.status == 200
                push = await w.wait_push("cancel_requested", timeout=5)
                assert push["lease_id"] == lease["lease_id"]
                done = await w.call("complete", lease_id=lease["lease_id"], outcome="cancelled")
                assert done["task_state"] == "CANCELLED"

    asyncio.run(scenario())
