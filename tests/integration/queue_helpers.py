"""Assertions and builders shared by the black-box queue API tests."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import orjson
from sqlalchemy import func, select

from orbit.server.store.db import Database
from orbit.server.store.tables import audit_records, event_batches, idempotency_records, queues

HEX32 = re.compile(r"^[0-9a-f]{32}\Z")
TIMESTAMP = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z\Z")
DECIMAL = re.compile(r"^(0|[1-9][0-9]*)\Z")
QUEUE_FIELDS = {
    "id",
    "namespace_id",
    "name",
    "paused",
    "max_concurrency",
    "rate_per_second",
    "max_unfinished_tasks",
    "unfinished_tasks",
    "revision",
    "retired_at",
    "created_at",
    "updated_at",
}


def unique_name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_body(name: str | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": unique_name() if name is None else name, "max_concurrency": 8, "rate_per_second": 100}
    body.update(fields)
    return body


def configure_body(revision: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "expected_revision": revision,
        "reason": "limit background traffic",
        "paused": False,
        "max_concurrency": 2,
        "rate_per_second": 1,
        "max_unfinished_tasks": 100,
    }
    body.update(fields)
    return body


def retire_body(revision: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"expected_revision": revision, "reason": "decommissioned"}
    body.update(fields)
    return body


def envelope(r: httpx.Response) -> dict[str, Any]:
    """The JSON body, after checking the request id that every response must carry."""
    rid = r.headers.get("x-request-id")
    assert rid is not None and HEX32.match(rid), f"bad X-Request-Id {rid!r}"
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body, dict), body
    assert body.get("request_id") == rid, (body, rid)
    return body


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, (r.status_code, r.text)
    body = envelope(r)
    assert set(body) == {"request_id", "data"}, body
    return body["data"]


def assert_error(r: httpx.Response, status: int, code: str, field: str | None = None) -> dict[str, Any]:
    """An error envelope with the exact status and code; `field` must be named by the message."""
    assert r.status_code == status, (r.status_code, r.text)
    body = envelope(r)
    assert set(body) == {"request_id", "error"}, body
    err = body["error"]
    assert set(err) <= {"code", "message", "details"} and {"code", "message"} <= set(err), err
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"].strip(), err
    if "details" in err:
        assert isinstance(err["details"], dict), err
    if field is not None:
        assert field in err["message"], f"message does not name {field!r}: {err['message']!r}"
        if "details" in err and "field" in err["details"]:
            assert err["details"]["field"] == field, err
    return err


def assert_queue_object(q: dict[str, Any]) -> None:
    """Every field of the queue object, with its wire types."""
    assert set(q) == QUEUE_FIELDS, sorted(q)
    assert HEX32.match(q["id"]) and HEX32.match(q["namespace_id"])
    assert isinstance(q["name"], str)
    assert isinstance(q["paused"], bool)
    for f in ("max_concurrency", "rate_per_second", "max_unfinished_tasks"):
        assert type(q[f]) is int, (f, q[f])
    for f in ("unfinished_tasks", "revision"):
        assert isinstance(q[f], str) and DECIMAL.match(q[f]), (f, q[f])
    assert int(q["revision"]) >= 1
    for f in ("created_at", "updated_at"):
        assert isinstance(q[f], str) and TIMESTAMP.match(q[f]), (f, q[f])
    assert q["retired_at"] is None or TIMESTAMP.match(q["retired_at"]), q["retired_at"]


async def post_raw(
    http: httpx.AsyncClient,
    path: str,
    content: bytes | Any,
    *,
    token: str | None,
    key: str | None = None,
    content_type: str | None = "application/json",
    extra: dict[str, str] | None = None,
) -> httpx.Response:
    """POST exact bytes (or a byte stream) with exactly the headers given."""
    headers: dict[str, Any] = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if key is not None:
        headers["Idempotency-Key"] = key
    if content_type is not None:
        headers["Content-Type"] = content_type
    headers.update(extra or {})
    return await http.post(path, content=content, headers=headers)


async def state(db: Database, namespace_id: str) -> dict[str, Any]:
    """Row counts of everything a write touches, plus every queue's mutable columns."""

    async def read(tx):
        counts = {}
        for t in (queues, idempotency_records, audit_records, event_batches):
            counts[t.name] = await tx.scalar(
                select(func.count()).select_from(t).where(t.c.namespace_id == namespace_id)
            )
        rows = await tx.all(
            select(
                queues.c.id, queues.c.name, queues.c.revision, queues.c.paused, queues.c.max_concurrency,
                queues.c.rate_per_second, queues.c.max_unfinished_tasks, queues.c.retired_at,
                queues.c.updated_at,
            )
            .where(queues.c.namespace_id == namespace_id)
            .order_by(queues.c.id)
        )
        return {"counts": counts, "queues": [tuple(r.values()) for r in rows]}

    return await db.core_read(read)


async def audit_rows(db: Database, resource_id: str) -> list[dict[str, Any]]:
    async def read(tx):
        rows = await tx.all(
            select(audit_records).where(audit_records.c.resource_id == resource_id).order_by(audit_records.c.id)
        )
        return [dict(r) for r in rows]

    return await db.core_read(read)


async def event_rows(db: Database, resource_id: str) -> list[dict[str, Any]]:
    """The stored events about `resource_id` in the order they were written (`data` as JSON text).
    Only batches naming it are read: other tests store arbitrary text in the column."""
    async def read(tx):
        rows = await tx.all(select(event_batches).where(event_batches.c.events.contains(f'"{resource_id}"'))
                            .order_by(event_batches.c.batch_id))
        return [{"namespace_id": r["namespace_id"], "batch_id": r["batch_id"], "type": ev[0], "time": ev[1],
                 "resource_type": ev[2], "resource_id": ev[3], "data": orjson.dumps(ev[4]).decode()}
                for r in rows for ev in orjson.loads(r["events"]) if ev[3] == resource_id]

    return await db.core_read(read)


async def idempotency_count(db: Database, namespace_id: str, key: str) -> int:
    t = idempotency_records

    async def read(tx):
        return await tx.scalar(
            select(func.count()).select_from(t).where(t.c.namespace_id == namespace_id, t.c.idem_key == key)
        )

    return await db.core_read(read)
