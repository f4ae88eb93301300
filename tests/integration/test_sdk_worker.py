"""`orbit.Worker` and `orbit.WorkerSession` against a real uvicorn server, on both backends.

The server runs with its background loops (lease recovery, deadline sweep). Every
wait is bounded; timing is only asserted through the server's stored evidence
(attempt start/end times) and with generous bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import threading
from collections import Counter
from datetime import datetime

import orjson
import pytest
import uvicorn
import websockets
from sqlalchemy import select

import orbit
from orbit.sdk.session import WorkerSession
from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.store.tables import leases, queue_usage
from orbit.server.ws.corked import websocket_protocol

from .worker_client import free_port, serve

pytestmark = pytest.mark.anyio

FAST_RETRY = {"initial_backoff_ms": 1, "max_backoff_ms": 1, "jitter": 0.0}
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
async def server(db, db_url):
    app = create_app(Settings(database_url=db_url, node_id="sdk-worker", background_loops=True), db)
    async with serve(app) as url:
        yield url


@contextlib.asynccontextmanager
async def serve_on(app, port: int):
    """Like `serve`, on a given port (to restart a server on the same address)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="on",
                            ws_ping_interval=None, ws=websocket_protocol())
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None
    task = asyncio.create_task(server.serve())
    for _ in range(250):
        if server.started or task.done():
            break
        await asyncio.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 15)


async def submit(tenant, queue_id, n=1, **fields):
    ids = []
    for i in range(n):
        r = await tenant.post(f"/v1/queues/{queue_id}/tasks", {"payload": {"i": i}, **fields})
        assert r.status_code == 201, r.text
        ids.append(r.json()["data"]["task"]["id"])
    return ids


async def get_task(tenant, task_id):
    r = await tenant.get(f"/v1/tasks/{task_id}")
    assert r.status_code == 200, r.text
    return r.json()["data"]


async def attempts_of(tenant, task_id):
    r = await tenant.get(f"/v1/tasks/{task_id}/attempts")
    assert r.status_code == 200, r.text
    return r.json()["data"]["items"]


async def wait_states(tenant, ids, states=TERMINAL, timeout=30.0):
    """Poll until every task is in one of `states`; return the tasks."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    while True:
        tasks = [await get_task(tenant, t) for t in ids]
        if all(t["state"] in states for t in tasks):
            return tasks
        if loop.time() > until:
            raise AssertionError(f"not all in {states} within {timeout}s: {[(t['id'], t['state']) for t in tasks]}")
        await asyncio.sleep(0.1)


async def wait_until(cond, timeout=15.0, what="condition"):
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    while not cond():
        if loop.time() > until:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(worker: orbit.Worker, stop_timeout: float = 30.0):
    """Run `worker.arun()` in the background; stop (drain) it on exit, bounded."""
    task = asyncio.create_task(worker.arun())
    try:
        yield task
    finally:
        if not task.done():
            await asyncio.wait_for(worker.astop(), stop_timeout)
        await asyncio.wait_for(task, stop_timeout)


async def usage(tenant, queue_id):
    async def read(tx):
        return dict(await tx.one_or_none(select(queue_usage).where(queue_usage.c.queue_id == queue_id)))
    return await tenant.db.core_read(read)


async def lease_rows(tenant, task_id):
    async def read(tx):
        return [dict(r) for r in await tx.all(select(leases).where(leases.c.task_id == task_id))]
    return await tenant.db.core_read(read)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def make_worker(server, tenant, queues, **kw) -> orbit.Worker:
    kw.setdefault("claim_wait_ms", 300)
    kw.setdefault("reconnect_initial", 0.05)
    kw.setdefault("reconnect_max", 0.5)
    return orbit.Worker(url=server, token=tenant.token, queues=queues, **kw)


# ---------------------------------------------------------------- limits


async def test_queue_limits_hold_for_a_greedy_worker(tenant, server):
    """concurrency=8 against a queue of 2 concurrent / 1 Start per second."""
    q = await tenant.create_queue(max_concurrency=2, rate_per_second=1)
    ids = await submit(tenant, q["id"], 5)
    calls: Counter[str] = Counter()
    now_running = peak = 0

    w = make_worker(server, tenant, [q["id"]], concurrency=8)

    @w.handler
    async def handle(task: orbit.TaskContext):
        nonlocal now_running, peak
        calls[task.id] += 1
        now_running += 1
        peak = max(peak, now_running)
        try:
            await asyncio.sleep(1.5)
        finally:
            now_running -= 1
        return {"i": task.payload["i"]}

    async with running(w):
        tasks = await wait_states(tenant, ids, timeout=60)
    assert w.drained
    assert all(t["state"] == "SUCCEEDED" and t["attempts"] == 1 for t in tasks)
    assert sorted(t["result"]["i"] for t in tasks) == list(range(5))
    assert set(calls.values()) == {1} and len(calls) == 5
    assert peak <= 2

    # The stored evidence: never more than 2 attempts running, never 2 Starts in one rate window.
    spans = []
    for t in ids:
        (a,) = await attempts_of(tenant, t)
        spans.append((ts(a["started_at"]), ts(a["ended_at"])))
    starts = sorted(s for s, _ in spans)
    for s in starts:
        assert sum(1 for b, e in spans if b <= s < e) <= 2
    for earlier, later in itertools.pairwise(starts):
        assert (later - earlier).total_seconds() >= 0.999, starts
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 0)


# ---------------------------------------------------------------- handler kinds and outcomes


async def test_sync_and_async_handlers(tenant, server):
    q_sync = await tenant.create_queue()
    q_async = await tenant.create_queue()
    sync_ids = await submit(tenant, q_sync["id"], 3, priority=7, deadline_seconds=120)
    async_ids = await submit(tenant, q_async["id"], 3)
    seen: dict[str, dict] = {}
    loop_thread = threading.current_thread()

    sync_worker = make_worker(server, tenant, [q_sync["id"]], concurrency=2)
    async_worker = make_worker(server, tenant, [q_async["id"]], concurrency=2)

    @sync_worker.handler
    def sync_handler(task: orbit.TaskContext):
        seen[task.id] = {"thread": threading.current_thread(), "event": type(task.cancel_requested),
                         "ctx": task}
        return {"sync": task.payload["i"]}

    @async_worker.handler
    async def async_handler(task: orbit.TaskContext):
        seen[task.id] = {"thread": threading.current_thread(), "event": type(task.cancel_requested),
                         "ctx": task}
        await asyncio.sleep(0.01)
        return {"async": task.payload["i"]}

    async with running(sync_worker), running(async_worker):
        tasks = await wait_states(tenant, sync_ids + async_ids)
    assert sync_worker.drained and async_worker.drained
    assert all(t["state"] == "SUCCEEDED" and t["attempts"] == 1 for t in tasks)
    for t in sync_ids:
        assert seen[t]["thread"] is not loop_thread and seen[t]["event"] is threading.Event
        ctx = seen[t]["ctx"]
        assert ctx.queue_id == q_sync["id"] and ctx.priority == 7 and ctx.attempt == 1 and ctx.lease_id
        assert ctx.deadline_at is not None and ctx.deadline_at.tzinfo is not None and ctx.start_deadline_at is None
        assert (await get_task(tenant, t))["result"] == {"sync": ctx.payload["i"]}
    for t in async_ids:
        assert seen[t]["thread"] is loop_thread and seen[t]["event"] is asyncio.Event
        ctx = seen[t]["ctx"]
        assert ctx.queue_id == q_async["id"] and ctx.deadline_at is None and ctx.id == t
        assert (await get_task(tenant, t))["result"] == {"async": ctx.payload["i"]}


async def test_retryable_permanent_and_unexpected_errors(tenant, server):
    q = await tenant.create_queue()
    qid = q["id"]

    async def one(mode, **fields):
        r = await tenant.post(f"/v1/queues/{qid}/tasks", {"payload": {"mode": mode}, "retry": FAST_RETRY, **fields})
        assert r.status_code == 201, r.text
        return r.json()["data"]["task"]["id"]

    retry_once = await one("retry-once")
    boom_once = await one("boom-once")
    permanent = await one("permanent")
    always = await one("always-retry", max_attempts=2)
    not_json = await one("not-json")
    calls: Counter[str] = Counter()

    w = make_worker(server, tenant, [qid], concurrency=4)

    @w.handler
    def handle(task: orbit.TaskContext):
        calls[task.id] += 1
        mode = task.payload["mode"]
        if mode == "retry-once" and task.attempt == 1:
            raise orbit.RetryableError("try again")
        if mode == "boom-once" and task.attempt == 1:
            raise ValueError("unexpected")
        if mode == "permanent":
            raise orbit.PermanentError("bad input")
        if mode == "always-retry":
            raise orbit.RetryableError("still broken")
        if mode == "not-json":
            return {1, 2}
        return {"attempt": task.attempt}

    ids = [retry_once, boom_once, permanent, always, not_json]
    async with running(w):
        await wait_states(tenant, ids)
    t = await get_task(tenant, retry_once)
    assert (t["state"], t["attempts"], t["result"]) == ("SUCCEEDED", 2, {"attempt": 2})
    assert [a["outcome"] for a in await attempts_of(tenant, retry_once)] == ["FAILED", "SUCCEEDED"]
    t = await get_task(tenant, boom_once)
    assert (t["state"], t["attempts"]) == ("SUCCEEDED", 2)
    first = (await attempts_of(tenant, boom_once))[0]
    assert first["outcome"] == "FAILED" and "ValueError" in first["error"]["message"]
    t = await get_task(tenant, permanent)
    assert (t["state"], t["attempts"]) == ("FAILED", 1)
    assert t["error"] == {"code": "HANDLER_ERROR", "message": "bad input"}
    t = await get_task(tenant, always)
    assert (t["state"], t["attempts"], t["error"]["code"]) == ("FAILED", 2, "ATTEMPTS_EXHAUSTED")
    t = await get_task(tenant, not_json)
    assert (t["state"], t["attempts"]) == ("FAILED", 1)
    assert calls == {retry_once: 2, boom_once: 2, permanent: 1, always: 2, not_json: 1}


# ---------------------------------------------------------------- cancellation


async def test_handler_ignoring_cancellation_is_cancelled_after_the_grace_period(tenant, server):
    q = await tenant.create_queue()
    (stubborn,) = await submit(tenant, q["id"], 1)
    started = asyncio.Event()
    observed: dict[str, object] = {}
    loop = asyncio.get_running_loop()

    w = make_worker(server, tenant, [q["id"]], concurrency=2, cancel_grace=0.5)

    @w.handler
    async def handle(task: orbit.TaskContext):
        started.set()
        try:
            # Woken by the event itself (not a polling loop, which a busy machine can delay
            # past the grace timer armed with it), then ignores the request on purpose.
            await task.cancel_requested.wait()
            observed["event_at"] = loop.time()
            while True:
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            observed["cancelled_at"] = loop.time()
            raise

    async with running(w):
        await asyncio.wait_for(started.wait(), 15)
        r = await tenant.post(f"/v1/tasks/{stubborn}:cancel", {"reason": "no longer needed"})
        assert r.status_code == 200 and r.json()["data"]["task"]["cancel_requested"] is True
        (t,) = await wait_states(tenant, [stubborn], timeout=20)
    assert t["state"] == "CANCELLED" and t["attempts"] == 1
    assert "event_at" in observed and "cancelled_at" in observed
    assert observed["cancelled_at"] - observed["event_at"] >= 0.4  # the grace period was given
    assert [a["outcome"] for a in await attempts_of(tenant, stubborn)] == ["CANCELLED"]
    assert w.drained


async def test_cooperative_cancel_of_a_sync_handler(tenant, server):
    q = await tenant.create_queue()
    (tid,) = await submit(tenant, q["id"], 1)
    started = threading.Event()
    w = make_worker(server, tenant, [q["id"]], concurrency=1)

    @w.handler
    def handle(task: orbit.TaskContext):
        started.set()
        if not task.cancel_requested.wait(20):
            return "not cancelled"
        raise orbit.RetryableError("stopping because of the cancel request")

    async with running(w):
        await asyncio.wait_for(asyncio.to_thread(started.wait, 15), 20)
        r = await tenant.post(f"/v1/tasks/{tid}:cancel", {"reason": "stop"})
        assert r.status_code == 200
        (t,) = await wait_states(tenant, [tid], timeout=20)
    assert t["state"] == "CANCELLED"


async def test_cancel_reaches_the_handler_through_renew_after_a_reconnect(tenant, server):
    """The cancel push goes to the session that claimed or renewed last: after a reconnect the
    worker renews its running leases at once, so the cancel reaches the handler there."""
    q = await tenant.create_queue()
    (tid,) = await submit(tenant, q["id"], 1)
    started = asyncio.Event()
    w = make_worker(server, tenant, [q["id"]], concurrency=1, lease_ms=3000)

    @w.handler
    async def handle(task: orbit.TaskContext):
        started.set()
        await asyncio.wait_for(task.cancel_requested.wait(), 20)
        raise asyncio.CancelledError()  # acknowledge

    async with running(w):
        await asyncio.wait_for(started.wait(), 15)
        old = w._session
        await old.close()  # drop the socket; the worker reconnects with a new session
        await wait_until(lambda: w._session is not None and w._session is not old, 10, "a new session")
        r = await tenant.post(f"/v1/tasks/{tid}:cancel", {"reason": "stop"})
        assert r.status_code == 200
        (t,) = await wait_states(tenant, [tid], timeout=20)
    assert (t["state"], t["attempts"]) == ("CANCELLED", 1)
    assert w.drained


async def test_a_revoked_lease_is_abandoned_without_a_report(tenant, server, monkeypatch):
    q = await tenant.create_queue()
    (tid,) = await submit(tenant, q["id"], 1)
    real_call = WorkerSession.call

    async def call(self, type_, *, msg_id=None, timeout=None, **fields):
        if type_ == "renew":  # renewals never arrive: the 1-second lease expires on the server
            await asyncio.Event().wait()
        return await real_call(self, type_, msg_id=msg_id, timeout=timeout, **fields)

    monkeypatch.setattr(WorkerSession, "call", call)
    observed: dict[str, bool] = {}
    w = make_worker(server, tenant, [q["id"]], concurrency=1, lease_ms=1000)

    @w.handler
    async def handle(task: orbit.TaskContext):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            observed["cancelled"] = True
            observed["event"] = task.cancel_requested.is_set()
            raise

    async with running(w):
        await wait_until(lambda: "cancelled" in observed, 20, "the handler abandoned")
        await wait_until(lambda: w.in_flight == 0, 10, "the lease forgotten")
    assert observed == {"cancelled": True, "event": True}
    t = await get_task(tenant, tid)
    assert (t["state"], t["attempts"], t["error"]["code"]) == ("NEEDS_REVIEW", 1, "LEASE_LOST")
    (a,) = await attempts_of(tenant, tid)
    assert a["outcome"] == "LEASE_LOST" and a["late_reports"] == []  # nothing was reported


async def test_a_handler_longer_than_its_lease_is_renewed_and_succeeds(tenant, server, monkeypatch):
    q = await tenant.create_queue()
    (tid,) = await submit(tenant, q["id"], 1)
    renewals: list[str] = []
    real_call = WorkerSession.call

    async def call(self, type_, *, msg_id=None, timeout=None, **fields):
        if type_ == "renew":
            renewals.append(msg_id)
        return await real_call(self, type_, msg_id=msg_id, timeout=timeout, **fields)

    monkeypatch.setattr(WorkerSession, "call", call)
    w = make_worker(server, tenant, [q["id"]], concurrency=1, lease_ms=2000)

    @w.handler
    async def handle(task: orbit.TaskContext):
        await asyncio.sleep(4.5)  # over two leases: only renewals keep it
        return "done"

    async with running(w):
        (t,) = await wait_states(tenant, [tid])
    assert (t["state"], t["attempts"], t["result"]) == ("SUCCEEDED", 1, "done")
    assert len(renewals) >= 3 and len(set(renewals)) == len(renewals)


async def test_a_start_whose_reply_never_comes_is_sent_again_with_the_same_id(tenant, server, monkeypatch):
    """The first Start frame is lost on its way: after the reply timeout the worker sends it
    again with the same message id, and the task runs once."""
    from orbit.sdk import session as session_mod

    q = await tenant.create_queue()
    (tid,) = await submit(tenant, q["id"], 1)
    starts: list[tuple[str, bool]] = []
    real_send_now = session_mod._Connection.send_now
    real_call = WorkerSession.call

    def send_now(self, text):
        frame = orjson.loads(text)
        if frame.get("type") == "start":
            lost = not starts
            starts.append((frame["id"], lost))
            if lost:
                return True  # "sent", never reaches the server
        return real_send_now(self, text)

    async def call(self, type_, *, msg_id=None, timeout=None, **fields):
        if type_ == "start":
            starts.append((msg_id, False))
        return await real_call(self, type_, msg_id=msg_id, timeout=timeout, **fields)

    monkeypatch.setattr(session_mod._Connection, "send_now", send_now)
    monkeypatch.setattr(WorkerSession, "call", call)
    runs: list[int] = []
    w = make_worker(server, tenant, [q["id"]], concurrency=1, reply_timeout=1.0)

    @w.handler
    async def handle(task: orbit.TaskContext):
        runs.append(task.attempt)

    async with running(w):
        (t,) = await wait_states(tenant, [tid])
    assert (t["state"], t["attempts"], runs) == ("SUCCEEDED", 1, [1])
    ids = {msg_id for msg_id, _ in starts}
    assert starts[0][1] and len(starts) >= 2 and len(ids) == 1, starts


# ---------------------------------------------------------------- Start backoff, release, drain


async def test_paused_start_backs_off_with_the_same_message_id_then_runs(tenant, server, monkeypatch):
    q = await tenant.create_queue()
    qid = q["id"]
    (tid,) = await submit(tenant, qid, 1)
    sent: list[tuple[str, str]] = []
    real_call, real_claim = WorkerSession.call, WorkerSession.claim
    paused = asyncio.Event()

    async def configure(paused_flag: bool):
        queue = (await tenant.get(f"/v1/queues/{qid}")).json()["data"]
        r = await tenant.post(f"/v1/queues/{qid}:configure", {
            "expected_revision": queue["revision"], "reason": "test", "paused": paused_flag,
            "max_concurrency": 8, "rate_per_second": 100, "max_unfinished_tasks": 100})
        assert r.status_code == 200, r.text

    async def call(self, type_, *, msg_id=None, timeout=None, **fields):
        sent.append((type_, msg_id))
        return await real_call(self, type_, msg_id=msg_id, timeout=timeout, **fields)

    async def claim(self, queue_id, **kw):
        got = await real_claim(self, queue_id, **kw)
        if got and not paused.is_set():
            paused.set()
            await configure(True)  # pause between the claim and the Start
        return got

    monkeypatch.setattr(WorkerSession, "call", call)
    monkeypatch.setattr(WorkerSession, "claim", claim)
    calls: Counter[str] = Counter()
    w = make_worker(server, tenant, [qid], concurrency=2)

    @w.handler
    async def handle(task: orbit.TaskContext):
        calls[task.id] += 1
        return "ran"

    async with running(w):
        await wait_until(lambda: sum(1 for k, _ in sent if k == "start") >= 2, 20, "two Start attempts")
        assert calls[tid] == 0  # never run without a Start
        t = await get_task(tenant, tid)
        assert (t["state"], t["attempts"]) == ("LEASED", 0)
        await configure(False)
        (t,) = await wait_states(tenant, [tid], timeout=20)
    assert (t["state"], t["attempts"], t["result"]) == ("SUCCEEDED", 1, "ran")
    start_ids = {m for k, m in sent if k == "start"}
    assert len(start_ids) == 1  # every retry replayed the same message id
    assert calls[tid] == 1


async def test_a_start_that_cannot_happen_within_the_lease_is_released(tenant, server, monkeypatch):
    q = await tenant.create_queue()
    qid = q["id"]
    (tid,) = await submit(tenant, qid, 1)
    real_claim = WorkerSession.claim
    claimed = asyncio.Event()

    async def claim(self, queue_id, **kw):
        got = await real_claim(self, queue_id, **kw)
        if got and not claimed.is_set():
            claimed.set()
            r = await tenant.post(f"/v1/queues/{qid}:configure", {
                "expected_revision": "1", "reason": "pause for good", "paused": True,
                "max_concurrency": 8, "rate_per_second": 100, "max_unfinished_tasks": 100})
            assert r.status_code == 200, r.text
        return got

    monkeypatch.setattr(WorkerSession, "claim", claim)
    calls: Counter[str] = Counter()
    w = make_worker(server, tenant, [qid], concurrency=1, lease_ms=3000)

    @w.handler
    async def handle(task: orbit.TaskContext):
        calls[task.id] += 1

    async with running(w):
        await asyncio.wait_for(claimed.wait(), 15)

        async def released():
            return [r for r in await lease_rows(tenant, tid) if r["outcome"] == "RELEASED"]

        loop = asyncio.get_running_loop()
        until = loop.time() + 15
        while not await released():
            assert loop.time() < until, "the lease was not released"
            await asyncio.sleep(0.1)
    t = await get_task(tenant, tid)
    assert (t["state"], t["attempts"]) == ("WAITING", 0) and calls[tid] == 0
    assert w.drained
    u = await usage(tenant, qid)
    assert (u["permits_in_use"], u["rate_reserved"]) == (0, 0)


async def test_stop_drains_without_losing_or_duplicating_work(tenant, server):
    q = await tenant.create_queue(max_concurrency=8, rate_per_second=100)
    ids = await submit(tenant, q["id"], 12)
    calls: Counter[str] = Counter()
    finished: Counter[str] = Counter()

    async def handle(task: orbit.TaskContext):
        calls[task.id] += 1
        await asyncio.sleep(0.3)
        finished[task.id] += 1
        return {"i": task.payload["i"]}

    first = make_worker(server, tenant, [q["id"]], concurrency=3)
    first.handler(handle)
    run = asyncio.create_task(first.arun())
    await wait_until(lambda: sum(calls.values()) >= 3, 20, "three handlers started")
    await asyncio.to_thread(first.stop)  # from another thread
    await asyncio.wait_for(run, 30)
    assert first.drained and first.in_flight == 0 and first.pending_reports == 0
    assert calls == finished  # every started handler finished and was reported
    tasks = [await get_task(tenant, t) for t in ids]
    assert {t["state"] for t in tasks} <= {"SUCCEEDED", "WAITING"}
    for t in tasks:
        assert t["attempts"] == (1 if t["state"] == "SUCCEEDED" else 0)
        assert (t["state"] == "SUCCEEDED") == (t["id"] in finished)
    assert any(t["state"] == "WAITING" for t in tasks)

    second = make_worker(server, tenant, [q["id"]], concurrency=4)
    second.handler(handle)
    async with running(second):
        tasks = await wait_states(tenant, ids, timeout=30)
    assert all(t["state"] == "SUCCEEDED" and t["attempts"] == 1 for t in tasks)
    assert set(calls.values()) == {1} and len(calls) == 12
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 0)


async def test_stop_before_run_and_astop(tenant, server):
    q = await tenant.create_queue()
    w = make_worker(server, tenant, [q["id"]])

    @w.handler
    async def handle(task):
        return None

    w.stop()  # before run: the run drains at once
    await asyncio.wait_for(w.arun(), 15)
    assert w.drained
    async with running(w) as task:
        await asyncio.sleep(0.2)
        await asyncio.wait_for(w.astop(), 15)
        assert task.done()
    assert w.drained


async def test_a_server_drain_push_finishes_running_work_claims_nothing_more_and_goes_on(tenant, db, db_url):
    """With one URL, a drain makes the worker finish and report its running work through the node,
    claim nothing more there, and reconnect through the same URL once the node closes the session:
    a rolling restart behind a balancer never ends the run. Here the balancer's next node is the
    same one, restarted."""
    q = await tenant.create_queue(max_concurrency=8, rate_per_second=100)
    ids = await submit(tenant, q["id"], 4)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gate = asyncio.Event()
    calls: Counter[str] = Counter()
    w = orbit.Worker(url=url, token=tenant.token, queues=[q["id"]], concurrency=2, claim_wait_ms=300,
                     reconnect_initial=0.05, reconnect_max=0.3)

    @w.handler
    async def handle(task: orbit.TaskContext):
        calls[task.id] += 1
        await gate.wait()
        return "finished"

    run = None
    try:
        app1 = create_app(Settings(database_url=db_url, node_id="draining", background_loops=True), db)
        async with serve_on(app1, port):
            run = asyncio.create_task(w.arun())
            await wait_until(lambda: sum(calls.values()) == 2, 20, "two running handlers")
            await app1.state.node.hub.begin_drain(10_000)
            await asyncio.sleep(0.3)
            gate.set()
            # Both report through the draining node; nothing more is claimed there.
            await wait_until(lambda: w.pending_reports == 0 and not w.in_flight, 20, "reports delivered")
            await asyncio.sleep(0.5)
            assert sum(calls.values()) == 2 and not run.done()
            states = sorted([(await get_task(tenant, t))["state"] for t in ids])
            assert states == ["SUCCEEDED", "SUCCEEDED", "WAITING", "WAITING"]
        app2 = create_app(Settings(database_url=db_url, node_id="next", background_loops=True), db)
        async with serve_on(app2, port):
            await wait_until(lambda: sum(calls.values()) == 4, 20, "the other two through the next node")
            await w.astop()
            await asyncio.wait_for(run, 20)
    finally:
        if run is not None and not run.done():
            run.cancel()
    assert w.drained and sum(calls.values()) == 4
    tasks = [await get_task(tenant, t) for t in ids]
    assert all(t["state"] == "SUCCEEDED" and t["attempts"] == 1 for t in tasks)


# ---------------------------------------------------------------- server restart


async def test_server_restart_mid_task_finishes_every_task_exactly_once(tenant, db, db_url):
    q = await tenant.create_queue(max_concurrency=8, rate_per_second=100)
    ids = await submit(tenant, q["id"], 4)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gate = asyncio.Event()
    calls: Counter[str] = Counter()

    w = orbit.Worker(url=url, token=tenant.token, queues=[q["id"]], concurrency=2, claim_wait_ms=300,
                     reconnect_initial=0.05, reconnect_max=0.3)

    @w.handler
    async def handle(task: orbit.TaskContext):
        calls[task.id] += 1
        await gate.wait()
        return {"done": task.id}

    run = None
    try:
        app1 = create_app(Settings(database_url=db_url, node_id="node-1", background_loops=True), db)
        async with serve_on(app1, port):
            run = asyncio.create_task(w.arun())
            await wait_until(lambda: sum(calls.values()) == 2, 20, "two running handlers")
        # The server is gone; the handlers finish now and their reports cannot be delivered.
        gate.set()
        await wait_until(lambda: w.pending_reports == 2, 10, "two unacknowledged reports")
        await asyncio.sleep(0.3)
        assert w.pending_reports == 2
        app2 = create_app(Settings(database_url=db_url, node_id="node-2", background_loops=True), db)
        async with serve_on(app2, port):
            tasks = await wait_states(tenant, ids, timeout=40)
            await asyncio.wait_for(w.astop(), 30)
            await asyncio.wait_for(run, 30)
    finally:
        if run is not None and not run.done():
            run.cancel()
            with contextlib.suppress(BaseException):
                await run
    assert w.drained
    assert all(t["state"] == "SUCCEEDED" and t["attempts"] == 1 for t in tasks), tasks
    assert set(calls.values()) == {1} and len(calls) == 4
    for t in ids:
        attempts = await attempts_of(tenant, t)
        assert [a["outcome"] for a in attempts] == ["SUCCEEDED"] and attempts[0]["late_reports"] == []
        assert (await get_task(tenant, t))["result"] == {"done": t}
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 0)


# ---------------------------------------------------------------- the raw session


async def test_worker_session_raw_protocol(tenant, server):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=5)
    (tid,) = await submit(tenant, q["id"], 1)
    async with await WorkerSession.connect(server, tenant.token, node_id="raw-1", queues=[q["id"]]) as s:
        assert s.session_id and s.default_lease_ms == 30000
        leases_ = await s.claim(q["id"], max_tasks=5, wait_ms=1000, msg_id=orbit.sdk.session.new_message_id())
        assert [x["task_id"] for x in leases_] == [tid]
        lease_id = leases_[0]["lease_id"]
        start_id = orbit.sdk.session.new_message_id("start")
        receipt = await s.start(lease_id, msg_id=start_id)
        assert receipt["attempt"] == 1
        assert await s.start(lease_id, msg_id=start_id) == receipt  # replay
        with pytest.raises(orbit.WorkerProtocolError) as conflict:
            await s.start(lease_id)
        assert conflict.value.code == "STATE_CONFLICT"
        renewed = await s.renew(lease_id, 30000)
        assert renewed["cancel_requested"] is False
        assert (await s.ping())["type"] == "pong"
        done_id = orbit.sdk.session.new_message_id("complete")
        done = await s.complete(lease_id, "succeeded", result={"raw": True}, msg_id=done_id)
    # After a reconnect, the same report is a replay with the original answer.
    async with await WorkerSession.connect(server, tenant.token, node_id="raw-1", queues=[q["id"]]) as s2:
        again = await s2.complete(lease_id, "succeeded", result={"raw": True}, msg_id=done_id)
        assert again == done == {"task_state": "SUCCEEDED"}
        with pytest.raises(orbit.WorkerProtocolError) as lost:
            await s2.complete(lease_id, "succeeded", result=1)
        assert lost.value.code == "LEASE_LOST"
    with pytest.raises(orbit.APIError) as denied:
        await WorkerSession.connect(server, "orb_" + "0" * 32 + "_nope", node_id="raw-1")
    assert denied.value.status_code == 401 and denied.value.code == "UNAUTHENTICATED"
    other = await tenant.create_queue()
    narrow = await tenant.credential(["worker"], queue_scope=[q["id"]])
    with pytest.raises(orbit.WorkerProtocolError) as hidden:
        await WorkerSession.connect(server, narrow, node_id="raw-1", queues=[other["id"]])
    assert hidden.value.code == "NOT_FOUND"
    with pytest.raises(orbit.TransportError):
        await WorkerSession.connect(f"http://127.0.0.1:{free_port()}", tenant.token, node_id="raw-1")


async def test_a_session_given_up_during_its_hello_leaves_no_unretrieved_error():
    """A worker stopped while a slow node has not answered its hello cancels the connect; the
    hello's reply future, failed by the close, must not surface as a loop error."""
    errors: list[str] = []
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, ctx: errors.append(ctx.get("message", "")))

    async def silent(ws):
        await asyncio.sleep(5)

    try:
        async with websockets.serve(silent, "127.0.0.1", 0) as node:
            port = node.sockets[0].getsockname()[1]
            connect = asyncio.create_task(WorkerSession.connect(f"http://127.0.0.1:{port}", "t", "n"))
            await asyncio.sleep(0.3)
            connect.cancel()
            with pytest.raises(asyncio.CancelledError):
                await connect
        del connect
        gc.collect()
        await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(previous)
    assert errors == []


async def test_worker_with_a_bad_token_fails_fast(tenant, server):
    q = await tenant.create_queue()
    w = orbit.Worker(url=server, token="orb_" + "0" * 32 + "_nope", queues=[q["id"]])

    @w.handler
    async def handle(task):
        return None

    with pytest.raises(orbit.APIError) as denied:
        await asyncio.wait_for(w.arun(), 15)
    assert denied.value.status_code == 401 and not w.drained
