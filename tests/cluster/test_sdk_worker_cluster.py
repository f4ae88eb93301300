"""The SDK worker against real server processes on MariaDB: kill -9 and restart of its node
mid-run, and, given both nodes' URLs, kill -9 or a drain of its node mid-run, after which it
goes on through the other node at once; every task ends exactly once and every handler runs
exactly once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import pytest

import orbit

from .nodes import fetch_all

pytestmark = pytest.mark.cluster

TASKS = 30


async def _until_all_succeeded(mariadb_url: str, qid: str) -> None:
    """Wait (up to about a minute) until every task of the queue has SUCCEEDED."""
    for _ in range(600):
        rows = await fetch_all(mariadb_url,
                               "SELECT COUNT(*) AS n FROM tasks WHERE queue_id=:q AND state='SUCCEEDED'", q=qid)
        if int(rows[0]["n"]) == TASKS:
            return
        await asyncio.sleep(0.1)


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
            await _until_all_succeeded(mariadb_url, qid)
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


async def _two_node_scenario(a, b, token: str, mariadb_url: str, runs: Counter, stop_node, *, gated: bool):
    """A worker given [A, B] works a queue through A until `stop_node()` takes A away (two
    handlers running, gated ones waiting to be released), then finishes every task through B.
    Returns (queue id, worker, the wall-clock time A was taken away at)."""
    gate = asyncio.Event()
    if not gated:
        gate.set()
    async with orbit.AsyncClient(b.base_url, token=token) as client:
        q = await client.create_queue(uuid.uuid4().hex, orbit.CreateQueueRequest(
            name=f"sdk-{uuid.uuid4().hex[:8]}", max_concurrency=4, rate_per_second=100))
        qid = q.queue.id
        await client.submit_tasks(qid, uuid.uuid4().hex, [
            orbit.SubmitTaskItem(idempotency_key=f"t-{i}", payload={"i": i}) for i in range(TASKS)])
        # Default reconnect settings: a worker that backed off would idle 0.1-0.3 s, then up to 10 s.
        worker = orbit.Worker(urls=[a.base_url, b.base_url], token=token, queues=[qid],
                              concurrency=2 if gated else 8, node_id="sdk-host")

        @worker.handler
        async def handle(task: orbit.TaskContext):
            runs[task.id] += 1
            await gate.wait()
            await asyncio.sleep(0.3)
            return {"i": task.payload["i"]}

        run = asyncio.create_task(worker.arun())
        for _ in range(200):
            if sum(runs.values()) >= (2 if gated else 6):
                break
            await asyncio.sleep(0.05)
        assert worker.url == a.base_url and sum(runs.values()) >= 2
        gone = time.time()
        await asyncio.to_thread(stop_node)
        for _ in range(100):
            if worker.url == b.base_url and worker._session is not None:
                break
            await asyncio.sleep(0.02)
        assert not run.done(), "the worker ended its run instead of going on through node B"
        gate.set()
        await _until_all_succeeded(mariadb_url, qid)
        await worker.astop()
        await asyncio.wait_for(run, 30)
        return qid, worker, gone


def _every_task_once(mariadb_url: str, qid: str, runs: Counter) -> None:
    rows = asyncio.run(fetch_all(mariadb_url, "SELECT id, state, attempts, result FROM tasks WHERE queue_id=:q",
                                 q=qid))
    assert all(r["state"] == "SUCCEEDED" and r["attempts"] == 1 for r in rows), rows
    assert len(runs) == TASKS and set(runs.values()) == {1}, runs
    leases = asyncio.run(fetch_all(mariadb_url, "SELECT task_id, outcome, late_reports FROM leases WHERE queue_id=:q",
                                   q=qid))
    assert len(leases) == TASKS, leases  # no lease expired, none was released and claimed again
    assert all(r["outcome"] == "SUCCEEDED" and r["late_reports"] in (None, "[]") for r in leases), leases
    (u,) = asyncio.run(fetch_all(mariadb_url, "SELECT * FROM queue_usage WHERE queue_id=:q", q=qid))
    assert (u["unfinished"], u["permits_in_use"], u["rate_reserved"]) == (0, 0, 0)


def _moved_in(worker_events, a, b, since: float) -> float:
    """Seconds from `since` to the session on B; the worker left A with no backoff wait."""
    (left,) = worker_events.named("disconnected")
    assert (left["server"], left["retry_in_s"]) == (f"{a.host}:{a.port}", 0.0), left
    (moved,) = worker_events.named("reconnected")
    assert moved["server"] == f"{b.host}:{b.port}", moved
    return moved["at"] - since


def test_sdk_worker_given_both_nodes_goes_on_through_the_other_when_its_node_is_killed(
        cluster, tenant, mariadb_url, worker_events):
    a, b = cluster.start_nodes(2)
    runs: Counter = Counter()
    qid, worker, killed = asyncio.run(_two_node_scenario(a, b, tenant["token"], mariadb_url, runs, a.kill,
                                                         gated=False))
    moved_in = _moved_in(worker_events, a, b, killed)
    assert worker.drained
    assert moved_in < 2.0, f"on node B {moved_in:.2f}s after node A was killed"
    _every_task_once(mariadb_url, qid, runs)
    print(f"on node B {moved_in:.3f}s after node A was killed")


def test_sdk_worker_given_both_nodes_goes_on_through_the_other_when_its_node_drains(
        cluster, tenant, mariadb_url, worker_events):
    a, b = cluster.start_nodes(2)
    runs: Counter = Counter()
    stopped: dict[str, float] = {}

    def drain_a():
        """SIGTERM: A pushes `drain` and exits once its sessions are gone (or after 10 s)."""
        began = time.monotonic()
        stopped["rc"] = a.terminate()
        stopped["took"] = time.monotonic() - began

    qid, worker, _ = asyncio.run(_two_node_scenario(a, b, tenant["token"], mariadb_url, runs, drain_a,
                                                    gated=True))
    assert worker.drained
    assert stopped["rc"] == 0 and stopped["took"] < 5.0, stopped  # the worker left at once, A did not wait
    (told,) = worker_events.named("server_draining")
    assert told["server"] == f"{a.host}:{a.port}" and told["in_flight"] == 2
    assert _moved_in(worker_events, a, b, told["at"]) < 2.0
    assert [e["reason"] for e in worker_events.named("drain_requested")] == ["stop"]  # only astop() drained it
    _every_task_once(mariadb_url, qid, runs)
    # The two attempts running when A drained were renewed through B at once, then reported there.
    rows = asyncio.run(fetch_all(mariadb_url, "SELECT server_node_id FROM leases WHERE queue_id=:q", q=qid))
    assert {r["server_node_id"].split(":", 1)[0] for r in rows} == {b.node_id}, rows
