"""A node that loses its database: it says so, tells its workers, stays quiet, and comes back.

The node reaches MariaDB through a TCP proxy the test cuts (every connection dropped, new ones
refused, as when the database host's process is gone) and restores.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import pytest
import websockets
from sqlalchemy.engine import make_url

import orbit
from tests.integration.worker_client import Worker
from tests.support.tcp_proxy import ReadyBalancer, TcpProxy

from .nodes import fetch_all

pytestmark = pytest.mark.cluster

OUTAGE_S = 10.0


def _through(proxy: TcpProxy, database_url: str) -> str:
    u = make_url(database_url)
    return database_url.replace(f"{u.host}:{u.port or 3306}", f"{proxy.host}:{proxy.port}", 1)


@pytest.fixture
def db_proxy(mariadb_url):
    u = make_url(mariadb_url)
    proxy = TcpProxy(u.port or 3306, u.host or "127.0.0.1").start()
    yield proxy
    proxy.close()


async def _until(what: str, check, timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(every)


def _log_lines(node) -> list[str]:
    return node.output(tail=None).splitlines()


def _quiet(lines: list[str]) -> list[str]:
    """Lines that are not the per-request access log (which is one line per request by design)."""
    out = []
    for line in lines:
        try:
            if json.loads(line).get("event") == "request":
                continue
        except ValueError:
            pass
        out.append(line)
    return out


def test_a_node_without_its_database_refuses_tells_its_workers_stays_quiet_and_comes_back(
        cluster_factory, tenant, mariadb_url, db_proxy):
    started = time.monotonic()
    cluster = cluster_factory(database_url=_through(db_proxy, mariadb_url), name="outage")
    node = cluster.add_node("cut-off", extra_args=("--log-level", "info"))
    token = tenant["token"]
    headers = {"Authorization": f"Bearer {token}"}

    async def scenario():
        async with httpx.AsyncClient(base_url=node.base_url, timeout=10) as http:
            r = await http.post("/v1/queues", json={"name": f"o-{uuid.uuid4().hex[:8]}", "max_concurrency": 4,
                                                    "rate_per_second": 50},
                                headers={**headers, "Idempotency-Key": uuid.uuid4().hex})
            assert r.status_code == 201, r.text
            qid = r.json()["data"]["queue"]["id"]
            async with Worker.connect(node.base_url, token) as w:
                await w.hello(qid)
                mark = len(_log_lines(node))
                db_proxy.cut()
                cut_at = time.monotonic()

                # The node says so: readiness, a drain push with its reason, refusals with a hint.
                await _until("readyz 503", lambda: _status(http, "/readyz", 503), 5)
                drain = await w.wait_push("drain", timeout=5)
                assert drain["reason"] == "database_unavailable" and drain["deadline_ms"] > 0
                claim = await w.call("claim", queue_id=qid, max_tasks=1)
                assert not claim["ok"] and claim["error"]["code"] == "UNAVAILABLE"
                assert claim["error"]["retry_after_ms"] >= 1000
                r = await http.get(f"/v1/queues/{qid}", headers=headers)
                assert r.status_code == 503 and r.json()["error"]["code"] == "UNAVAILABLE"
                assert int(r.headers["retry-after"]) >= 1
                r = await http.post(f"/v1/queues/{qid}/tasks", json={"payload": 1},
                                    headers={**headers, "Idempotency-Key": uuid.uuid4().hex})
                assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
                with pytest.raises(websockets.InvalidStatus) as refused:  # no new sessions meanwhile
                    await websockets.connect(node.base_url.replace("http", "ws", 1) + "/v1/workers/connect",
                                             additional_headers=headers)
                assert refused.value.response.status_code == 503
                assert int(refused.value.response.headers["Retry-After"]) >= 1
                metrics = await http.get("/metrics")  # still observable: the process's own metrics
                assert metrics.status_code == 200 and b"orbit_worker_sessions" in metrics.content
                # A client that ignores the hint and hammers costs the database nothing.
                for _ in range(200):
                    assert (await w.call("claim", queue_id=qid, max_tasks=1))["error"]["code"] == "UNAVAILABLE"

                # ... and stays quiet while it lasts.
                await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - cut_at)))
                during = _quiet(_log_lines(node)[mark:])
                assert len(during) < 20, "\n".join(during)
                assert not any("Traceback" in line for line in during), "\n".join(during)
                events = [json.loads(line).get("event") for line in during if line.startswith("{")]
                assert events.count("database_unavailable") == 1, events
                assert 1 <= events.count("database_still_unavailable") <= 4, events  # at 1, 3 and 7 s

                db_proxy.restore()
                restored_at = time.monotonic()
                await _until("readyz 200 again", lambda: _status(http, "/readyz", 200), 5)
                back_in = time.monotonic() - restored_at

            # Back: new sessions accepted, a task submitted and worked end to end.
            r = await http.post(f"/v1/queues/{qid}/tasks", json={"payload": {"n": 1}},
                                headers={**headers, "Idempotency-Key": uuid.uuid4().hex})
            assert r.status_code == 201, r.text
            task_id = r.json()["data"]["task"]["id"]
            async with Worker.connect(node.base_url, token) as w2:
                await w2.hello(qid)
                claim = await w2.call("claim", queue_id=qid, max_tasks=1, wait_ms=5000)
                assert claim["ok"] and [t["task_id"] for t in claim["tasks"]] == [task_id], claim
                lease_id = claim["tasks"][0]["lease_id"]
                assert (await w2.call("start", lease_id=lease_id))["ok"]
                done = await w2.call("complete", lease_id=lease_id, outcome="succeeded", result={"ok": True})
                assert done["ok"] and done["task_state"] == "SUCCEEDED", done
            r = await http.get(f"/v1/tasks/{task_id}", headers=headers)
            assert r.json()["data"]["state"] == "SUCCEEDED"
            return back_in

    back_in = asyncio.run(scenario())
    after = [json.loads(line).get("event") for line in _quiet(_log_lines(node)) if line.startswith("{")]
    assert after.count("database_available") == 1, after
    print(f"readyz 200 {back_in:.2f}s after the database came back; test took {time.monotonic() - started:.1f}s")


async def _status(http: httpx.AsyncClient, path: str, want: int) -> bool:
    try:
        return (await http.get(path)).status_code == want
    except httpx.HTTPError:
        return False


def test_an_sdk_worker_goes_on_through_a_node_that_has_its_database(cluster_factory, tenant, mariadb_url,
                                                                     db_proxy, worker_events):
    """Two nodes behind a balancer that checks /readyz; node A reaches the database through the
    proxy, node B directly. A's outage sends the worker, through the same URL, to B."""
    a = cluster_factory(database_url=_through(db_proxy, mariadb_url), name="a").add_node("node-a", wait=False)
    b = cluster_factory(name="b").add_node("node-b", wait=False)
    a.wait_ready()
    b.wait_ready()
    balancer = ReadyBalancer([a.port, b.port]).start()
    token = tenant["token"]

    async def served_by(task_id: str) -> str:
        rows = await fetch_all(mariadb_url, "SELECT server_node_id FROM leases WHERE task_id = :t", t=task_id)
        return rows[-1]["server_node_id"].split(":", 1)[0] if rows else ""

    async def scenario():
        worked: list[str] = []
        async with orbit.AsyncClient(b.base_url, token=token) as client:
            q = await client.create_queue(uuid.uuid4().hex, orbit.CreateQueueRequest(
                name=f"move-{uuid.uuid4().hex[:8]}", max_concurrency=4, rate_per_second=100))
            qid = q.queue.id
            worker = orbit.Worker(url=balancer.base_url, token=token, queues=[qid], concurrency=2,
                                  claim_wait_ms=1000, reconnect_initial=0.2, reconnect_max=2.0)

            @worker.handler
            async def handle(task: orbit.TaskContext):
                worked.append(task.id)
                return {"ok": True}

            run = asyncio.create_task(worker.arun())

            async def submit_and_wait() -> str:
                t = await client.submit_task(qid, uuid.uuid4().hex, orbit.SubmitTaskRequest(payload={}))
                task_id = t.task.id

                async def done():
                    return (await client.get_task(task_id)).state == "SUCCEEDED"

                await _until(f"task {task_id} worked", done, 15)
                return task_id

            first = await submit_and_wait()
            assert await served_by(first) == "node-a"

            db_proxy.cut()
            cut_at = time.monotonic()
            second = await submit_and_wait()  # submitted through B, worked through B
            moved_in = time.monotonic() - cut_at
            assert await served_by(second) == "node-b"
            assert not run.done(), "the worker ended its run instead of reconnecting"
            assert worked == [first, second]
            events = worker_events.names
            assert "server_lost_database" in events and "drain_requested" not in events
            assert events.count("reconnected") >= 1, events

            db_proxy.restore()
            await asyncio.to_thread(a.wait_ready, 10)
            await worker.astop()
            await asyncio.wait_for(run, 15)
            assert worker.drained
            return moved_in

    try:
        moved_in = asyncio.run(scenario())
    finally:
        balancer.close()
    print(f"a task submitted at the cut was worked through the other node {moved_in:.2f}s later")


def test_a_node_started_while_its_database_is_down_waits_for_it(cluster_factory, mariadb_url, db_proxy):
    """A node (re)started during a database restart does not exit: it comes up when the
    database answers (chaos runs restart nodes and MariaDB at the same time)."""
    db_proxy.cut()
    cluster = cluster_factory(database_url=_through(db_proxy, mariadb_url), name="boot-outage")
    node = cluster.add_node("early", wait=False)
    waiting = "the database does not answer; waiting up to 120s"
    deadline = time.monotonic() + 20
    while waiting not in node.output(tail=None) and time.monotonic() < deadline:
        assert node.alive, node.describe()
        time.sleep(0.1)
    time.sleep(1.5)  # a few more failed attempts, said nothing more
    assert node.alive, node.describe()
    db_proxy.restore()
    node.wait_ready(30)
    assert node.output(tail=None).count(waiting) == 1, node.describe()
    assert node.terminate() == 0
