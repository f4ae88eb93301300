"""The backlog sequence of a queue and the counter invariant, on both backends."""

import asyncio

import pytest
from sqlalchemy import func, select

from orbit.server.core.states import UNFINISHED
from orbit.server.store.tables import queue_usage, tasks
from orbit.server.store.tx import Stmt

pytestmark = pytest.mark.anyio


async def unfinished_matches(tenant, queue_id: str) -> int:
    async def read(tx):
        counter = await tx.scalar(select(queue_usage.c.unfinished).where(queue_usage.c.queue_id == queue_id))
        actual = await tx.scalar(
            select(func.count()).select_from(tasks).where(tasks.c.queue_id == queue_id, tasks.c.state.in_(UNFINISHED))
        )
        return int(counter), int(actual)

    counter, actual = await tenant.db.core_read(read)
    assert counter == actual
    r = await tenant.get(f"/v1/queues/{queue_id}")
    assert r.json()["data"]["unfinished_tasks"] == str(actual)
    return actual


async def test_full_replay_cancel_retry_with_original_identity(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=2)
    path = f"/v1/queues/{q['id']}/tasks"
    first = await tenant.post(path, {"payload": {"n": 1}}, key="t-1")
    assert first.status_code == 201, first.text
    t1 = first.json()["data"]["task"]
    assert t1["state"] == "WAITING" and t1["payload"] == {"n": 1} and t1["attempts"] == 0
    assert (await tenant.post(path, {"payload": {"n": 2}}, key="t-2")).status_code == 201
    assert await unfinished_matches(tenant, q["id"]) == 2

    third = await tenant.post(path, {"payload": {"n": 3}}, key="t-3")
    assert third.status_code == 429
    assert third.headers["retry-after"] == "1"
    assert third.json()["error"] == {
        "code": "QUEUE_FULL",
        "message": "queue unfinished task limit reached; retry later using the original identity",
    }

    replay = await tenant.post(path, {"payload": {"n": 1}}, key="t-1")
    assert replay.status_code == 200
    assert replay.json()["data"] == {"deduplicated": True, "task": t1}

    cancel = await tenant.post(f"/v1/tasks/{t1['id']}:cancel", {"reason": "make room"}, key="c-1")
    assert cancel.status_code == 200, cancel.text
    assert cancel.json()["data"]["task"]["state"] == "CANCELLED"
    assert await unfinished_matches(tenant, q["id"]) == 1

    retried = await tenant.post(path, {"payload": {"n": 3}}, key="t-3")
    assert retried.status_code == 201
    assert await unfinished_matches(tenant, q["id"]) == 2

    again = await tenant.post(f"/v1/tasks/{t1['id']}:cancel", {"reason": "make room"}, key="c-1")
    assert again.status_code == 200 and again.json()["data"]["deduplicated"] is True
    conflict = await tenant.post(f"/v1/tasks/{t1['id']}:cancel", {"reason": "again"}, key="c-2")
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "STATE_CONFLICT"


async def test_batch_stops_at_full_queue(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=3)
    items = [{"idempotency_key": f"b-{i}", "payload": i} for i in range(5)]
    items.insert(1, {"idempotency_key": "bad", "payload": 1, "priority": 12})
    items.append({"idempotency_key": "b-0", "payload": 0})
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks:batch", {"tasks": items})
    assert r.status_code == 200, r.text
    results = r.json()["data"]["results"]
    assert [x.get("error", {}).get("code") for x in results] == [
        None, "INVALID_ARGUMENT", None, None, "QUEUE_FULL", "QUEUE_FULL", None
    ]
    assert results[-1]["deduplicated"] is True and results[-1]["task"] == results[0]["task"]
    assert await unfinished_matches(tenant, q["id"]) == 3
    # A single submit with a batch item's key is the same identity.
    single = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 0}, key="b-0")
    assert single.status_code == 200 and single.json()["data"]["task"]["id"] == results[0]["task"]["id"]


async def test_deadline_sweep_fails_waiting_tasks(tenant):
    from orbit.server.services.tasks import sweep_deadlines

    q = await tenant.create_queue()
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1, "deadline_seconds": 1})
    task_id = r.json()["data"]["task"]["id"]
    await asyncio.sleep(1.1)
    assert await sweep_deadlines(tenant.db) >= 1
    t = (await tenant.get(f"/v1/tasks/{task_id}")).json()["data"]
    assert t["state"] == "FAILED" and t["error"]["code"] == "DEADLINE_EXCEEDED" and t["finished_at"]
    assert await unfinished_matches(tenant, q["id"]) == 0


async def test_hot_path_connections_run_in_strict_mode(db):
    """Backlog slots are taken by guarded UPDATEs that fail on NULL (store/dialect.py BAD_NULL);
    without strict mode NULL would be stored as 0. The driver connections force it on."""
    if db.dialect != "mysql":
        pytest.skip("SQLite takes slots with counted UPDATEs")

    async def mode(tx):
        return (await tx.rows_multi([Stmt("SELECT @@SESSION.sql_mode AS m")]))[0][0]["m"]

    assert "STRICT_TRANS_TABLES" in (await db.transaction(mode)).split(",")
