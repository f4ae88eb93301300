"""POST /v1/queues/{queue_id}:retire — permanent retirement."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from .conftest import make_tenant
from .queue_helpers import (
    assert_error,
    assert_queue_object,
    audit_rows,
    configure_body,
    create_body,
    event_rows,
    idempotency_count,
    ok,
    post_raw,
    retire_body,
    state,
)

pytestmark = pytest.mark.anyio


def path(q: dict[str, Any]) -> str:
    return f"/v1/queues/{q['id']}:retire"


async def test_retire_lifecycle(tenant, db):
    q = await tenant.create_queue()
    configure_key = tenant.key()
    configured = ok(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1"), key=configure_key))
    key = tenant.key()
    data = ok(await tenant.post(path(q), retire_body("2"), key=key))
    assert set(data) == {"deduplicated", "queue"} and data["deduplicated"] is False
    retired = data["queue"]
    assert_queue_object(retired)
    assert retired["revision"] == "3"
    assert retired["retired_at"] is not None and retired["retired_at"] >= q["created_at"]
    assert retired["updated_at"] == retired["retired_at"]
    for field in ("id", "name", "paused", "max_concurrency", "rate_per_second", "max_unfinished_tasks",
                  "created_at", "unfinished_tasks"):
        assert retired[field] == configured["queue"][field], field

    # Reads keep working.
    assert ok(await tenant.get(f"/v1/queues/{q['id']}")) == retired
    # Lists hide it unless asked.
    assert ok(await tenant.get("/v1/queues"))["items"] == []
    assert ok(await tenant.get("/v1/queues", params={"include_retired": "true"}))["items"] == [retired]

    before = await state(db, tenant.namespace_id)
    # No new work: configure and a second retire are refused, the name stays taken.
    assert_error(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("3")), 409, "STATE_CONFLICT")
    assert_error(await tenant.post(path(q), retire_body("3")), 409, "STATE_CONFLICT")
    assert_error(await tenant.post("/v1/queues", create_body(q["name"])), 409, "STATE_CONFLICT")
    assert await state(db, tenant.namespace_id) == before

    # Replays answer with their original snapshots and change nothing.
    assert ok(await tenant.post(path(q), retire_body("2"), key=key)) == {"deduplicated": True, "queue": retired}
    replayed = ok(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1"), key=configure_key))
    assert replayed == {"deduplicated": True, "queue": configured["queue"]}
    assert await state(db, tenant.namespace_id) == before
    # ... while the same keys with other content still conflict.
    r = await tenant.post(path(q), retire_body("2", reason="other"), key=key)
    assert_error(r, 409, "IDEMPOTENCY_CONFLICT")


async def test_retire_with_a_stale_revision_is_a_state_conflict(tenant, db):
    q = await tenant.create_queue()
    ok(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1")))
    before = await state(db, tenant.namespace_id)
    for rev in ("1", "3", "18446744073709551615"):
        key = tenant.key()
        err = assert_error(await tenant.post(path(q), retire_body(rev), key=key), 409, "STATE_CONFLICT")
        assert err.get("details", {}).get("current_revision") == "2", err
        assert await idempotency_count(db, tenant.namespace_id, key) == 0
    assert await state(db, tenant.namespace_id) == before
    assert ok(await tenant.get(f"/v1/queues/{q['id']}"))["retired_at"] is None


async def test_retire_body_rules(tenant, db):
    q = await tenant.create_queue()
    cases: list[tuple[Any, str | None]] = [
        ({}, None),
        ({"reason": "x"}, "expected_revision"),
        ({"expected_revision": "1"}, "reason"),
        (retire_body("1", reason=""), "reason"),
        (retire_body("1", reason="  \n"), "reason"),
        (retire_body("1", reason=None), "reason"),
        (retire_body("1", reason="x" * 1025), "reason"),
        (retire_body("1", reason=7), "reason"),
        (retire_body("0"), "expected_revision"),
        (retire_body("01"), "expected_revision"),
        (retire_body(1), "expected_revision"),
        (retire_body(None), "expected_revision"),
        (retire_body("18446744073709551616"), "expected_revision"),
        (retire_body("1", paused=True), "paused"),
        (retire_body("1", retired_at="2026-01-01T00:00:00Z"), "retired_at"),
    ]
    before = await state(db, tenant.namespace_id)
    for body, field in cases:
        r = await tenant.post(path(q), body)
        try:
            assert_error(r, 400, "INVALID_ARGUMENT", field)
        except AssertionError as exc:
            raise AssertionError(f"body {body!r}: {exc}") from None
    for raw in (b"[]", b'"retire"', b"", b"{"):
        assert_error(await post_raw(tenant.http, path(q), raw, token=tenant.token, key=tenant.key()), 400,
                     "INVALID_ARGUMENT")
    assert await state(db, tenant.namespace_id) == before
    # A 1024-character reason is fine.
    assert ok(await tenant.post(path(q), retire_body("1", reason="é" * 1024)))["queue"]["revision"] == "2"


async def test_retire_writes_the_audit_record_and_the_event(tenant, db):
    q = await tenant.create_queue()
    key = tenant.key()
    r = await tenant.post(path(q), retire_body("1", reason="moved to images-v2"), key=key)
    after = ok(r)["queue"]
    audit = (await audit_rows(db, q["id"]))[-1]
    assert audit["action"] == "queue.retire" and audit["reason"] == "moved to images-v2"
    assert audit["actor_credential_id"] == tenant.credential_id and audit["idempotency_key"] == key
    assert audit["request_id"] == r.headers["x-request-id"]
    assert orjson.loads(audit["before"]) == q and orjson.loads(audit["after"]) == after
    event = (await event_rows(db, q["id"]))[-1]
    assert event["type"] == "queue.retired"
    assert orjson.loads(event["data"]) == {"queue": after, "reason": "moved to images-v2"}


async def test_retire_of_a_missing_malformed_or_foreign_queue_is_404(tenant, db, http):
    other = await make_tenant(db, http)
    foreign = await other.create_queue()
    before = await state(db, other.namespace_id)
    for qid in ("0" * 32, "nope", foreign["id"]):
        assert_error(await tenant.post(f"/v1/queues/{qid}:retire", retire_body("1")), 404, "NOT_FOUND")
    assert await state(db, other.namespace_id) == before
    assert ok(await other.get(f"/v1/queues/{foreign['id']}"))["retired_at"] is None


async def test_unfinished_tasks_block_retirement_and_show_in_snapshots(tenant, db):
    """The backlog is a running count: it shows in reads and receipts, never bumps the revision,
    and keeps the queue from retiring (details name the blocker)."""
    q = await tenant.create_queue()
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": {"n": 1}})
    assert r.status_code == 201, r.text
    task = r.json()["data"]["task"]
    live = ok(await tenant.get(f"/v1/queues/{q['id']}"))
    assert live["unfinished_tasks"] == "1"
    assert live["revision"] == "1" and live["updated_at"] == q["updated_at"]
    configured = ok(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1")))["queue"]
    assert configured["unfinished_tasks"] == "1" and configured["revision"] == "2"

    before = await state(db, tenant.namespace_id)
    key = tenant.key()
    err = assert_error(await tenant.post(path(q), retire_body("2"), key=key), 409, "STATE_CONFLICT")
    assert "unfinished_tasks" in str(err.get("details")), err
    assert await state(db, tenant.namespace_id) == before

    r = await tenant.post(f"/v1/tasks/{task['id']}:cancel", {"reason": "free the queue"})
    assert r.status_code == 200, r.text
    assert ok(await tenant.get(f"/v1/queues/{q['id']}"))["unfinished_tasks"] == "0"
    # The rejected retire left no record: its key now retires the queue.
    retired = ok(await tenant.post(path(q), retire_body("2"), key=key))["queue"]
    assert retired["revision"] == "3" and retired["unfinished_tasks"] == "0"
