"""Resource controls in dispatch: resource-key permits without head-of-line
blocking, priority aging, node fairness, and the two read views (queue usage, task blockers)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from orbit.server.store.tx import Stmt
from tests.support.history import max_overlap

from .queue_helpers import assert_error, ok
from .test_worker_protocol import submit
from .worker_client import Worker

pytestmark = pytest.mark.anyio


async def create_key(tenant, max_concurrency: int, name: str | None = None) -> dict:
    import uuid
    r = await tenant.post("/v1/resource-keys", {"name": name or f"rk-{uuid.uuid4().hex[:10]}",
                                               "max_concurrency": max_concurrency})
    assert r.status_code == 201, r.text
    return r.json()["data"]["resource_key"]


async def rows(db, sql: str, *params):
    return await db.read(lambda tx: tx.rows(Stmt(sql, params)))


async def wait_until(predicate, timeout: float = 5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        if await predicate():
            return
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


# ---------------------------------------------------------------- resource keys


async def test_a_task_names_existing_keys_only(tenant):
    q = await tenant.create_queue()
    k = await create_key(tenant, 2)
    assert_error(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": {}, "resource_keys": ["nope"]}),
                 400, "INVALID_ARGUMENT")
    assert_error(await tenant.post(f"/v1/queues/{q['id']}/tasks",
                                   {"payload": {}, "resource_keys": [k["name"], k["name"]]}), 400, "INVALID_ARGUMENT")
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": {}, "resource_keys": [k["name"]]})
    assert r.status_code == 201 and r.json()["data"]["task"]["resource_keys"] == [k["name"]]


async def test_a_retired_key_takes_no_new_tasks(tenant):
    q = await tenant.create_queue()
    k = await create_key(tenant, 2)
    ok(await tenant.post(f"/v1/resource-keys/{k['id']}:retire", {"expected_revision": "1", "reason": "gone"}))
    err = assert_error(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": {}, "resource_keys": [k["name"]]}),
                       400, "INVALID_ARGUMENT")
    assert "retired" in err["message"]


async def test_a_key_cannot_retire_while_an_unfinished_task_names_it(tenant, base):
    q = await tenant.create_queue()
    k = await create_key(tenant, 2)
    (tid,) = await submit(tenant, q["id"], 1, resource_keys=[k["name"]])
    assert_error(await tenant.post(f"/v1/resource-keys/{k['id']}:retire", {"expected_revision": "1", "reason": "x"}),
                 409, "STATE_CONFLICT")
    ok(await tenant.post(f"/v1/tasks/{tid}:cancel", {"reason": "not needed"}))
    ok(await tenant.post(f"/v1/resource-keys/{k['id']}:retire", {"expected_revision": "1", "reason": "x"}))


async def test_a_saturated_key_does_not_block_the_tasks_behind_it(tenant, base, db):
    q = await tenant.create_queue(max_concurrency=20)
    k = await create_key(tenant, 1)
    keyed = await submit(tenant, q["id"], 5, resource_keys=[k["name"]], priority=5)
    plain = await submit(tenant, q["id"], 3)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        got = (await w.call("claim", queue_id=q["id"], max_tasks=10))["tasks"]
        assert [t["task_id"] for t in got] == [keyed[0], *plain]
        assert got[0]["resource_keys"] == [k["name"]]
        assert ok(await tenant.get(f"/v1/resource-keys/{k['id']}"))["in_use"] == "1"
        parked = await rows(db, "SELECT id FROM tasks WHERE parked_on = ?", k["id"])
        assert sorted(r["id"] for r in parked) == sorted(keyed[1:])
        assert (await w.call("claim", queue_id=q["id"], max_tasks=10))["tasks"] == []
        assert (await w.call("start", lease_id=got[0]["lease_id"]))["ok"]
        assert (await w.call("complete", lease_id=got[0]["lease_id"], outcome="succeeded"))["ok"]
        # The freed permit brings the next parked task back: one, in dispatch order.
        nxt = (await w.call("claim", queue_id=q["id"], max_tasks=10, wait_ms=3000))["tasks"]
        assert [t["task_id"] for t in nxt] == [keyed[1]]
        assert ok(await tenant.get(f"/v1/resource-keys/{k['id']}"))["in_use"] == "1"


async def test_a_task_submitted_to_a_saturated_key_is_parked_at_once(tenant, base, db):
    q = await tenant.create_queue()
    k = await create_key(tenant, 1)
    (first,) = await submit(tenant, q["id"], 1, resource_keys=[k["name"]])
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        (lease,) = (await w.call("claim", queue_id=q["id"], max_tasks=5))["tasks"]
        (second,) = await submit(tenant, q["id"], 1, resource_keys=[k["name"]])
        assert (await rows(db, "SELECT parked_on FROM tasks WHERE id = ?", second))[0]["parked_on"] == k["id"]
        assert (await w.call("release", lease_id=lease["lease_id"]))["ok"]
        again = (await w.call("claim", queue_id=q["id"], max_tasks=5, wait_ms=3000))["tasks"]
        assert [t["task_id"] for t in again] in ([first], [second])


async def test_a_key_shared_by_two_queues_never_has_more_holders_than_permits(tenant, base, db):
    k = await create_key(tenant, 2)
    queues = [await tenant.create_queue(max_concurrency=10) for _ in range(2)]
    for q in queues:
        await submit(tenant, q["id"], 6, resource_keys=[k["name"]])
        await submit(tenant, q["id"], 2)
    async with Worker.connect(base, tenant.token) as w1, Worker.connect(base, tenant.token) as w2:
        ids = [q["id"] for q in queues]
        await w1.hello(*ids, node_id="a")
        await w2.hello(*ids, node_id="b")
        done = [0]
        deadline = asyncio.get_running_loop().time() + 30

        async def drain(w, order):
            while done[0] < 16 and asyncio.get_running_loop().time() < deadline:
                for qid in order:
                    for t in (await w.call("claim", queue_id=qid, max_tasks=3, wait_ms=100))["tasks"]:
                        assert (await w.call("start", lease_id=t["lease_id"]))["ok"]
                        await asyncio.sleep(0.005)
                        assert (await w.call("complete", lease_id=t["lease_id"], outcome="succeeded"))["ok"]
                        done[0] += 1

        await asyncio.gather(drain(w1, ids), drain(w2, ids[::-1]))
        assert done[0] == 16
    spans = [(r["leased_at"], r["ended_at"]) for r in await rows(
        db, "SELECT l.leased_at, l.ended_at FROM leases l JOIN tasks t ON t.id = l.task_id "
            "WHERE t.resource_key_ids IS NOT NULL AND t.queue_id IN (?, ?)", *ids)]
    assert len(spans) == 12 and max_overlap(spans) <= 2
    key = ok(await tenant.get(f"/v1/resource-keys/{k['id']}"))
    assert key["in_use"] == "0"
    (u,) = await rows(db, "SELECT unfinished, permits_in_use FROM resource_key_usage WHERE resource_key_id = ?",
                      k["id"])
    assert (int(u["unfinished"]), int(u["permits_in_use"])) == (0, 0)


# ---------------------------------------------------------------- priority aging


async def test_a_long_due_task_is_served_ahead_of_newer_higher_priority_work(tenant, base):
    q = await tenant.create_queue(max_concurrency=20)
    aged_at = (datetime.now(timezone.utc) - timedelta(seconds=290)).isoformat()
    (old,) = await submit(tenant, q["id"], 1, priority=0, available_at=aged_at)  # due ~290 s: priority 0 + 4
    high = await submit(tenant, q["id"], 2, priority=3)
    top = await submit(tenant, q["id"], 1, priority=5)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        order = []
        for _ in range(4):
            order += [t["task_id"] for t in (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]]
    assert order == [*top, old, *high]


# ---------------------------------------------------------------- node fairness


async def test_a_greedy_node_at_its_fair_share_waits_while_another_node_wants_work(tenant, base):
    q = await tenant.create_queue(max_concurrency=4)
    await submit(tenant, q["id"], 12)
    async with Worker.connect(base, tenant.token) as a, Worker.connect(base, tenant.token) as b:
        await a.hello(q["id"], node_id="node-a")
        await b.hello(q["id"], node_id="node-b")
        held = (await a.call("claim", queue_id=q["id"], max_tasks=4))["tasks"]
        assert len(held) == 4
        assert (await b.call("claim", queue_id=q["id"], max_tasks=2))["tasks"] == []  # b now waits
        for t in held[:2]:
            assert (await a.call("release", lease_id=t["lease_id"]))["ok"]
        # Two nodes active: fair share 2, and a already holds 2 while b waits.
        assert (await a.call("claim", queue_id=q["id"], max_tasks=4))["tasks"] == []
        usage = ok(await tenant.get(f"/v1/queues/{q['id']}/usage"))
        assert {n["node_id"]: n["in_flight"] for n in usage["active_nodes"]} == {"node-a": "2", "node-b": "0"}
        got = (await b.call("claim", queue_id=q["id"], max_tasks=2))["tasks"]
        assert len(got) == 2
        for t in got:
            assert (await b.call("release", lease_id=t["lease_id"]))["ok"]
        # b's last claim was served in full, so nobody waits: a may take the idle capacity beyond its share.
        assert len((await a.call("claim", queue_id=q["id"], max_tasks=4))["tasks"]) == 2


# ---------------------------------------------------------------- usage and blockers


async def test_queue_usage_counts_what_it_describes(tenant, base):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=50)
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    await submit(tenant, q["id"], 4)
    await submit(tenant, q["id"], 2, available_at=later)
    fresh = ok(await tenant.get(f"/v1/queues/{q['id']}/usage"))
    assert set(fresh) == {"queue_id", "at", "unfinished_tasks", "waiting", "delayed", "leased", "running",
                          "needs_review", "in_flight", "rate_window", "active_nodes"}
    assert (fresh["unfinished_tasks"], fresh["waiting"], fresh["delayed"], fresh["in_flight"]) == ("6", "4", "2", "0")
    assert fresh["rate_window"] is None and fresh["active_nodes"] == []
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"], node_id="worker-a")
        leases = (await w.call("claim", queue_id=q["id"], max_tasks=3))["tasks"]
        assert (await w.call("start", lease_id=leases[0]["lease_id"]))["ok"]
        u = ok(await tenant.get(f"/v1/queues/{q['id']}/usage"))
        assert (u["waiting"], u["delayed"], u["leased"], u["running"], u["in_flight"]) == ("1", "2", "2", "1", "3")
        assert u["rate_window"]["used"] == "1" and u["rate_window"]["reserved"] == "2"
        assert [(n["node_id"], n["in_flight"]) for n in u["active_nodes"]] == [("worker-a", "3")]
    queue = ok(await tenant.get(f"/v1/queues/{q['id']}"))
    assert queue["revision"] == "1"


async def test_blockers_name_every_control_that_holds_a_task(tenant, base):
    q = await tenant.create_queue(max_concurrency=1, rate_per_second=100)
    k = await create_key(tenant, 1)
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    (delayed,) = await submit(tenant, q["id"], 1, available_at=later)
    blocked = ok(await tenant.get(f"/v1/tasks/{delayed}/blockers"))
    assert blocked["state"] == "WAITING"
    assert [(b["layer"], b["control"]) for b in blocked["blockers"]] == [("time", "available_at"),
                                                                          ("workers", "no_active_workers")]
    (a, b) = await submit(tenant, q["id"], 2, resource_keys=[k["name"]])
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        (lease,) = (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
        held = ok(await tenant.get(f"/v1/tasks/{b}/blockers"))["blockers"]
        assert {"layer": "queue", "control": "max_concurrency", "limit": 1, "in_use": "1"} in held
        assert {"layer": "resource_key", "name": k["name"], "control": "max_concurrency", "limit": 1,
                "in_use": "1"} in held
        assert ok(await tenant.get(f"/v1/tasks/{a}/blockers"))["blockers"] == []  # leased: not waiting
        assert ok(await tenant.get(f"/v1/tasks/{a}/blockers"))["state"] == "LEASED"
        assert (await w.call("release", lease_id=lease["lease_id"]))["ok"]
        await wait_until(lambda: _no_blockers(tenant, b))


async def _no_blockers(tenant, task_id) -> bool:
    return ok(await tenant.get(f"/v1/tasks/{task_id}/blockers"))["blockers"] == []


async def test_the_views_are_scoped_like_their_resources(tenant):
    q = await tenant.create_queue()
    (tid,) = await submit(tenant, q["id"], 1)
    other = await tenant.credential(["queues:read", "tasks:read"], queue_scope=[(await tenant.create_queue())["id"]])
    assert_error(await tenant.get(f"/v1/queues/{q['id']}/usage", token=other), 404, "NOT_FOUND")
    assert_error(await tenant.get(f"/v1/tasks/{tid}/blockers", token=other), 404, "NOT_FOUND")
    nobody = await tenant.credential(["queues:manage"])
    assert_error(await tenant.get(f"/v1/tasks/{tid}/blockers", token=nobody), 403, "PERMISSION_DENIED")


async def test_raising_a_keys_limit_brings_parked_tasks_back_and_lowering_revokes_nothing(tenant, base, db):
    q = await tenant.create_queue(max_concurrency=10)
    k = await create_key(tenant, 1)
    keyed = await submit(tenant, q["id"], 3, resource_keys=[k["name"]])
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        assert len((await w.call("claim", queue_id=q["id"], max_tasks=5))["tasks"]) == 1
        assert len(await rows(db, "SELECT id FROM tasks WHERE parked_on = ?", k["id"])) == 2
        ok(await tenant.post(f"/v1/resource-keys/{k['id']}:configure",
                             {"expected_revision": "1", "reason": "more room", "max_concurrency": 3}))
        more = (await w.call("claim", queue_id=q["id"], max_tasks=5, wait_ms=3000))["tasks"]
        if len(more) < 2:
            more += (await w.call("claim", queue_id=q["id"], max_tasks=5, wait_ms=3000))["tasks"]
        assert sorted(t["task_id"] for t in more) == sorted(keyed[1:])
        ok(await tenant.post(f"/v1/resource-keys/{k['id']}:configure",
                             {"expected_revision": "2", "reason": "less room", "max_concurrency": 1}))
        assert ok(await tenant.get(f"/v1/resource-keys/{k['id']}"))["in_use"] == "3"  # nothing revoked
