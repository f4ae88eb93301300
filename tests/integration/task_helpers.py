"""Assertions and builders shared by the black-box task API tests."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import orjson
from sqlalchemy import func, select

from orbit.server.core.states import UNFINISHED
from orbit.server.store.tables import (
    application_usage,
    audit_records,
    event_batches,
    idempotency_records,
    queue_usage,
    queues,
    tasks,
)

from .queue_helpers import event_rows as stored_events

HEX32 = re.compile(r"^[0-9a-f]{32}\Z")
TIMESTAMP = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z\Z")
TASK_FIELDS = {
    "id", "namespace_id", "queue_id", "schedule_id", "trigger_at", "state", "payload", "priority",
    "resource_keys", "max_attempts", "attempts", "retry", "on_lease_lost", "available_at",
    "start_deadline_at", "deadline_at", "cancel_requested", "result", "error", "created_at",
    "updated_at", "finished_at",
}
DEFAULT_RETRY = {"initial_backoff_ms": 1000, "max_backoff_ms": 60000, "multiplier": 2.0, "jitter": 0.2}
QUEUE_FULL_ERROR = {
    "code": "QUEUE_FULL",
    "message": "queue unfinished task limit reached; retry later using the original identity",
}
PAYLOAD_LIMIT = 256 * 1024


# ---------------------------------------------------------------- envelopes


def envelope(r: httpx.Response) -> dict[str, Any]:
    """The JSON body, after checking the request id every response must carry."""
    rid = r.headers.get("x-request-id")
    assert rid is not None and HEX32.match(rid), f"bad X-Request-Id {rid!r}"
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body, dict) and body.get("request_id") == rid, (body, rid)
    return body


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, (r.status_code, r.text[:2000])
    body = envelope(r)
    assert set(body) == {"request_id", "data"}, body
    return body["data"]


def assert_error(r: httpx.Response, status: int, code: str, field: str | None = None) -> dict[str, Any]:
    """An error envelope with the exact status and code; `field` must be named by the message."""
    assert r.status_code == status, (r.status_code, r.text[:2000])
    body = envelope(r)
    assert set(body) == {"request_id", "error"}, body
    err = body["error"]
    assert {"code", "message"} <= set(err) <= {"code", "message", "details"}, err
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"].strip(), err
    if field is not None:
        assert field in err["message"], f"message does not name {field!r}: {err['message']!r}"
    return err


def assert_queue_full(r: httpx.Response) -> None:
    """The exact 429 of a full queue: status, Retry-After and envelope."""
    assert r.status_code == 429, (r.status_code, r.text)
    assert r.headers.get("retry-after") == "1", r.headers
    body = envelope(r)
    assert body == {"request_id": body["request_id"], "error": QUEUE_FULL_ERROR}, body


# ---------------------------------------------------------------- the task object


def parse_ts(value: str) -> datetime:
    assert TIMESTAMP.match(value), value
    return datetime.fromisoformat(value[:-1] + "+00:00")


def fmt(value: datetime) -> str:
    """RFC 3339 with `Z` (the form the server answers with)."""
    return value.astimezone(timezone.utc).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def in_seconds(seconds: float) -> str:
    return fmt(utcnow() + timedelta(seconds=seconds))


def assert_task_object(t: dict[str, Any], *, queue: dict[str, Any] | None = None) -> None:
    """Every field of the task object, with its wire types."""
    assert set(t) == TASK_FIELDS, sorted(set(t) ^ TASK_FIELDS)
    assert HEX32.match(t["id"]) and HEX32.match(t["namespace_id"]) and HEX32.match(t["queue_id"]), t
    if queue is not None:
        assert t["queue_id"] == queue["id"] and t["namespace_id"] == queue["namespace_id"], t
    assert t["schedule_id"] is None and t["trigger_at"] is None, t
    assert t["state"] in ("WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW", "SUCCEEDED", "FAILED", "CANCELLED")
    for f in ("priority", "max_attempts", "attempts"):
        assert type(t[f]) is int, (f, t[f])
    assert 0 <= t["priority"] <= 9 and 1 <= t["max_attempts"] <= 100 and t["attempts"] >= 0, t
    assert isinstance(t["resource_keys"], list) and all(isinstance(k, str) for k in t["resource_keys"])
    retry = t["retry"]
    assert set(retry) == set(DEFAULT_RETRY), retry
    assert type(retry["initial_backoff_ms"]) is int and type(retry["max_backoff_ms"]) is int, retry
    assert isinstance(retry["multiplier"], (int, float)) and isinstance(retry["jitter"], (int, float)), retry
    assert not isinstance(retry["multiplier"], bool) and not isinstance(retry["jitter"], bool), retry
    assert t["on_lease_lost"] in ("review", "retry"), t
    assert type(t["cancel_requested"]) is bool, t
    for f in ("available_at", "created_at", "updated_at"):
        assert isinstance(t[f], str) and TIMESTAMP.match(t[f]), (f, t[f])
    for f in ("start_deadline_at", "deadline_at", "finished_at"):
        assert t[f] is None or (isinstance(t[f], str) and TIMESTAMP.match(t[f])), (f, t[f])
    assert t["error"] is None or (set(t["error"]) == {"code", "message"}), t["error"]
    assert t["updated_at"] >= t["created_at"], t


def assert_fresh_task(t: dict[str, Any], queue: dict[str, Any] | None = None) -> None:
    """A task just accepted: WAITING, nothing ran, no outcome."""
    assert_task_object(t, queue=queue)
    assert t["state"] == "WAITING" and t["attempts"] == 0 and t["cancel_requested"] is False, t
    assert t["result"] is None and t["error"] is None and t["finished_at"] is None, t
    assert t["updated_at"] == t["created_at"], t


# ---------------------------------------------------------------- database views


async def counter_invariant(tenant, queue_id: str) -> int:
    """The queue's (and the application's) unfinished counter equals its unfinished tasks; returns it."""

    async def read(tx):
        counter = await tx.scalar(select(queue_usage.c.unfinished).where(queue_usage.c.queue_id == queue_id))
        actual = await tx.scalar(
            select(func.count()).select_from(tasks).where(tasks.c.queue_id == queue_id, tasks.c.state.in_(UNFINISHED))
        )
        app_counter = await tx.scalar(
            select(application_usage.c.unfinished)
            .where(application_usage.c.application_id == tenant.application["id"])
        )
        app_actual = await tx.scalar(
            select(func.count()).select_from(tasks).where(
                tasks.c.application_id == tenant.application["id"], tasks.c.state.in_(UNFINISHED)
            )
        )
        return int(counter), int(actual), int(app_counter), int(app_actual)

    counter, actual, app_counter, app_actual = await tenant.db.core_read(read)
    assert counter == actual, f"queue_usage.unfinished={counter} but {actual} unfinished tasks"
    assert app_counter == app_actual, f"application_usage.unfinished={app_counter} but {app_actual} unfinished tasks"
    r = await tenant.get(f"/v1/queues/{queue_id}")
    assert ok(r)["unfinished_tasks"] == str(actual)
    return actual


async def snapshot(tenant, queue_id: str | None = None) -> dict[str, Any]:
    """Row counts of everything a task write touches, plus every task's mutable columns.

    With `queue_id`, the counter invariant is checked on the way.
    """
    ns = tenant.namespace_id

    async def read(tx):
        counts = {}
        for t in (tasks, idempotency_records, event_batches, audit_records):
            counts[t.name] = int(await tx.scalar(select(func.count()).select_from(t).where(t.c.namespace_id == ns)))
        rows = await tx.all(
            select(tasks.c.id, tasks.c.state, tasks.c.updated_at, tasks.c.finished_at, tasks.c.error)
            .where(tasks.c.namespace_id == ns).order_by(tasks.c.id)
        )
        usage = await tx.all(
            select(queue_usage.c.queue_id, queue_usage.c.unfinished)
            .where(queue_usage.c.queue_id.in_(select(queues.c.id).where(queues.c.namespace_id == ns)))
            .order_by(queue_usage.c.queue_id)
        )
        return {
            "counts": counts,
            "tasks": [tuple(r.values()) for r in rows],
            "usage": [tuple(r.values()) for r in usage],
        }

    snap = await tenant.db.core_read(read)
    if queue_id is not None:
        snap["unfinished"] = await counter_invariant(tenant, queue_id)
    return snap


async def idempotency_records_for(tenant, key: str) -> list[dict[str, Any]]:
    t = idempotency_records

    async def read(tx):
        rows = await tx.all(select(t).where(t.c.namespace_id == tenant.namespace_id, t.c.idem_key == key))
        return [dict(r) for r in rows]

    return await tenant.db.core_read(read)


async def event_rows(tenant, resource_id: str) -> list[dict[str, Any]]:
    """The stored events about `resource_id` in the order they were written (`data` parsed)."""
    return [{**e, "data": orjson.loads(e["data"])} for e in await stored_events(tenant.db, resource_id)]


async def audit_rows(tenant, resource_id: str) -> list[dict[str, Any]]:
    async def read(tx):
        rows = await tx.all(
            select(audit_records).where(audit_records.c.resource_id == resource_id).order_by(audit_records.c.id)
        )
        return [dict(r) for r in rows]

    return await tenant.db.core_read(read)


# ---------------------------------------------------------------- requests


def tasks_path(queue: dict[str, Any] | str) -> str:
    return f"/v1/queues/{queue if isinstance(queue, str) else queue['id']}/tasks"


def batch_path(queue: dict[str, Any] | str) -> str:
    return tasks_path(queue) + ":batch"


async def submit(tenant, queue, body: dict[str, Any], *, key: str | None = None, status: int = 201) -> dict[str, Any]:
    """Submit and return the task of a successful receipt."""
    data = ok(await tenant.post(tasks_path(queue), body, key=key), status)
    assert set(data) == {"deduplicated", "task"}, data
    assert data["deduplicated"] is (status == 200), data
    return data["task"]


async def cancel(tenant, task_id: str, reason: str = "not needed", *, key: str | None = None) -> httpx.Response:
    return await tenant.post(f"/v1/tasks/{task_id}:cancel", {"reason": reason}, key=key)


async def configure(tenant, queue_id: str, *, via: httpx.AsyncClient | None = None, **fields: Any) -> dict[str, Any]:
    """Replace the queue's controls, starting from its current ones (`via`: through that node's
    client rather than the tenant's)."""
    q = ok(await tenant.get(f"/v1/queues/{queue_id}"))
    body = {
        "expected_revision": q["revision"], "reason": "test", "paused": q["paused"],
        "max_concurrency": q["max_concurrency"], "rate_per_second": q["rate_per_second"],
        "max_unfinished_tasks": q["max_unfinished_tasks"],
    }
    body.update(fields)
    path = f"/v1/queues/{queue_id}:configure"
    if via is None:
        return ok(await tenant.post(path, body))["queue"]
    return ok(await via.post(path, json=body, headers=tenant.headers(None, tenant.key())))["queue"]


async def retire(tenant, queue_id: str) -> dict[str, Any]:
    q = ok(await tenant.get(f"/v1/queues/{queue_id}"))
    body = {"expected_revision": q["revision"], "reason": "done"}
    return ok(await tenant.post(f"/v1/queues/{queue_id}:retire", body))["queue"]


async def post_raw(tenant, path: str, content: bytes, *, key: str | None, content_type: str = "application/json"):
    headers = {"Authorization": f"Bearer {tenant.token}", "Content-Type": content_type}
    if key is not None:
        headers["Idempotency-Key"] = key
    return await tenant.http.post(path, content=content, headers=headers)
