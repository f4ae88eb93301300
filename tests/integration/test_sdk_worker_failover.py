"""`orbit.Worker(urls=[...])` against two real uvicorn nodes on one database, on both backends.

The worker goes on through the next URL when a node is unreachable, refuses it, stops or
drains, without the reconnect backoff while another node is up. Every wait is bounded;
"at once" is asserted against a `reconnect_initial` far longer than the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import pytest

import orbit
from orbit.server.app import create_app
from orbit.server.config import Settings

from .test_sdk_worker import attempts_of, get_task, lease_rows, running, submit, usage, wait_states, wait_until
from .worker_client import free_port, serve

pytestmark = pytest.mark.anyio

# Longer than any wait below: a worker that backed off would fail the test.
SLOW_BACKOFF = {"reconnect_initial": 10.0, "reconnect_max": 10.0}


@contextlib.asynccontextmanager
async def two_nodes(db, db_url):
    """Nodes A and B on the same database; yields (url_a, app_a, url_b, app_b)."""
    app_a = create_app(Settings(database_url=db_url, node_id="node-a", background_loops=True), db)
    app_b = create_app(Settings(database_url=db_url, node_id="node-b", background_loops=True), db)
    async with serve(app_a) as url_a, serve(app_b) as url_b:
        yield url_a, app_a, url_b, app_b


@contextlib.asynccontextmanager
async def refusing_node():
    """A node that refuses every worker session with 503 and a long Retry-After."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def server_of(row: dict) -> str:
    return row["server_node_id"].split(":", 1)[0]


async def test_a_worker_goes_past_a_dead_and_a_refusing_node_at_once(tenant, db, db_url, worker_events):
    q = await tenant.create_queue()
    ids = await submit(tenant, q["id"], 3)
    dead = f"http://127.0.0.1:{free_port()}"
    calls: Counter[str] = Counter()
    async with refusing_node() as refusing, two_nodes(db, db_url) as (live, _, _b, _app_b):
        w = orbit.Worker(urls=[dead, refusing, live], token=tenant.token, queues=[q["id"]], claim_wait_ms=300,
                         **SLOW_BACKOFF)

        @w.handler
        async def handle(task: orbit.TaskContext):
            calls[task.id] += 1
            return "done"

        loop = asyncio.get_running_loop()
        began = loop.time()
        async with running(w):
            tasks = await wait_states(tenant, ids, timeout=20)
            took = loop.time() - began
            assert w.url == live
    assert took < 4.0, f"{took:.2f}s: the worker waited before trying the next URL"
    assert all(t["state"] == "SUCCEEDED" and t["attempts"] == 1 for t in tasks)
    assert set(calls.values()) == {1} and len(calls) == 3
    assert w.drained
    failed = worker_events.named("connect_failed")
    assert [(e.get("status"), e["retry_in_s"]) for e in failed] == [(None, 0.0), (503, 0.0)], failed
    (connected,) = worker_events.named("connected")
    assert connected["server"] == live.removeprefix("http://")


async def test_a_worker_on_a_node_that_drains_goes_on_through_the_other(tenant, db, db_url, worker_events):
    """Node A drains while two handlers run: the worker moves to B at once, the handlers finish and
    are reported through B, a cancel request reaches a handler by push through B, and the worker
    keeps claiming there; nothing runs twice."""
    q = await tenant.create_queue(max_concurrency=8, rate_per_second=100)
    ids = await submit(tenant, q["id"], 6)
    gate = asyncio.Event()
    calls: Counter[str] = Counter()
    first: list[str] = []
    async with two_nodes(db, db_url) as (a, app_a, b, _):
        w = orbit.Worker(urls=[a, b], token=tenant.token, queues=[q["id"]], concurrency=2, claim_wait_ms=300,
                         **SLOW_BACKOFF)

        @w.handler
        async def handle(task: orbit.TaskContext):
            calls[task.id] += 1
            if len(first) < 2:
                first.append(task.id)
                gate_or_cancel = asyncio.ensure_future(task.cancel_requested.wait())
                await asyncio.wait({gate_or_cancel, asyncio.ensure_future(gate.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)
                if task.cancel_requested.is_set():
                    raise asyncio.CancelledError()
            return {"i": task.payload["i"]}

        async with running(w) as run:
            await wait_until(lambda: len(first) == 2, 20, "two running handlers")
            assert w.url == a
            await app_a.state.node.hub.begin_drain(10_000)
            await wait_until(lambda: w.url == b and w._session is not None, 3, "a session on node B")
            assert not run.done() and not w._draining

            # The running leases now renew through B, so a cancel request is pushed there
            # (far sooner than the next periodic renew, a third of the 30-s lease away).
            r = await tenant.post(f"/v1/tasks/{first[0]}:cancel", {"reason": "moved"})
            assert r.status_code == 200, r.text
            (cancelled,) = await wait_states(tenant, [first[0]], timeout=5)
            assert cancelled["state"] == "CANCELLED"

            gate.set()
            tasks = await wait_states(tenant, ids, timeout=30)
    assert w.drained
    assert set(calls.values()) == {1} and len(calls) == 6
    assert sorted(t["state"] for t in tasks) == ["CANCELLED"] + ["SUCCEEDED"] * 5
    assert all(t["attempts"] == 1 for t in tasks)
    for t in ids:
        (attempt,) = await attempts_of(tenant, t)
        assert attempt["late_reports"] == []
        (lease,) = await lease_rows(tenant, t)
        assert server_of(lease) == "node-b", (t, lease["server_node_id"])  # claimed or renewed through B
    assert worker_events.named("server_draining")
    assert [e["reason"] for e in worker_events.named("drain_requested")] == ["stop"]  # only astop() drained it
    (moved,) = worker_events.named("reconnected")
    assert moved["server"] == b.removeprefix("http://") and moved["in_flight"] == 2
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 0)


async def test_a_worker_whose_node_stops_mid_task_reports_through_the_other(tenant, db, db_url, worker_events):
    """Node A goes away with two handlers running: the worker is on B at once and delivers the
    reports there; each task ran once and ended once."""
    q = await tenant.create_queue(max_concurrency=8, rate_per_second=100)
    ids = await submit(tenant, q["id"], 4)
    gate = asyncio.Event()
    calls: Counter[str] = Counter()
    app_a = create_app(Settings(database_url=db_url, node_id="node-a", background_loops=True), db)
    app_b = create_app(Settings(database_url=db_url, node_id="node-b", background_loops=True), db)
    async with serve(app_b) as b:
        run = None
        try:
            async with serve(app_a) as a:
                w = orbit.Worker(urls=[a, b], token=tenant.token, queues=[q["id"]], concurrency=2,
                                 claim_wait_ms=300, **SLOW_BACKOFF)

                @w.handler
                async def handle(task: orbit.TaskContext):
                    calls[task.id] += 1
                    await gate.wait()
                    return {"done": task.id}

                run = asyncio.create_task(w.arun())
                await wait_until(lambda: sum(calls.values()) == 2, 20, "two running handlers")
            stopped = asyncio.get_running_loop().time()
            await wait_until(lambda: w.url == b and w._session is not None, 3, "a session on node B")
            moved_in = asyncio.get_running_loop().time() - stopped
            gate.set()
            tasks = await wait_states(tenant, ids, timeout=30)
            await asyncio.wait_for(w.astop(), 30)
            await asyncio.wait_for(run, 30)
        finally:
            if run is not None and not run.done():
                run.cancel()
                with contextlib.suppress(BaseException):
                    await run
    assert moved_in < 3.0
    assert w.drained and w.pending_reports == 0
    assert all(t["state"] == "SUCCEEDED" and t["attempts"] == 1 for t in tasks), tasks
    assert set(calls.values()) == {1} and len(calls) == 4
    for t in ids:
        (attempt,) = await attempts_of(tenant, t)
        assert attempt["outcome"] == "SUCCEEDED" and attempt["late_reports"] == []
        assert (await get_task(tenant, t))["result"] == {"done": t}
    assert [e["server"] for e in worker_events.named("reconnected")] == [b.removeprefix("http://")]
