"""kill -9 in the middle of a write burst leaves nothing half-written and loses no acknowledged write."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid

import pytest

from .burst import QueueBurst, check_queue_state
from .nodes import FaultProxy, async_client, fetch_all, get, post, warm_up

pytestmark = pytest.mark.cluster


def test_kill_9_mid_burst_leaves_no_half_written_state(cluster, tenant, mariadb_url):
    a, b = cluster.start_nodes(2)
    token, ns = tenant["token"], tenant["namespace_id"]
    burst = QueueBurst([a, b], token, clients=16, configure_ratio=0.5, duplicate_ratio=0.15)
    kills: list[dict] = []
    t_start = time.monotonic()

    async def kill_9(node, freeze_first: float = 0.0) -> dict:
        kill = {
            "node": node.name,
            "completed": burst.completed,
            "inflight": burst.inflight[node.name],
            "at_s": round(time.monotonic() - t_start, 2),
        }
        kills.append(kill)
        if freeze_first:
            # A hung node (GC pause, VM stall): its open transactions keep their row locks
            # while the other node's requests queue up behind them; then it dies.
            node.send_signal(signal.SIGSTOP)
            await asyncio.sleep(freeze_first)
            kill["frozen_s"] = freeze_first
        node.kill()  # SIGKILL: no drain, no rollback by the node, connections just vanish
        assert node.returncode == -9
        return kill

    async def restart(node, kill: dict) -> None:
        node.start()  # same port
        await node.wait_ready_async()
        kill["back_after_s"] = round(time.monotonic() - t_start - kill["at_s"], 2)
        kill["completed_while_down"] = burst.completed - kill["completed"]

    async def scenario():
        stop = asyncio.Event()
        async with async_client(max_connections=100) as client:
            await warm_up(client, [a, b], connections=8)
            runner = asyncio.create_task(burst.run(client, stop))
            try:
                await burst.wait_completed(40)
                # 1: freeze and kill b; a takes the retries; b comes back under load.
                kill = await kill_9(b, freeze_first=0.5)
                await asyncio.sleep(1.0)
                await restart(b, kill)
                await burst.wait_completed(burst.completed + 40)
                # 2: kill a for good; the restarted b takes the retries and the rest of the burst.
                await kill_9(a)
                await burst.wait_completed(burst.completed + 30)
            finally:
                stop.set()
                await asyncio.wait_for(runner, timeout=30)
            # The restarted node serves every queue the burst touched, as the database has it.
            sample = sorted(burst.revisions)
            views = await asyncio.gather(
                *(get(client, b, f"/v1/queues/{qid}", token=token) for qid in sample)
            )
            return views

    views = asyncio.run(scenario())
    t_burst = time.monotonic() - t_start
    summary = burst.summary()
    print(json.dumps({"kills": kills, **summary}, indent=1))

    # Every kill hit the node while it had requests in flight.
    assert all(k["inflight"] > 0 for k in kills), kills
    # The burst really lost connections and had to retry through the other node.
    assert summary["retried_ops"] > 0, summary
    assert (
        sum(1 for op in burst.ops if op.operation == "queues.configure" and op.ok_answers) > 10
    ), summary

    burst.check_answers()
    assert all(v.status == 200 for v in views), [v for v in views if v.status != 200][:3]
    live = {v.data["id"]: v.data for v in views}

    # The restarted node shuts down cleanly.
    assert b.terminate() == 0, b.describe()

    t1 = time.monotonic()
    stats = asyncio.run(check_queue_state(mariadb_url, ns, burst.ops))
    rows = asyncio.run(
        fetch_all(mariadb_url, "SELECT id, revision FROM queues WHERE namespace_id=:ns", ns=ns)
    )
    assert all(live[r["id"]]["revision"] == str(r["revision"]) for r in rows if r["id"] in live)
    print(stats, {"burst_s": round(t_burst, 1), "check_s": round(time.monotonic() - t1, 1)})
    assert stats["queues"] >= sum(
        1 for op in burst.ops if op.operation == "queues.create" and op.ok_answers
    )


def test_answer_lost_after_commit_is_replayed_by_the_surviving_node(cluster, tenant, mariadb_url):
    """The node commits, then dies before its answer gets out: the retry through the other node
    with the same key gets 200 + deduplicated + the very snapshot that was committed.

    A proxy in front of node b passes each request on and destroys the answer (so the commit
    certainly happened and the client certainly saw nothing); then b is killed with SIGKILL.
    """
    a, b = cluster.start_nodes(2)
    token, ns = tenant["token"], tenant["namespace_id"]
    n = 12

    async def scenario():
        proxy = await FaultProxy(b, mode="drop_answers").start()
        try:
            async with async_client() as client:
                # Queues to configure, created normally through a.
                made = await asyncio.gather(
                    *(
                        post(
                            client,
                            a,
                            "/v1/queues",
                            {
                                "name": f"lost-c-{uuid.uuid4().hex[:8]}",
                                "max_concurrency": 1,
                                "rate_per_second": 1,
                            },
                            token=token,
                            key=uuid.uuid4().hex,
                        )
                        for _ in range(n)
                    )
                )
                assert all(m.status == 201 for m in made), made
                creates = [
                    (
                        "/v1/queues",
                        {
                            "name": f"lost-{uuid.uuid4().hex[:8]}",
                            "max_concurrency": 2,
                            "rate_per_second": 3,
                        },
                        uuid.uuid4().hex,
                    )
                    for _ in range(n)
                ]
                configures = [
                    (
                        f"/v1/queues/{m.data['queue']['id']}:configure",
                        {
                            "expected_revision": "1",
                            "reason": "lost answer",
                            "paused": True,
                            "max_concurrency": 4,
                            "rate_per_second": 5,
                            "max_unfinished_tasks": 6,
                        },
                        uuid.uuid4().hex,
                    )
                    for m in made
                ]
                requests = creates + configures
                lost = await asyncio.gather(
                    *(post(client, proxy, p, body, token=token, key=k) for p, body, k in requests)
                )
                b.kill()
                retried = await asyncio.gather(
                    *(post(client, a, p, body, token=token, key=k) for p, body, k in requests)
                )
                return requests, lost, retried, proxy.dropped
        finally:
            await proxy.close()

    requests, lost, retried, dropped = asyncio.run(scenario())
    assert all(not x.answered for x in lost), lost
    assert dropped == len(requests)
    stored = {
        r["idem_key"]: r
        for r in asyncio.run(
            fetch_all(
                mariadb_url,
                "SELECT idem_key, response FROM idempotency_records WHERE namespace_id=:ns",
                ns=ns,
            )
        )
    }
    for (path, body, key), r in zip(requests, retried):
        assert r.status == 200 and r.data["deduplicated"] is True, r
        # Exactly what the dead node committed, byte for byte the stored receipt.
        assert r.data["queue"] == json.loads(stored[key]["response"])["queue"]
        if "name" in body:
            assert r.data["queue"]["name"] == body["name"] and r.data["queue"]["revision"] == "1"
        else:
            assert r.data["queue"]["revision"] == "2" and r.data["queue"]["paused"] is True
    asyncio.run(check_queue_state(mariadb_url, ns))
    assert a.terminate() == 0, a.describe()
