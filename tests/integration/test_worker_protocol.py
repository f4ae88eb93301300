"""The worker protocol against a real uvicorn server, on both backends."""

import asyncio
from datetime import UTC, datetime

import orjson
import pytest
from sqlalchemy import select, update

from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.errors import DomainError
from orbit.server.services import dispatch
from orbit.server.store.tables import leases, queue_usage, tasks
from orbit.server.ws import session as worker_session

from .worker_client import Worker, serve

pytestmark = pytest.mark.anyio


async def submit(tenant, queue_id, n=1, **fields):
    ids = []
    for i in range(n):
        r = await tenant.post(f"/v1/queues/{queue_id}/tasks", {"payload": {"i": i}, **fields})
        assert r.status_code == 201, r.text
        ids.append(r.json()["data"]["task"]["id"])
    return ids


async def usage(tenant, queue_id):
    async def read(tx):
        return dict(await tx.one_or_none(select(queue_usage).where(queue_usage.c.queue_id == queue_id)))
    return await tenant.db.core_read(read)


async def task(tenant, task_id):
    return (await tenant.get(f"/v1/tasks/{task_id}")).json()["data"]


async def test_happy_path_and_replays(tenant, base):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    ids = await submit(tenant, q["id"], 2)
    async with Worker.connect(base, tenant.token) as w:
        hello = await w.hello(q["id"])
        assert hello["default_lease_ms"] == 30000 and hello["max_lease_ms"] == 600000 and hello["session_id"]
        claim = await w.call("claim", id="claim-1", queue_id=q["id"], max_tasks=10)
        assert claim["ok"] and [t["task_id"] for t in claim["tasks"]] == ids
        lease = claim["tasks"][0]
        assert lease["attempt"] == 1 and lease["payload"] == {"i": 0}
        again = await w.call("claim", id="claim-1", queue_id=q["id"], max_tasks=10)
        assert again["tasks"] == claim["tasks"]
        assert (await task(tenant, ids[0]))["state"] == "LEASED"

        s1 = await w.call("start", id="start-1", lease_id=lease["lease_id"])
        assert s1["ok"] and s1["attempt"] == 1 and s1["start_receipt_id"]
        s1b = await w.call("start", id="start-1", lease_id=lease["lease_id"])
        assert s1b == {**s1, "reply_to": "start-1"}
        other = await w.call("start", id="start-other", lease_id=lease["lease_id"])
        assert other["error"]["code"] == "STATE_CONFLICT"
        t = await task(tenant, ids[0])
        assert t["state"] == "RUNNING" and t["attempts"] == 1
        running = (await tenant.get(f"/v1/tasks/{ids[0]}/attempts")).json()["data"]["items"]
        assert [(a["number"], a["outcome"], a["started_at"], a["ended_at"]) for a in running] == [
            (1, "RUNNING", s1["started_at"], None)]

        rn = await w.call("renew", lease_id=lease["lease_id"], lease_ms=60000)
        assert rn["ok"] and rn["cancel_requested"] is False

        done = await w.call("complete", id="done-1", lease_id=lease["lease_id"], outcome="succeeded", result={"x": 1})
        assert done == {"reply_to": "done-1", "ok": True, "task_state": "SUCCEEDED"}
        again = await w.call("complete", id="done-1", lease_id=lease["lease_id"], outcome="succeeded", result={"x": 1})
        assert again == done
        t = await task(tenant, ids[0])
        assert t["state"] == "SUCCEEDED" and t["result"] == {"x": 1} and t["attempts"] == 1 and t["finished_at"]
        attempts = (await tenant.get(f"/v1/tasks/{ids[0]}/attempts")).json()["data"]["items"]
        assert [a["outcome"] for a in attempts] == ["SUCCEEDED"] and attempts[0]["node_id"] == "worker-host-1"
        assert attempts[0]["started_at"] == s1["started_at"] and attempts[0]["ended_at"]
        # The ended attempt still answers its Start's resend with the original receipt.
        assert await w.call("start", id="start-1", lease_id=lease["lease_id"]) == {**s1, "reply_to": "start-1"}

        released = await w.call("release", lease_id=claim["tasks"][1]["lease_id"])
        assert released["ok"] and released["task_state"] == "WAITING"
        t = await task(tenant, ids[1])
        assert t["state"] == "WAITING" and t["attempts"] == 0
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 1)


async def test_an_attempt_whose_start_is_on_its_lease_row_runs_and_ends_as_the_others(tenant, base):
    """A Start keeps its receipt on the task row while the lease is live; a lease row that a Start
    wrote itself (as before the task row kept it) is read, replayed, listed and ended as well."""
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    (tid,) = await submit(tenant, q["id"])
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        (lease,) = (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
        s1 = await w.call("start", id="s-row", lease_id=lease["lease_id"])
        assert s1["ok"]

        async def move_start_to_lease_row(tx):
            (row,) = (await tx.all(select(tasks.c.started_at, tasks.c.start_msg_id, tasks.c.start_response)
                                   .where(tasks.c.id == tid)))
            await tx.execute(update(leases).where(leases.c.id == lease["lease_id"]).values(
                state="RUNNING", reserved=False, started_at=row["started_at"], start_msg_id=row["start_msg_id"],
                start_response=row["start_response"]))
            await tx.execute(update(tasks).where(tasks.c.id == tid).values(
                started_at=None, start_msg_id=None, start_response=None))

        await tenant.db.core_transaction(move_start_to_lease_row)
        assert await w.call("start", id="s-row", lease_id=lease["lease_id"]) == {**s1, "reply_to": "s-row"}
        [running] = (await tenant.get(f"/v1/tasks/{tid}/attempts")).json()["data"]["items"]
        assert (running["outcome"], running["started_at"]) == ("RUNNING", s1["started_at"])
        done = await w.call("complete", lease_id=lease["lease_id"], outcome="succeeded")
        assert done["ok"] and done["task_state"] == "SUCCEEDED"
        assert await w.call("start", id="s-row", lease_id=lease["lease_id"]) == {**s1, "reply_to": "s-row"}
    [ended] = (await tenant.get(f"/v1/tasks/{tid}/attempts")).json()["data"]["items"]
    assert (ended["outcome"], ended["started_at"]) == ("SUCCEEDED", s1["started_at"])
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 0)


async def test_a_start_writes_its_task_row_alone_and_the_lease_row_gets_it_when_it_ends(tenant, base):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    (tid,) = await submit(tenant, q["id"])

    async def rows():
        async def read(tx):
            (lease_row,) = await tx.all(select(leases).where(leases.c.task_id == tid))
            (task_row,) = await tx.all(select(tasks).where(tasks.c.id == tid))
            return dict(lease_row), dict(task_row)
        return await tenant.db.core_read(read)

    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        (lease,) = (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
        claimed, _ = await rows()
        s1 = await w.call("start", id="s-1", lease_id=lease["lease_id"])
        lease_row, task_row = await rows()
        assert lease_row == claimed
        assert (task_row["state"], task_row["start_msg_id"], orjson.loads(task_row["start_response"])) == (
            "RUNNING", "s-1", {k: v for k, v in s1.items() if k not in ("ok", "reply_to")})
        assert (await w.call("complete", lease_id=lease["lease_id"], outcome="succeeded"))["ok"]
    lease_row, _ = await rows()
    assert lease_row["state"] == "ENDED" and lease_row["start_msg_id"] == "s-1"
    assert lease_row["start_response"] == task_row["start_response"]
    assert lease_row["started_at"] == task_row["started_at"]


async def test_concurrency_and_rate_limits(tenant, base):
    q = await tenant.create_queue(max_concurrency=2, rate_per_second=1)
    await submit(tenant, q["id"], 4)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = await w.call("claim", queue_id=q["id"], max_tasks=5)
        # rate 1: only one Start fits the window, so only one reservation is granted.
        assert len(c["tasks"]) == 1
        assert (await w.call("start", lease_id=c["tasks"][0]["lease_id"]))["ok"]
        c2 = await w.call("claim", queue_id=q["id"], max_tasks=5)
        assert c2["tasks"] == []
        await asyncio.sleep(1.05)
        c3 = await w.call("claim", queue_id=q["id"], max_tasks=5)
        assert len(c3["tasks"]) == 1
        c4 = await w.call("claim", queue_id=q["id"], max_tasks=5, wait_ms=1100)
        assert c4["tasks"] == []  # concurrency 2 reached (one running, one leased)
        u = await usage(tenant, q["id"])
        assert u["permits_in_use"] == 2


async def test_rate_limited_start_writes_nothing(tenant, base):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=5)
    ids = await submit(tenant, q["id"], 2)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = await w.call("claim", queue_id=q["id"], max_tasks=2)
        assert len(c["tasks"]) == 2
        r = await tenant.post(f"/v1/queues/{q['id']}:configure", {
            "expected_revision": "1", "reason": "slow down", "paused": False, "max_concurrency": 5,
            "rate_per_second": 1, "max_unfinished_tasks": 100})
        assert r.status_code == 200
        assert (await w.call("start", lease_id=c["tasks"][0]["lease_id"]))["ok"]
        limited = await w.call("start", id="s2", lease_id=c["tasks"][1]["lease_id"])
        assert limited["ok"] is False and limited["error"]["code"] == "RATE_LIMITED"
        assert 0 < limited["error"]["retry_after_ms"] <= 1000
        t = await task(tenant, ids[1])
        assert t["state"] == "LEASED" and t["attempts"] == 0
        await asyncio.sleep(limited["error"]["retry_after_ms"] / 1000 + 0.05)
        ok = await w.call("start", id="s2", lease_id=c["tasks"][1]["lease_id"])
        assert ok["ok"] and ok["attempt"] == 1


async def test_pause_blocks_claims_and_starts(tenant, base):
    q = await tenant.create_queue()
    await submit(tenant, q["id"], 2)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = await w.call("claim", queue_id=q["id"], max_tasks=1)
        r = await tenant.post(f"/v1/queues/{q['id']}:configure", {
            "expected_revision": "1", "reason": "pause", "paused": True, "max_concurrency": 8,
            "rate_per_second": 100, "max_unfinished_tasks": 100})
        assert r.status_code == 200
        assert (await w.call("claim", queue_id=q["id"], max_tasks=5))["tasks"] == []
        s = await w.call("start", lease_id=c["tasks"][0]["lease_id"])
        assert s["error"]["code"] == "QUEUE_PAUSED"


async def test_failures_retry_then_exhaust(tenant, base):
    q = await tenant.create_queue()
    (tid,) = await submit(tenant, q["id"], 1, max_attempts=2,
                          retry={"initial_backoff_ms": 1, "max_backoff_ms": 1, "jitter": 0.0})
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        for attempt, expected in ((1, "WAITING"), (2, "FAILED")):
            c = await w.call("claim", queue_id=q["id"], max_tasks=1, wait_ms=2000)
            lease = c["tasks"][0]
            assert lease["attempt"] == attempt
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
            r = await w.call("complete", lease_id=lease["lease_id"], outcome="failed", error={"message": "boom"})
            assert r["ok"] and r["task_state"] == expected
            await asyncio.sleep(0.01)
    t = await task(tenant, tid)
    assert t["state"] == "FAILED" and t["error"]["code"] == "ATTEMPTS_EXHAUSTED" and t["attempts"] == 2
    attempts = (await tenant.get(f"/v1/tasks/{tid}/attempts")).json()["data"]["items"]
    assert [a["outcome"] for a in attempts] == ["FAILED", "FAILED"]


async def test_lease_expiry_recovery_and_late_evidence(tenant, base):
    q = await tenant.create_queue()
    leased_id, running_id, retry_id = (
        (await submit(tenant, q["id"], 1))[0],
        (await submit(tenant, q["id"], 1))[0],
        (await submit(tenant, q["id"], 1, on_lease_lost="retry"))[0],
    )
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = await w.call("claim", queue_id=q["id"], max_tasks=3, lease_ms=1000)
        by_task = {t["task_id"]: t for t in c["tasks"]}
        started = {}
        for tid in (running_id, retry_id):
            started[tid] = await w.call("start", id=f"s-{tid}", lease_id=by_task[tid]["lease_id"])
            assert started[tid]["ok"]
        await asyncio.sleep(1.1)
        assert await dispatch.recover_expired_leases(tenant.db) >= 3
        late = await w.call("complete", lease_id=by_task[running_id]["lease_id"], outcome="succeeded", result=1)
        assert late["error"]["code"] == "LEASE_LOST"
        exp = await w.call("start", lease_id=by_task[leased_id]["lease_id"])
        assert exp["error"]["code"] == "LEASE_EXPIRED"
        resent = await w.call("start", id=f"s-{running_id}", lease_id=by_task[running_id]["lease_id"])
        assert resent == {**started[running_id], "reply_to": f"s-{running_id}"}
    assert (await task(tenant, leased_id))["state"] == "WAITING"
    assert (await task(tenant, leased_id))["attempts"] == 0
    t = await task(tenant, running_id)
    assert t["state"] == "NEEDS_REVIEW" and t["error"]["code"] == "LEASE_LOST"
    attempts = (await tenant.get(f"/v1/tasks/{running_id}/attempts")).json()["data"]["items"]
    assert attempts[0]["outcome"] == "LEASE_LOST" and attempts[0]["late_reports"][0]["outcome"] == "succeeded"
    assert attempts[0]["started_at"] == started[running_id]["started_at"] and attempts[0]["ended_at"]
    assert (await task(tenant, retry_id))["state"] == "WAITING"
    [lost] = (await tenant.get(f"/v1/tasks/{retry_id}/attempts")).json()["data"]["items"]
    assert (lost["outcome"], lost["started_at"]) == ("LEASE_LOST", started[retry_id]["started_at"])
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 3)


async def test_malformed_frames_and_auth(tenant, base):
    import websockets

    async with Worker.connect(base, tenant.token) as w:
        r = await w.call("claim", queue_id="0" * 32)
        assert r["error"]["code"] == "STATE_CONFLICT"  # hello first
        await w.hello()
        assert (await w.call("nope"))["error"]["code"] == "INVALID_ARGUMENT"
        assert (await w.call("claim", queue_id="f" * 32, max_tasks=0))["error"]["code"] == "INVALID_ARGUMENT"
        assert (await w.call("start", lease_id="f" * 32))["error"]["code"] == "NOT_FOUND"
        assert (await w.call("ping"))["ok"]
        await w.ws.send('{"type":"ping"}')
        await asyncio.wait_for(w._reader, 5)
        assert w.ws.close_code == 1008
    reader = await tenant.credential(["tasks:read"])
    with pytest.raises(websockets.InvalidStatus) as denied:
        async with Worker.connect(base, reader):
            pass
    assert denied.value.response.status_code == 403
    with pytest.raises(websockets.InvalidStatus) as denied:
        async with Worker.connect(base, "orb_" + "0" * 32 + "_nope"):
            pass
    assert denied.value.response.status_code == 401


async def test_cancel_leased_and_running_with_pushes(tenant, base):
    q = await tenant.create_queue()
    leased_id, running_id = await submit(tenant, q["id"], 2)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = await w.call("claim", queue_id=q["id"], max_tasks=2)
        by_task = {t["task_id"]: t for t in c["tasks"]}
        assert (await w.call("start", lease_id=by_task[running_id]["lease_id"]))["ok"]

        r = await tenant.post(f"/v1/tasks/{leased_id}:cancel", {"reason": "not needed"})
        assert r.status_code == 200 and r.json()["data"]["task"]["state"] == "CANCELLED"
        revoked = await w.wait_push("lease_revoked")
        assert revoked["lease_id"] == by_task[leased_id]["lease_id"]
        s = await w.call("start", lease_id=by_task[leased_id]["lease_id"])
        assert s["error"]["code"] == "TASK_CANCELLED"

        r = await tenant.post(f"/v1/tasks/{running_id}:cancel", {"reason": "stop it"})
        assert r.status_code == 200
        t = r.json()["data"]["task"]
        assert t["state"] == "RUNNING" and t["cancel_requested"] is True
        push = await w.wait_push("cancel_requested")
        assert push["task_id"] == running_id and push["reason"] == "stop it"
        rn = await w.call("renew", lease_id=by_task[running_id]["lease_id"], lease_ms=30000)
        assert rn["cancel_requested"] is True
        u = await usage(tenant, q["id"])
        assert (u["permits_in_use"], u["unfinished"]) == (1, 1)  # the running task keeps slot and permit
        done = await w.call("complete", lease_id=by_task[running_id]["lease_id"], outcome="cancelled")
        assert done["task_state"] == "CANCELLED"
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 0)


async def test_review_is_the_only_way_out_of_needs_review(tenant, base):
    q = await tenant.create_queue()
    a, b, c_ = await submit(tenant, q["id"], 3, max_attempts=2)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = await w.call("claim", queue_id=q["id"], max_tasks=3, lease_ms=1000)
        for lease in c["tasks"]:
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
    await asyncio.sleep(1.1)
    for _ in range(20):  # recovery spans the shared test database, in batches
        if await dispatch.recover_expired_leases(tenant.db) == 0:
            break
    for t in (a, b, c_):
        assert (await task(tenant, t))["state"] == "NEEDS_REVIEW"
    assert (await tenant.post(f"/v1/tasks/{a}:cancel", {"reason": "x"})).status_code == 409
    ok = await tenant.post(f"/v1/tasks/{a}:review", {"resolution": "SUCCEEDED", "reason": "checked the ledger",
                                                   "evidence": {"ticket": 7}})
    assert ok.status_code == 200 and ok.json()["data"]["task"]["state"] == "SUCCEEDED"
    failed = await tenant.post(f"/v1/tasks/{b}:review", {"resolution": "FAILED", "reason": "never happened"})
    assert failed.json()["data"]["task"]["state"] == "FAILED"
    retry = await tenant.post(f"/v1/tasks/{c_}:review", {"resolution": "RETRY", "reason": "safe to rerun"})
    assert retry.json()["data"]["task"]["state"] == "WAITING"
    again = await tenant.post(f"/v1/tasks/{a}:review", {"resolution": "FAILED", "reason": "changed my mind"})
    assert again.status_code == 409
    reader = await tenant.credential(["tasks:read", "tasks:cancel"])
    denied = await tenant.post(f"/v1/tasks/{c_}:review", {"resolution": "FAILED", "reason": "x"}, token=reader)
    assert denied.status_code == 403
    u = await usage(tenant, q["id"])
    assert u["unfinished"] == 1 and u["permits_in_use"] == 0


async def test_deadlines_of_leased_and_running_tasks(tenant, base):
    from orbit.server.services.tasks import sweep_deadlines

    q = await tenant.create_queue()
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        # Connected first: on a loaded machine the handshake alone may outlast a short deadline.
        leased_id, running_id = await submit(tenant, q["id"], 2, deadline_seconds=2)
        c = await w.call("claim", queue_id=q["id"], max_tasks=2)
        by_task = {t["task_id"]: t for t in c["tasks"]}
        assert (await w.call("start", lease_id=by_task[running_id]["lease_id"]))["ok"]
        deadline_at = datetime.fromisoformat((await task(tenant, running_id))["deadline_at"])
        await asyncio.sleep(max(0.0, (deadline_at - datetime.now(UTC)).total_seconds()) + 0.1)
        assert await sweep_deadlines(tenant.db) >= 2  # the sweep spans the shared test database
        t = await task(tenant, leased_id)
        assert t["state"] == "FAILED" and t["error"]["code"] == "DEADLINE_EXCEEDED"
        t = await task(tenant, running_id)
        assert t["state"] == "RUNNING" and t["cancel_requested"] is True
        done = await w.call("complete", lease_id=by_task[running_id]["lease_id"], outcome="cancelled")
        assert done["task_state"] == "FAILED"
    t = await task(tenant, running_id)
    assert t["error"]["code"] == "DEADLINE_EXCEEDED"
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 0)


async def test_lowering_concurrency_revokes_nothing_and_waits_for_drain(tenant, base):
    q = await tenant.create_queue(max_concurrency=3, rate_per_second=100)
    await submit(tenant, q["id"], 5)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = await w.call("claim", queue_id=q["id"], max_tasks=3)
        assert len(c["tasks"]) == 3
        r = await tenant.post(f"/v1/queues/{q['id']}:configure", {
            "expected_revision": "1", "reason": "fewer workers", "paused": False, "max_concurrency": 1,
            "rate_per_second": 100, "max_unfinished_tasks": 100})
        assert r.status_code == 200
        for lease in c["tasks"]:  # nothing already held is revoked
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        for lease in c["tasks"][:2]:
            assert (await w.call("complete", lease_id=lease["lease_id"], outcome="succeeded"))["ok"]
            assert (await w.call("claim", queue_id=q["id"], max_tasks=3))["tasks"] == []
        assert (await w.call("complete", lease_id=c["tasks"][2]["lease_id"], outcome="succeeded"))["ok"]
        assert len((await w.call("claim", queue_id=q["id"], max_tasks=3))["tasks"]) == 1


async def test_start_deadline_bounds_only_the_first_start(tenant, base):
    """A task that started once and is waiting for its retry is not failed by its start deadline."""
    from datetime import datetime, timedelta, timezone

    from orbit.server.services.tasks import sweep_deadlines

    q = await tenant.create_queue()
    start_by = (datetime.now(timezone.utc) + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    (tid,) = await submit(tenant, q["id"], 1, start_deadline_at=start_by, deadline_seconds=3600,
                          retry={"initial_backoff_ms": 1, "max_backoff_ms": 1, "jitter": 0.0})
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        (lease,) = (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
        assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        failed = await w.call("complete", lease_id=lease["lease_id"], outcome="failed",
                              error={"message": "try again"})
        assert failed["task_state"] == "WAITING"
        await asyncio.sleep(1.2)
        await sweep_deadlines(tenant.db)
        assert (await task(tenant, tid))["state"] == "WAITING"
        (again,) = (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
        started = await w.call("start", lease_id=again["lease_id"])
        assert started["ok"] and started["attempt"] == 2
        assert (await w.call("complete", lease_id=again["lease_id"], outcome="succeeded"))["ok"]
    assert (await task(tenant, tid))["state"] == "SUCCEEDED"


async def test_review_retry_rearms_the_total_deadline(tenant, base):
    """NEEDS_REVIEW leaves the sweep; a review that sends the task back to WAITING re-arms its deadline."""
    from orbit.server.services.tasks import sweep_deadlines

    q = await tenant.create_queue()
    (tid,) = await submit(tenant, q["id"], 1, deadline_seconds=2)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        (lease,) = (await w.call("claim", queue_id=q["id"], max_tasks=1, lease_ms=1000))["tasks"]
        assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        await asyncio.sleep(1.1)
        assert await dispatch.recover_expired_leases(tenant.db) >= 1
    assert (await task(tenant, tid))["state"] == "NEEDS_REVIEW"
    await asyncio.sleep(1.0)
    await sweep_deadlines(tenant.db)  # past the deadline: nothing to do while a person decides
    assert (await task(tenant, tid))["state"] == "NEEDS_REVIEW"
    r = await tenant.post(f"/v1/tasks/{tid}:review", {"resolution": "RETRY", "reason": "safe to rerun"})
    assert r.json()["data"]["task"]["state"] == "WAITING", r.text
    await sweep_deadlines(tenant.db)
    t = await task(tenant, tid)
    assert t["state"] == "FAILED" and t["error"]["code"] == "DEADLINE_EXCEEDED", t
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"], u["unfinished"]) == (0, 0, 0)


async def test_claims_of_several_queues_share_a_transaction_and_each_queue_keeps_its_limits(tenant):
    """A node serves the claims of one application together, whatever their queues (one
    transaction, the usage rows locked last in queue order): every claim still gets exactly
    what its own queue's permits and rate space allow, in arrival order, and replays."""
    from orbit.server.core.ids import new_id
    from orbit.server.services.auth import authenticate

    who = dispatch.WorkerIdentity(await authenticate(tenant.db, f"Bearer {tenant.token}"), new_id(), "w", "n")
    one_permit = await tenant.create_queue(max_concurrency=1, rate_per_second=100)
    roomy = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    slow = await tenant.create_queue(max_concurrency=10, rate_per_second=2)
    await submit(tenant, one_permit["id"], 3)
    roomy_ids = await submit(tenant, roomy["id"], 2)
    await submit(tenant, slow["id"], 5)

    def claim(queue_id, msg_id):
        return dispatch.ClaimCommand(who, queue_id, 5, 30000, msg_id)

    commands = [claim(one_permit["id"], "m1"), claim(roomy["id"], "m2"), claim(slow["id"], "m3"),
                claim(one_permit["id"], "m4"), claim(new_id(), "m5")]
    replies = await dispatch.claim_many(tenant.db, commands)
    assert [len(r["tasks"]) if isinstance(r, dict) else 0 for r in replies] == [1, 2, 2, 0, 0]
    assert [t["task_id"] for t in replies[1]["tasks"]] == roomy_ids
    assert isinstance(replies[4], DomainError) and replies[4].code == "NOT_FOUND"
    for q, permits in ((one_permit, 1), (roomy, 2), (slow, 2)):
        u = await usage(tenant, q["id"])
        assert (u["permits_in_use"], u["rate_reserved"]) == (permits, permits), (q["name"], u)
    again = await dispatch.claim_many(tenant.db, commands[:3])

    def plain(reply):  # payloads are pre-serialized fragments in a fresh grant
        return orjson.loads(orjson.dumps(reply["tasks"]))

    assert [plain(r) for r in again] == [plain(r) for r in replies[:3]]
    assert (await usage(tenant, one_permit["id"]))["permits_in_use"] == 1


async def test_a_claim_resent_into_its_own_transaction_is_answered_as_a_replay(tenant):
    """A claim and its resend (the same message id) served by one transaction: the resend gets
    the same leases, as a replay would, and nothing is leased twice. (Both used to be granted
    tasks, and their two receipts under one key refused the transaction until it gave up:
    UNAVAILABLE to every claim of the group.)"""
    from orbit.server.core.ids import new_id
    from orbit.server.services.auth import authenticate

    who = dispatch.WorkerIdentity(await authenticate(tenant.db, f"Bearer {tenant.token}"), new_id(), "w", "n")
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    other = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    await submit(tenant, q["id"], 4)
    [other_task] = await submit(tenant, other["id"], 1)
    commands = [dispatch.ClaimCommand(who, q["id"], 2, 30000, "same"),
                dispatch.ClaimCommand(who, other["id"], 1, 30000, "another"),
                dispatch.ClaimCommand(who, q["id"], 2, 30000, "same")]
    first, another, resent = await dispatch.claim_many(tenant.db, commands)
    assert len(first["tasks"]) == 2 and resent == first
    assert [t["task_id"] for t in another["tasks"]] == [other_task]
    assert (await usage(tenant, q["id"]))["permits_in_use"] == 2
    (replayed,) = await dispatch.claim_many(tenant.db, commands[:1])
    assert [t["lease_id"] for t in replayed["tasks"]] == [t["lease_id"] for t in first["tasks"]]


async def test_a_resent_claim_answers_the_original_leases_after_they_changed(tenant, base):
    """Claim receipts keep the lease ids and length; the leases are read back from the lease
    and task rows, as they were granted, whatever happened to them since."""
    from orbit.server.store.tables import worker_claims

    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    await submit(tenant, q["id"], 3, priority=2, deadline_seconds=3600)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        claim = await w.call("claim", id="keep-1", queue_id=q["id"], max_tasks=3, lease_ms=20000)
        assert len(claim["tasks"]) == 3
        first, second, third = claim["tasks"]
        assert (await w.call("renew", lease_id=first["lease_id"], lease_ms=90000))["ok"]
        assert (await w.call("start", lease_id=second["lease_id"]))["ok"]
        assert (await w.call("complete", lease_id=second["lease_id"], outcome="succeeded"))["ok"]
        assert (await w.call("release", lease_id=third["lease_id"]))["ok"]
        assert await w.call("claim", id="keep-1", queue_id=q["id"], max_tasks=3, lease_ms=20000) == claim

        async def receipt(tx):
            return (await tx.one_or_none(select(worker_claims.c.response).where(worker_claims.c.msg_id == "keep-1")))["response"]

        stored = await tenant.db.core_read(receipt)
        assert orjson.loads(stored) == {"leases": [t["lease_id"] for t in claim["tasks"]], "lease_ms": 20000}


async def test_sessions_answer_through_plain_asgi_sends_too(tenant, db, db_url):
    """Under a server without Orbit's direct frame write (any ASGI server), grouped commands are
    answered through the ASGI send: the same replies, errors and replays."""
    app = create_app(Settings(database_url=db_url, node_id="t", background_loops=False), db)
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    ids = await submit(tenant, q["id"], 2)
    async with serve(app, ws="websockets-sansio") as url, Worker.connect(url, tenant.token) as w:
        await w.hello(q["id"])
        claim = await w.call("claim", queue_id=q["id"], max_tasks=2)
        first, second = claim["tasks"]
        s1 = await w.call("start", id="plain-start", lease_id=first["lease_id"])
        assert s1["ok"] and await w.call("start", id="plain-start", lease_id=first["lease_id"]) == s1
        assert (await w.call("start", lease_id=first["lease_id"], extra=1))["error"]["code"] == "INVALID_ARGUMENT"
        assert (await w.call("renew", lease_id=first["lease_id"], lease_ms=5000))["ok"]
        assert (await w.call("complete", lease_id=first["lease_id"], outcome="succeeded"))["task_state"] == "SUCCEEDED"
        assert (await w.call("release", lease_id=second["lease_id"]))["task_state"] == "WAITING"
    assert (await task(tenant, ids[0]))["state"] == "SUCCEEDED"


@pytest.mark.parametrize("ws_protocol", [None, "websockets-sansio"], ids=["orbit-protocol", "plain-asgi"])
async def test_a_session_reads_no_frame_beyond_its_slots_until_one_is_answered(tenant, db, db_url, monkeypatch,
                                                                               ws_protocol):
    """Every frame holds a slot until it is answered: with both slots held by long-polling
    claims, the frames sent after them wait unread, and are all read and answered, in order,
    once the claims are; on the server's direct frame path as through ASGI."""
    monkeypatch.setattr(worker_session, "MAX_IN_FLIGHT", 2)
    app = create_app(Settings(database_url=db_url, node_id="t", background_loops=False), db)
    q = await tenant.create_queue()
    loop = asyncio.get_running_loop()
    async with serve(app, ws=ws_protocol) as url, Worker.connect(url, tenant.token) as w:
        await w.hello(q["id"])

        async def timed(call):
            reply = await call
            return reply, loop.time()

        claims = [asyncio.create_task(timed(w.call("claim", queue_id=q["id"], max_tasks=1, wait_ms=1000)))
                  for _ in range(2)]
        await asyncio.sleep(0.2)
        pings = [asyncio.create_task(timed(w.call("ping"))) for _ in range(3)]
        await asyncio.sleep(0.4)
        assert not any(p.done() for p in pings)
        claimed = await asyncio.gather(*claims)
        pinged = await asyncio.gather(*pings)
    assert [r for r, _ in claimed] == [{"reply_to": r["reply_to"], "ok": True, "tasks": []} for r, _ in claimed]
    assert all(r["ok"] and r["type"] == "pong" for r, _ in pinged)
    assert min(t for _, t in pinged) >= min(t for _, t in claimed)


async def test_a_claim_leases_each_task_once_while_another_claim_changes_the_known_levels(
        tenant, base, monkeypatch):
    """A claim reads the priority levels it did not cover in its first read. Another claim of the
    node may update what the node knows of the queue's levels meanwhile: the missing levels are
    reckoned against what this claim read, and a task read twice is still leased once."""
    from orbit.server.services import dispatch
    from orbit.server.store.tx import Tx

    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    ids = [*await submit(tenant, q["id"], 2, priority=5), *await submit(tenant, q["id"], 2, priority=7)]
    dispatch._levels_seen.pop(q["id"], None)  # this node's first claim on the queue reads every level
    first_read = Tx.rows_multi

    async def meanwhile(self, stmts):
        rows = await first_read(self, stmts)
        dispatch._levels_seen[q["id"]] = 1 << 5  # another claim saw only level 5 before level 7 came
        return rows

    monkeypatch.setattr(Tx, "rows_multi", meanwhile)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        leased = [t["task_id"] for t in (await w.call("claim", queue_id=q["id"], max_tasks=10))["tasks"]]
    assert sorted(leased) == sorted(ids) and len(set(leased)) == 4
    u = await usage(tenant, q["id"])
    assert (u["permits_in_use"], u["rate_reserved"]) == (4, 4)
