"""Deadlines of waiting tasks, enforced by the server's sweep."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from orbit.server.services.tasks import sweep_deadlines

from .task_helpers import (
    assert_error,
    assert_queue_full,
    assert_task_object,
    cancel,
    counter_invariant,
    event_rows,
    fmt,
    in_seconds,
    ok,
    parse_ts,
    snapshot,
    submit,
    tasks_path,
    utcnow,
)

pytestmark = pytest.mark.anyio


async def sleep_past(*instants: str) -> None:
    """Sleep until every given RFC 3339 instant lies a little in the past."""
    latest = max(parse_ts(i) for i in instants)
    remaining = (latest - utcnow()).total_seconds() + 0.15
    if remaining > 0:
        await asyncio.sleep(remaining)


async def test_waiting_tasks_end_failed_when_a_deadline_passes(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=6)
    # A cancelled task with a passed deadline stays cancelled and is not released twice.
    gone = await submit(tenant, q, {"payload": "gone", "deadline_seconds": 1, "start_deadline_at": in_seconds(1)})
    gone = ok(await cancel(tenant, gone["id"]))["task"]
    total = await submit(tenant, q, {"payload": "total", "deadline_seconds": 1}, key="total")
    absolute = await submit(tenant, q, {"payload": "absolute", "deadline_at": in_seconds(1.2)})
    start = await submit(tenant, q, {"payload": "start", "start_deadline_at": in_seconds(1.2)})
    # Not yet available when its start deadline passes: it never started, so it fails too.
    late = await submit(tenant, q, {"payload": "late", "available_at": in_seconds(1.0),
                                    "start_deadline_at": in_seconds(1.1)})
    plain = await submit(tenant, q, {"payload": "plain"})
    future = await submit(tenant, q, {"payload": "future", "deadline_seconds": 3600,
                                      "start_deadline_at": in_seconds(3600)})
    assert_queue_full(await tenant.post(tasks_path(q), {"payload": "no room"}))
    assert await counter_invariant(tenant, q["id"]) == 6

    await sleep_past(total["deadline_at"], absolute["deadline_at"], start["start_deadline_at"],
                     late["start_deadline_at"], gone["deadline_at"], gone["start_deadline_at"])
    # Nothing happens until the sweep runs (no background loops in these tests).
    assert ok(await tenant.get(f"/v1/tasks/{total['id']}"))["state"] == "WAITING"
    swept = await sweep_deadlines(tenant.db)
    assert swept >= 4

    expired = {
        total["id"]: "DEADLINE_EXCEEDED",
        absolute["id"]: "DEADLINE_EXCEEDED",
        start["id"]: "START_DEADLINE_EXCEEDED",
        late["id"]: "START_DEADLINE_EXCEEDED",
    }
    for task_id, code in expired.items():
        t = ok(await tenant.get(f"/v1/tasks/{task_id}"))
        assert_task_object(t, queue=q)
        assert t["state"] == "FAILED", t
        assert t["error"]["code"] == code and isinstance(t["error"]["message"], str) and t["error"]["message"]
        assert t["finished_at"] is not None and t["updated_at"] == t["finished_at"]
        assert t["attempts"] == 0 and t["result"] is None
        events = await event_rows(tenant, task_id)
        assert [e["type"] for e in events] == ["task.submitted", "task.failed"], events
        assert events[1]["data"]["state"] == "FAILED" and events[1]["data"]["error"]["code"] == code
    for untouched in (plain, future):
        assert ok(await tenant.get(f"/v1/tasks/{untouched['id']}")) == untouched
        assert [e["type"] for e in await event_rows(tenant, untouched["id"])] == ["task.submitted"]
    assert ok(await tenant.get(f"/v1/tasks/{gone['id']}")) == gone
    assert [e["type"] for e in await event_rows(tenant, gone["id"])] == ["task.submitted", "task.cancelled"]
    assert await counter_invariant(tenant, q["id"]) == 2

    # The slots are free again; the sweep is idempotent; terminal tasks cannot be cancelled.
    before = await snapshot(tenant, q["id"])
    await sweep_deadlines(tenant.db)
    assert await snapshot(tenant, q["id"]) == before
    assert_error(await cancel(tenant, total["id"]), 409, "STATE_CONFLICT")
    assert await snapshot(tenant, q["id"]) == before
    # The submit receipt stays the original one.
    assert ok(await tenant.post(tasks_path(q), {"payload": "total", "deadline_seconds": 1}, key="total")) == {
        "deduplicated": True, "task": total
    }
    listed = ok(await tenant.get(tasks_path(q), params={"state": "FAILED"}))["items"]
    assert {t["id"] for t in listed} == set(expired)
    await submit(tenant, q, {"payload": "room again"})
    assert await counter_invariant(tenant, q["id"]) == 3


async def test_deadline_seconds_is_relative_to_acceptance(tenant):
    q = await tenant.create_queue()
    t = await submit(tenant, q, {"payload": 1, "deadline_seconds": 86400})
    assert parse_ts(t["deadline_at"]) - parse_ts(t["created_at"]) == timedelta(seconds=86400)
    # An absolute deadline is kept exactly as given (in UTC).
    when = fmt(utcnow() + timedelta(days=1))
    assert (await submit(tenant, q, {"payload": 1, "deadline_at": when}))["deadline_at"] == when
