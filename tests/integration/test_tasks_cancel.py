"""POST /v1/tasks/{task_id}:cancel."""

from __future__ import annotations

import orjson
import pytest

from .conftest import make_tenant
from .task_helpers import (
    assert_error,
    assert_queue_full,
    assert_task_object,
    audit_rows,
    cancel,
    configure,
    counter_invariant,
    event_rows,
    idempotency_records_for,
    ok,
    post_raw,
    snapshot,
    submit,
    tasks_path,
)

pytestmark = pytest.mark.anyio


def cancel_path(task_id: str) -> str:
    return f"/v1/tasks/{task_id}:cancel"


async def test_cancel_a_waiting_task(tenant):
    q = await tenant.create_queue()
    t = await submit(tenant, q, {"payload": {"p": 1}, "priority": 8})
    keep = await submit(tenant, q, {"payload": "keep"})
    assert await counter_invariant(tenant, q["id"]) == 2
    key = tenant.key()
    data = ok(await cancel(tenant, t["id"], "no longer needed", key=key))
    assert set(data) == {"deduplicated", "task"} and data["deduplicated"] is False
    c = data["task"]
    assert_task_object(c, queue=q)
    assert c["state"] == "CANCELLED" and c["finished_at"] is not None
    assert c["updated_at"] == c["finished_at"] and c["finished_at"] >= t["created_at"]
    assert c["attempts"] == 0 and c["result"] is None and c["error"] is None
    # Everything else of the task is unchanged, payload included.
    for field in ("id", "payload", "priority", "retry", "max_attempts", "on_lease_lost", "resource_keys",
                  "available_at", "start_deadline_at", "deadline_at", "created_at", "queue_id", "namespace_id"):
        assert c[field] == t[field], field
    assert ok(await tenant.get(f"/v1/tasks/{t['id']}")) == c
    assert await counter_invariant(tenant, q["id"]) == 1
    assert ok(await tenant.get(f"/v1/tasks/{keep['id']}"))["state"] == "WAITING"

    [record] = await idempotency_records_for(tenant, key)
    assert record["operation"] == "tasks.cancel" and record["resource_id"] == t["id"]
    [audit] = await audit_rows(tenant, t["id"])
    assert audit["action"] == "task.cancel" and audit["reason"] == "no longer needed"
    assert audit["resource_type"] == "task" and audit["namespace_id"] == tenant.namespace_id
    assert audit["actor_credential_id"] == tenant.credential_id and audit["idempotency_key"] == key
    assert orjson.loads(audit["before"])["state"] == "WAITING"
    assert orjson.loads(audit["after"])["state"] == "CANCELLED"
    assert tenant.token[37:] not in str(audit)
    events = await event_rows(tenant, t["id"])
    assert [e["type"] for e in events] == ["task.submitted", "task.cancelled"]
    assert events[1]["data"]["task_id"] == t["id"] and events[1]["data"]["state"] == "CANCELLED"
    assert events[1]["namespace_id"] == tenant.namespace_id and events[1]["resource_type"] == "task"


async def test_cancel_replay_and_conflicts(tenant):
    q = await tenant.create_queue()
    t = await submit(tenant, q, {"payload": 1})
    other = await submit(tenant, q, {"payload": 2})
    first = ok(await cancel(tenant, t["id"], "r1", key="cancel-1"))
    before = await snapshot(tenant, q["id"])
    assert before["unfinished"] == 1

    assert ok(await cancel(tenant, t["id"], "r1", key="cancel-1")) == {"deduplicated": True, "task": first["task"]}
    assert_error(await cancel(tenant, t["id"], "r2", key="cancel-1"), 409, "IDEMPOTENCY_CONFLICT")
    # The task is part of the identity.
    assert_error(await cancel(tenant, other["id"], "r1", key="cancel-1"), 409, "IDEMPOTENCY_CONFLICT")
    # A new key on a terminal task: the request contradicts the state; no record is left.
    for reason in ("r1", "again"):
        key = tenant.key()
        err = assert_error(await cancel(tenant, t["id"], reason, key=key), 409, "STATE_CONFLICT")
        assert "CANCELLED" in err["message"] or err.get("details", {}).get("state") == "CANCELLED", err
        assert await idempotency_records_for(tenant, key) == []
    assert await snapshot(tenant, q["id"]) == before
    assert ok(await tenant.get(f"/v1/tasks/{other['id']}"))["state"] == "WAITING"
    # A cancel key is not a submit key: the scopes are separate operations.
    await submit(tenant, q, {"payload": 3}, key="cancel-1")


async def test_cancel_reason_rules(tenant):
    q = await tenant.create_queue()
    t = await submit(tenant, q, {"payload": 1})
    before = await snapshot(tenant, q["id"])
    path = cancel_path(t["id"])
    for body in ({}, {"reason": ""}, {"reason": "   "}, {"reason": "\n\t"}, {"reason": None}, {"reason": 5},
                 {"reason": ["x"]}, {"reason": "x" * 1025}, {"reason": "é" * 1025}):
        key = tenant.key()
        assert_error(await tenant.post(path, body, key=key), 400, "INVALID_ARGUMENT", "reason")
        assert await idempotency_records_for(tenant, key) == []
    assert_error(await tenant.post(path, {"reason": "ok", "force": True}), 400, "INVALID_ARGUMENT", "force")
    assert_error(await post_raw(tenant, path, b"[]", key=tenant.key()), 400, "INVALID_ARGUMENT")
    assert_error(await post_raw(tenant, path, b"{", key=tenant.key()), 400, "INVALID_ARGUMENT")
    r = await post_raw(tenant, path, b'{"reason": "x"}', key=tenant.key(), content_type="text/plain")
    assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    r = await post_raw(tenant, path, b'{"reason": "x"}', key=None)
    assert_error(r, 400, "INVALID_ARGUMENT", "Idempotency-Key")
    assert await snapshot(tenant, q["id"]) == before

    # 1024 characters (not bytes) is the inclusive limit.
    reason = "✓" * 1024
    c = ok(await cancel(tenant, t["id"], reason))["task"]
    assert c["state"] == "CANCELLED"
    [audit] = await audit_rows(tenant, t["id"])
    assert audit["reason"] == reason


async def test_cancel_needs_permission_and_visibility(tenant, db, http):
    q = await tenant.create_queue()
    other = await tenant.create_queue()
    t = await submit(tenant, q, {"payload": 1})
    no_cancel = await tenant.credential(["tasks:read", "tasks:submit"])
    scoped = await tenant.credential(["tasks:cancel"], queue_scope=[other["id"]])
    in_scope = await tenant.credential(["tasks:cancel"], queue_scope=[q["id"]])
    stranger = await make_tenant(db, http)
    before = await snapshot(tenant, q["id"])
    body = {"reason": "stop"}
    assert_error(await tenant.post(cancel_path(t["id"]), body, token=no_cancel), 403, "PERMISSION_DENIED")
    assert_error(await tenant.post(cancel_path(t["id"]), body, token=scoped), 404, "NOT_FOUND")
    assert_error(await stranger.post(cancel_path(t["id"]), body), 404, "NOT_FOUND")
    for task_id in ("0" * 32, "nope", t["id"].upper()):
        assert_error(await tenant.post(cancel_path(task_id), body), 404, "NOT_FOUND")
    r = await tenant.http.post(cancel_path(t["id"]), json=body, headers={"Idempotency-Key": "k"})
    assert_error(r, 401, "UNAUTHENTICATED")
    assert await snapshot(tenant, q["id"]) == before
    key = tenant.key()
    done = ok(await tenant.post(cancel_path(t["id"]), body, token=in_scope, key=key))
    assert done["task"]["state"] == "CANCELLED"
    # Permissions are checked on replays too.
    assert_error(await tenant.post(cancel_path(t["id"]), body, token=no_cancel, key=key), 403, "PERMISSION_DENIED")
    assert_error(await tenant.post(cancel_path(t["id"]), body, token=scoped, key=key), 404, "NOT_FOUND")
    assert ok(await tenant.post(cancel_path(t["id"]), body, key=key))["deduplicated"] is True


async def test_cancel_is_never_refused_for_a_full_or_paused_queue(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=2)
    a = await submit(tenant, q, {"payload": "a"})
    b = await submit(tenant, q, {"payload": "b"})
    assert_queue_full(await tenant.post(tasks_path(q), {"payload": "c"}))
    assert ok(await cancel(tenant, a["id"]))["task"]["state"] == "CANCELLED"
    assert await counter_invariant(tenant, q["id"]) == 1
    await configure(tenant, q["id"], paused=True, max_unfinished_tasks=1)
    assert ok(await cancel(tenant, b["id"]))["task"]["state"] == "CANCELLED"
    assert await counter_invariant(tenant, q["id"]) == 0
    c = await submit(tenant, q, {"payload": "c"})
    assert c["state"] == "WAITING"


async def test_cancelling_many_tasks_keeps_the_counter_exact(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=10)
    data = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks:batch",
                                {"tasks": [{"idempotency_key": f"m-{i}", "payload": i} for i in range(10)]}))
    ids = [r["task"]["id"] for r in data["results"]]
    assert await counter_invariant(tenant, q["id"]) == 10
    for n, task_id in enumerate(ids[::2], start=1):
        assert (await cancel(tenant, task_id)).status_code == 200
        assert await counter_invariant(tenant, q["id"]) == 10 - n
        assert_error(await cancel(tenant, task_id), 409, "STATE_CONFLICT")
        assert await counter_invariant(tenant, q["id"]) == 10 - n
