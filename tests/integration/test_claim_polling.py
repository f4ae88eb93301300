"""Long-polling claims and the node's poll: claims waiting on a node run no transaction of their
own while nothing comes; one read per node finds work committed through another node (here the
in-process `http` app, a node of its own on the same database) and wakes as many as it covers."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from orbit.server.services import dispatch, scheduler
from orbit.server.wakeups import Notifier

from .task_helpers import configure
from .worker_client import Worker

pytestmark = pytest.mark.anyio


@pytest.fixture
def polls(monkeypatch):
    calls: list[dict] = []
    original = dispatch.poll_waiting

    async def counted(db, waiting):
        found = await original(db, waiting)
        calls.append(found.wake)
        return found

    monkeypatch.setattr(dispatch, "poll_waiting", counted)
    return calls


@pytest.fixture
def waits_begun(monkeypatch) -> list[str]:
    """The queues of the claims that began to wait on a node, in order: a claim waits only
    once its first transaction is over."""
    begun: list[str] = []
    original = Notifier.wait

    async def wait(self, queue_id, *args, **kwargs):
        begun.append(queue_id)
        return await original(self, queue_id, *args, **kwargs)

    monkeypatch.setattr(Notifier, "wait", wait)
    return begun


async def _waiting(w: Worker, queue_id: str, begun: list[str], *, max_tasks: int = 1,
                   wait_ms: int = 5000) -> asyncio.Task:
    """A claim of `w` on `queue_id` that found nothing and waits: its first transaction is over
    (however slow the machine; `begun` is the `waits_begun` fixture) and the node had 0.3 s to
    poll meanwhile."""
    waits_before = begun.count(queue_id)
    claim = asyncio.create_task(w.call("claim", queue_id=queue_id, max_tasks=max_tasks, wait_ms=wait_ms))
    await asyncio.sleep(0.3)
    deadline = time.monotonic() + 10
    while begun.count(queue_id) == waits_before:
        assert not claim.done() and time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert not claim.done()
    return claim


async def _submit(tenant, http: httpx.AsyncClient, queue_id: str, **fields) -> dict:
    r = await http.post(f"/v1/queues/{queue_id}/tasks", json={"payload": {"n": 1}, **fields},
                        headers=tenant.headers(None, tenant.key()))
    assert r.status_code == 201, r.text
    return r.json()["data"]["task"]


async def test_claims_waiting_on_an_empty_queue_run_no_transaction_until_their_wait_ends(
        tenant, base, claim_transactions, polls):
    q = await tenant.create_queue()
    workers = [Worker.connect(base, tenant.token) for _ in range(4)]
    sessions = [await w.__aenter__() for w in workers]
    try:
        for i, s in enumerate(sessions):
            await s.hello(q["id"], node_id=f"host-{i}")
        started = time.monotonic()
        replies = await asyncio.gather(*(s.call("claim", queue_id=q["id"], max_tasks=5, wait_ms=1500)
                                         for s in sessions))
        assert all(r["ok"] and r["tasks"] == [] for r in replies)
        assert time.monotonic() - started >= 1.4
        # One transaction each when it arrived (grouped or not), none while waiting or at the end.
        assert sum(claim_transactions) == 4
        assert len(polls) >= 4  # the node polled for all four and woke nobody
        assert all(not woken for woken in polls)
    finally:
        for w in workers:
            await w.__aexit__(None, None, None)


async def test_a_task_submitted_through_another_node_wakes_one_waiting_claim(
        tenant, base, http, claim_transactions, waits_begun):
    q = await tenant.create_queue()
    async with Worker.connect(base, tenant.token) as a, Worker.connect(base, tenant.token) as b, \
            Worker.connect(base, tenant.token) as c:
        for s in (a, b, c):
            await s.hello(q["id"])
        waiting = [await _waiting(s, q["id"], waits_begun, wait_ms=3000) for s in (a, b, c)]
        before = len(claim_transactions)
        task = await _submit(tenant, http, q["id"])
        done, pending = await asyncio.wait(waiting, timeout=1.5, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and len(pending) == 2
        (reply,) = [t.result() for t in done]
        assert [t["task_id"] for t in reply["tasks"]] == [task["id"]]
        # The poll found one due task: it woke one claim, not three.
        assert len(claim_transactions) - before == 1
        for t in pending:
            assert (await t)["tasks"] == []


async def test_a_claim_waits_for_a_delayed_task_to_fall_due(tenant, base, http):
    q = await tenant.create_queue()
    due = datetime.now(UTC) + timedelta(seconds=1)
    task = await _submit(tenant, http, q["id"], available_at=due.isoformat().replace("+00:00", "Z"))
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        got = await w.call("claim", queue_id=q["id"], max_tasks=1, wait_ms=4000)
        assert [t["task_id"] for t in got["tasks"]] == [task["id"]]
        assert datetime.now(UTC) >= due - timedelta(milliseconds=50)


async def test_a_queue_resumed_through_another_node_wakes_its_waiting_claim(
        tenant, base, http, waits_begun):
    q = await tenant.create_queue()
    task = await _submit(tenant, http, q["id"])
    await configure(tenant, q["id"], paused=True)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        claim = await _waiting(w, q["id"], waits_begun)
        await asyncio.sleep(0.3)  # polls meanwhile find the queue paused: the claim keeps waiting
        assert not claim.done()
        await configure(tenant, q["id"], paused=False)
        got = await asyncio.wait_for(claim, 2)
        assert [t["task_id"] for t in got["tasks"]] == [task["id"]]


async def test_a_worker_node_that_keeps_waiting_stays_seen_as_waiting(tenant, base, other_base):
    """Node fairness holds while a claim waits longer than a worker node's wanting window
    without a transaction of its own: the poll keeps its worker node's row on the queue current."""
    q = await tenant.create_queue(max_concurrency=4)
    for _ in range(8):
        assert (await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": {}})).status_code == 201
    async with Worker.connect(other_base, tenant.token) as greedy, Worker.connect(base, tenant.token) as modest:
        await greedy.hello(q["id"], node_id="greedy")
        await modest.hello(q["id"], node_id="modest")
        held = (await greedy.call("claim", queue_id=q["id"], max_tasks=4))["tasks"]
        assert len(held) == 4
        waiting = asyncio.create_task(modest.call("claim", queue_id=q["id"], max_tasks=2, wait_ms=8000))
        await asyncio.sleep(2.0)  # twice the wanting window, the queue full all along
        assert not waiting.done()
        for t in held[:2]:
            assert (await greedy.call("release", lease_id=t["lease_id"]))["ok"]
        # Two active worker nodes, fair share 2: the greedy one holds 2 while the other waits.
        assert (await greedy.call("claim", queue_id=q["id"], max_tasks=4))["tasks"] == []
        got = (await asyncio.wait_for(waiting, 3))["tasks"]
        if len(got) == 1:  # the node's poll came between the two releases
            got += (await modest.call("claim", queue_id=q["id"], max_tasks=1, wait_ms=2000))["tasks"]
        assert len(got) == 2


async def test_claims_on_a_queue_the_poll_found_idle_wait_without_a_transaction(
        tenant, base, claim_transactions, waits_begun):
    q = await tenant.create_queue()
    async with Worker.connect(base, tenant.token) as keeper, Worker.connect(base, tenant.token) as w:
        await keeper.hello(q["id"])
        await w.hello(q["id"])
        kept = await _waiting(keeper, q["id"], waits_begun, wait_ms=6000)  # the node polls the queue meanwhile
        before = len(claim_transactions)
        for _ in range(5):
            assert (await w.call("claim", queue_id=q["id"], max_tasks=1, wait_ms=300))["tasks"] == []
        # Each arrived within a poll's verdict of the last one's end but for a slow machine's delays.
        assert len(claim_transactions) - before < 5
        kept.cancel()


async def test_a_resent_claim_is_replayed_on_a_queue_the_poll_found_idle(
        tenant, base, http, claim_transactions, waits_begun):
    q = await tenant.create_queue()
    task = await _submit(tenant, http, q["id"])
    async with Worker.connect(base, tenant.token) as keeper, Worker.connect(base, tenant.token) as w:
        await keeper.hello(q["id"])
        await w.hello(q["id"])
        first = await w.call("claim", id="claim-once", queue_id=q["id"], max_tasks=1)
        assert [t["task_id"] for t in first["tasks"]] == [task["id"]]
        kept = await _waiting(keeper, q["id"], waits_begun, wait_ms=6000)  # polls find the queue idle
        await asyncio.sleep(0.25)
        started = time.monotonic()
        again = await w.call("claim", id="claim-once", queue_id=q["id"], max_tasks=1, wait_ms=3000)
        assert again["tasks"] == first["tasks"]  # its first answer, at once, not a wait
        assert time.monotonic() - started < 2.0
        kept.cancel()


async def test_a_queue_resumed_through_the_same_node_wakes_its_waiting_claim_at_once(
        tenant, base, http, no_polling, waits_begun):
    q = await tenant.create_queue()
    task = await _submit(tenant, http, q["id"])
    await configure(tenant, q["id"], paused=True)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as same_node:
        await w.hello(q["id"])
        claim = await _waiting(w, q["id"], waits_begun, wait_ms=8000)
        await configure(tenant, q["id"], via=same_node, paused=False)
        got = await asyncio.wait_for(claim, 2)
        assert [t["task_id"] for t in got["tasks"]] == [task["id"]]


async def test_a_lease_recovered_on_the_same_node_wakes_its_waiting_claim_at_once(
        tenant, base, http, db, no_polling, waits_begun):
    q = await tenant.create_queue()
    task = await _submit(tenant, http, q["id"])
    async with Worker.connect(base, tenant.token) as holder, Worker.connect(base, tenant.token) as w:
        await holder.hello(q["id"])
        await w.hello(q["id"])
        (held,) = (await holder.call("claim", queue_id=q["id"], max_tasks=1, lease_ms=1000))["tasks"]
        claim = await _waiting(w, q["id"], waits_begun, wait_ms=8000)
        await asyncio.sleep(1.0)  # the unstarted lease has expired
        assert await dispatch.recover_expired_leases(db) >= 1  # other tests' leases too
        got = await asyncio.wait_for(claim, 2)
        assert [t["task_id"] for t in got["tasks"]] == [task["id"]]
        assert got["tasks"][0]["lease_id"] != held["lease_id"]


async def test_a_schedule_firing_on_the_same_node_wakes_its_waiting_claim_at_once(
        tenant, base, db, no_polling, waits_begun):
    q = await tenant.create_queue()
    r = await tenant.post("/v1/schedules", {"name": "every-second", "queue_id": q["id"], "interval_seconds": 1,
                                            "task": {"payload": {"n": 1}}})
    assert r.status_code == 201, r.text
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        claim = await _waiting(w, q["id"], waits_begun, wait_ms=8000)
        deadline = time.monotonic() + 5
        while not await scheduler.run_once(db):  # its first point falls due within a second
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        got = await asyncio.wait_for(claim, 2)
        assert len(got["tasks"]) == 1
