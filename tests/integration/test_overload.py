"""An overloaded node refuses the excess at once: 503 UNAVAILABLE with `Retry-After`, decided from
memory before anything is read or written; health, readiness, metrics and open worker sessions are
not held by it, on SQLite and MariaDB. The same under a real overload, on a
real node: tests/cluster/test_overload.py."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from orbit.server.errors import Overloaded
from orbit.server.overload import Slots, waits_until
from orbit.server.store.db import Database
from orbit.server.store.tx import Stmt

from .queue_helpers import assert_error, idempotency_count, ok, state
from .worker_client import Worker, serve

pytestmark = pytest.mark.anyio


def assert_overloaded(r: httpx.Response) -> None:
    err = assert_error(r, 503, "UNAVAILABLE")
    assert "overloaded" in err["message"] and "retry" in err["message"], err
    assert r.headers["retry-after"] == "1"
    assert r.headers["x-request-id"] == r.json()["request_id"]


def shed(text: str, stage: str = "admission") -> float:
    line = next(x for x in text.splitlines() if x.startswith(f'orbit_requests_shed_total{{stage="{stage}"}}'))
    return float(line.rsplit(" ", 1)[1])


@pytest.fixture
def fill(app, db, monkeypatch):
    """Hold the node's one request slot, as a request in progress would, and count the database's
    reads and transactions from then on (the list returned)."""

    def hold() -> list[str]:
        node = app.state.node
        node.admission = Slots(1, 0.05)
        assert node.admission.try_enter()
        calls: list[str] = []
        for name in ("read", "transaction", "core_read", "core_transaction"):
            original = getattr(db, name)

            def counted(fn, _name=name, _original=original):
                calls.append(_name)
                return _original(fn)

            monkeypatch.setattr(db, name, counted)
        return calls

    return hold


async def test_requests_beyond_the_limit_are_refused_at_once_without_touching_the_database(tenant, app, db,
                                                                                             http, fill):
    q = await tenant.create_queue()
    before = await state(db, tenant.namespace_id)
    calls = fill()
    key = tenant.key()
    started = time.monotonic()
    for r in (
        await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}, key=key),  # the submit fast path
        await tenant.post(f"/v1/queues/{q['id']}/tasks:batch", {"tasks": [{"idempotency_key": "a", "payload": 1}]}),
        await tenant.get(f"/v1/queues/{q['id']}"),
        await tenant.post("/v1/queues", {"name": "nope", "max_concurrency": 1, "rate_per_second": 1}),
        await http.get("/v1/queues"),  # before authentication
    ):
        assert_overloaded(r)
    assert time.monotonic() - started < 2.0  # five refusals, each after a wait of at most 50 ms
    assert calls == []  # not even the token was looked up

    # Health, readiness and metrics are served meanwhile.
    assert ok(await http.get("/healthz")) == {"status": "ok"}
    assert ok(await http.get("/readyz"))["status"] == "ready"
    metrics = (await http.get("/metrics")).text
    assert shed(metrics) == 5
    assert "orbit_http_requests_in_progress 1.0" in metrics and "orbit_http_requests_in_progress_limit 1.0" in metrics

    assert await state(db, tenant.namespace_id) == before
    assert await idempotency_count(db, tenant.namespace_id, key) == 0

    # Once the slot is free, the refused submit goes through with the same key, once.
    app.state.node.admission.leave()
    first = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}, key=key), 201)
    again = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}, key=key), 200)
    assert first["deduplicated"] is False and again["deduplicated"] is True
    assert first["task"]["id"] == again["task"]["id"]
    assert app.state.node.admission.taken == 0


async def test_a_request_beyond_the_limit_waits_its_turn_briefly(tenant, app):
    q = await tenant.create_queue()
    node = app.state.node
    node.admission = Slots(1, 5.0)
    assert node.admission.try_enter()
    submit = asyncio.create_task(tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}))
    await asyncio.sleep(0.1)
    assert not submit.done() and node.admission.waiting == 1
    node.admission.leave()
    ok(await submit, 201)
    assert (node.admission.taken, node.admission.refused) == (0, 0)


async def test_a_long_poll_holds_no_slot_while_it_waits(tenant, app):
    q = await tenant.create_queue()
    node = app.state.node
    node.admission = Slots(1, 0.05)
    poll = asyncio.create_task(tenant.get("/v1/events", params={"after": "999999", "wait_ms": 1500}))
    await asyncio.sleep(0.3)
    assert not poll.done()
    assert ok(await tenant.get(f"/v1/queues/{q['id']}"))["id"] == q["id"]  # the one slot was free
    page = ok(await poll)
    assert page["items"] == []
    assert node.admission.taken == 0 and node.admission.refused == 0


async def test_batch_submits_beyond_their_own_limit_are_refused_within_the_wait(tenant, app, db):
    q = await tenant.create_queue()
    node = app.state.node
    node.batch_submits = Slots(1, 0.05)
    assert node.batch_submits.try_enter()  # a batch in progress
    key = tenant.key()
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks:batch",
                          {"tasks": [{"idempotency_key": "b1", "payload": 1}]}, key=key)
    assert_overloaded(r)
    assert await idempotency_count(db, tenant.namespace_id, key) == 0
    assert ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}), 201)  # single submits go on
    assert shed((await tenant.http.get("/metrics")).text, "batch_submit") == 1
    node.batch_submits.leave()
    batch = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks:batch",
                                 {"tasks": [{"idempotency_key": "b1", "payload": 1}]}, key=key))
    assert batch["deduplicated"] is False and batch["results"][0]["deduplicated"] is False


async def test_open_worker_sessions_are_not_held_by_the_limit(tenant, app):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=100)
    ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}), 201)
    node = app.state.node
    async with serve(app) as base, Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        node.admission = Slots(1, 0.05)
        assert node.admission.try_enter()
        async with httpx.AsyncClient(base_url=base) as client:
            assert_overloaded(await client.get("/v1/queues", headers=tenant.headers()))
        claimed = await w.call("claim", queue_id=q["id"], max_tasks=1)
        assert claimed["ok"] and len(claimed["tasks"]) == 1, claimed
        lease = claimed["tasks"][0]["lease_id"]
        assert (await w.call("start", lease_id=lease))["ok"]
        assert (await w.call("complete", lease_id=lease, outcome="succeeded"))["ok"]


async def test_a_wait_for_the_database_ends_with_the_request_s_budget_and_is_not_an_outage(db_url):
    """Every connection (SQLite: the writer) held by transactions in progress: another
    transaction waits only as long as its request may, then hears `Overloaded`; the database's
    health is not bothered, and the next transaction after them runs."""
    db = Database(db_url, pool_size=1)  # MariaDB: 2 connections per pool
    release = asyncio.Event()
    holding_started = asyncio.Event()
    holders = 1 if db.dialect == "sqlite" else 2

    async def hold(tx):
        await tx.rows(Stmt("SELECT 1 AS one"))
        holding_started.set()
        await release.wait()

    try:
        busy = [asyncio.create_task(db.transaction(hold)) for _ in range(holders)]
        await holding_started.wait()
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with waits_until(time.monotonic() + 0.2), pytest.raises(Overloaded):
            await db.transaction(lambda tx: tx.rows(Stmt("SELECT 1 AS one")))
        assert 0.15 <= time.monotonic() - started < 1.5
        assert db.overloaded == 1 and db.health.available
        release.set()
        await asyncio.gather(*busy)
        assert await db.transaction(lambda tx: tx.rows(Stmt("SELECT 1 AS one")))
    finally:
        release.set()
        await db.close()
