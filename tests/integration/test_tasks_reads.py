"""GET /v1/tasks/{id}, GET /v1/queues/{id}/tasks, GET /v1/tasks/{id}/attempts."""

from __future__ import annotations

import asyncio
from datetime import timedelta, timezone
from typing import Any

import pytest

from .conftest import make_tenant
from .task_helpers import (
    assert_error,
    assert_task_object,
    batch_path,
    cancel,
    fmt,
    ok,
    parse_ts,
    submit,
    tasks_path,
)
from .worker_client import Worker

pytestmark = pytest.mark.anyio


async def list_all(tenant, q, *, limit: int, params: dict[str, Any] | None = None, token: str | None = None):
    """Follow next_cursor to the end; every page has at most `limit` items."""
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(100):
        p = dict(params or {}, limit=limit)
        if cursor is not None:
            p["cursor"] = cursor
        page = ok(await tenant.get(tasks_path(q), params=p, token=token))
        assert set(page) == {"items", "next_cursor"}, page
        assert len(page["items"]) <= limit
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
        assert isinstance(cursor, str) and cursor and page["items"], page
    raise AssertionError("pagination did not end")


async def test_get_task(tenant):
    q = await tenant.create_queue()
    t = await submit(tenant, q, {"payload": {"k": "v"}, "priority": 2})
    got = ok(await tenant.get(f"/v1/tasks/{t['id']}"))
    assert got == t
    assert_task_object(got, queue=q)
    reader = await tenant.credential(["tasks:read"])
    assert ok(await tenant.get(f"/v1/tasks/{t['id']}", token=reader)) == t
    scoped = await tenant.credential(["tasks:read"], queue_scope=[q["id"]])
    assert ok(await tenant.get(f"/v1/tasks/{t['id']}", token=scoped)) == t


async def test_get_task_not_found_and_forbidden(tenant, db, http):
    q = await tenant.create_queue()
    other_q = await tenant.create_queue()
    t = await submit(tenant, q, {"payload": 1})
    for task_id in ("0" * 32, "f" * 32, t["id"].upper(), t["id"][:-1], t["id"] + "0", "not-an-id", q["id"]):
        assert_error(await tenant.get(f"/v1/tasks/{task_id}"), 404, "NOT_FOUND")
    out_of_scope = await tenant.credential(["tasks:read"], queue_scope=[other_q["id"]])
    assert_error(await tenant.get(f"/v1/tasks/{t['id']}", token=out_of_scope), 404, "NOT_FOUND")
    stranger = await make_tenant(db, http)
    assert_error(await stranger.get(f"/v1/tasks/{t['id']}"), 404, "NOT_FOUND")
    no_read = await tenant.credential(["tasks:submit", "tasks:cancel", "queues:read"])
    assert_error(await tenant.get(f"/v1/tasks/{t['id']}", token=no_read), 403, "PERMISSION_DENIED")
    r = await tenant.http.get(f"/v1/tasks/{t['id']}")
    assert_error(r, 401, "UNAUTHENTICATED")


async def test_list_is_newest_first_and_pages_without_gaps(tenant):
    q = await tenant.create_queue()
    other = await tenant.create_queue()
    created = [await submit(tenant, q, {"payload": i}) for i in range(4)]
    data = ok(await tenant.post(batch_path(q), {"tasks": [{"idempotency_key": f"b{i}", "payload": 10 + i}
                                                          for i in range(5)]}))
    created += [r["task"] for r in data["results"]]
    await submit(tenant, other, {"payload": "elsewhere"})
    expected = [t["id"] for t in reversed(created)]

    page = ok(await tenant.get(tasks_path(q)))
    assert [t["id"] for t in page["items"]] == expected and page["next_cursor"] is None
    by_id = {t["id"]: t for t in created}
    for item in page["items"]:
        assert item == by_id[item["id"]]  # full task objects, payload included
    created_ats = [t["created_at"] for t in page["items"]]
    assert created_ats == sorted(created_ats, reverse=True)

    for limit in (1, 2, 3, 4, 8, 9, 10, 1000):
        items = await list_all(tenant, q, limit=limit)
        assert [t["id"] for t in items] == expected, limit
    first = ok(await tenant.get(tasks_path(q), params={"limit": 9}))
    assert first["next_cursor"] is None  # exactly filled: no empty extra page
    # Tasks submitted after a cursor was issued do not disturb the rest of the walk.
    page1 = ok(await tenant.get(tasks_path(q), params={"limit": 4}))
    newer = await submit(tenant, q, {"payload": "newer"})
    rest = await list_all(tenant, q, limit=4, params={"cursor": page1["next_cursor"]})
    assert [t["id"] for t in page1["items"] + rest] == expected
    assert ok(await tenant.get(tasks_path(q), params={"limit": 1}))["items"][0]["id"] == newer["id"]


async def test_list_state_filter(tenant):
    q = await tenant.create_queue()
    ts = [await submit(tenant, q, {"payload": i}) for i in range(4)]
    for t in ts[:2]:
        assert (await cancel(tenant, t["id"])).status_code == 200
    waiting = [t["id"] for t in reversed(ts[2:])]
    cancelled = [t["id"] for t in reversed(ts[:2])]

    def ids(page):
        return [t["id"] for t in page["items"]]

    assert ids(ok(await tenant.get(tasks_path(q), params={"state": "WAITING"}))) == waiting
    page = ok(await tenant.get(tasks_path(q), params={"state": "CANCELLED"}))
    assert ids(page) == cancelled and all(t["state"] == "CANCELLED" for t in page["items"])
    both = ok(await tenant.get(tasks_path(q), params=[("state", "WAITING"), ("state", "CANCELLED")]))
    assert ids(both) == [t["id"] for t in reversed(ts)]
    dup = ok(await tenant.get(tasks_path(q), params=[("state", "WAITING"), ("state", "WAITING")]))
    assert ids(dup) == waiting
    for s in ("FAILED", "SUCCEEDED", "RUNNING", "LEASED", "NEEDS_REVIEW"):
        assert ids(ok(await tenant.get(tasks_path(q), params={"state": s}))) == []
    # Filters compose with pagination.
    items = await list_all(tenant, q, limit=1, params={"state": "CANCELLED"})
    assert [t["id"] for t in items] == cancelled
    for bad in ("waiting", "DONE", "", "WAITING,CANCELLED"):
        assert_error(await tenant.get(tasks_path(q), params={"state": bad}), 400, "INVALID_ARGUMENT", "state")
    r = await tenant.get(tasks_path(q), params=[("state", "WAITING"), ("state", "BOGUS")])
    assert_error(r, 400, "INVALID_ARGUMENT", "state")


async def test_list_created_filters(tenant):
    q = await tenant.create_queue()
    ts = []
    for i in range(3):
        ts.append(await submit(tenant, q, {"payload": i}))
        await asyncio.sleep(0.01)
    c = [parse_ts(t["created_at"]) for t in ts]
    assert c[0] < c[1] < c[2], c
    mid01, mid12 = fmt(c[0] + (c[1] - c[0]) / 2), fmt(c[1] + (c[2] - c[1]) / 2)

    async def ids(**params):
        return [t["id"] for t in ok(await tenant.get(tasks_path(q), params=params))["items"]]

    all_ids = [t["id"] for t in reversed(ts)]
    assert await ids(created_after=mid01) == [ts[2]["id"], ts[1]["id"]]
    assert await ids(created_before=mid12) == [ts[1]["id"], ts[0]["id"]]
    assert await ids(created_after=mid01, created_before=mid12) == [ts[1]["id"]]
    assert await ids(created_after=fmt(c[0] - timedelta(days=1))) == all_ids
    assert await ids(created_before=fmt(c[2] + timedelta(days=1))) == all_ids
    assert await ids(created_after=fmt(c[2] + timedelta(days=1))) == []
    assert await ids(created_before=fmt(c[0] - timedelta(days=1))) == []
    assert await ids(created_after=mid12, created_before=mid01) == []
    # Any RFC 3339 offset is accepted.
    offset = (c[0] + (c[1] - c[0]) / 2).astimezone(timezone(timedelta(hours=-3))).isoformat()
    assert await ids(created_after=offset) == [ts[2]["id"], ts[1]["id"]]
    assert await ids(created_after=mid01, state="WAITING", limit=1) == [ts[2]["id"]]
    for name in ("created_after", "created_before"):
        for bad in ("yesterday", "2026-11-29", "2026-11-29T00:00:00", "1764454913"):
            assert_error(await tenant.get(tasks_path(q), params={name: bad}), 400, "INVALID_ARGUMENT", name)


async def test_list_limit_and_cursor_validation(tenant):
    q = await tenant.create_queue()
    await submit(tenant, q, {"payload": 1})
    await submit(tenant, q, {"payload": 2})
    for limit in ("0", "1001", "-1", "abc", "1.5", ""):
        assert_error(await tenant.get(tasks_path(q), params={"limit": limit}), 400, "INVALID_ARGUMENT", "limit")
    assert len(ok(await tenant.get(tasks_path(q), params={"limit": "1"}))["items"]) == 1
    assert len(ok(await tenant.get(tasks_path(q), params={"limit": "1000"}))["items"]) == 2
    for cursor in ("garbage", "!!!", "eyJ4IjoxfQ"):
        assert_error(await tenant.get(tasks_path(q), params={"cursor": cursor}), 400, "INVALID_ARGUMENT", "cursor")


async def test_list_not_found_and_forbidden(tenant, db, http):
    q = await tenant.create_queue()
    other = await tenant.create_queue()
    await submit(tenant, q, {"payload": 1})
    for queue_id in ("0" * 32, "nope", q["id"].upper()):
        assert_error(await tenant.get(tasks_path(queue_id)), 404, "NOT_FOUND")
    scoped = await tenant.credential(["tasks:read"], queue_scope=[other["id"]])
    assert_error(await tenant.get(tasks_path(q), token=scoped), 404, "NOT_FOUND")
    assert ok(await tenant.get(tasks_path(other), token=scoped)) == {"items": [], "next_cursor": None}
    no_read = await tenant.credential(["tasks:submit", "queues:read"])
    assert_error(await tenant.get(tasks_path(q), token=no_read), 403, "PERMISSION_DENIED")
    stranger = await make_tenant(db, http)
    assert_error(await stranger.get(tasks_path(q)), 404, "NOT_FOUND")
    assert_error(await tenant.http.get(tasks_path(q)), 401, "UNAUTHENTICATED")


async def test_attempts_of_a_waiting_task(tenant, db, http):
    q = await tenant.create_queue()
    other = await tenant.create_queue()
    t = await submit(tenant, q, {"payload": 1})
    path = f"/v1/tasks/{t['id']}/attempts"
    assert ok(await tenant.get(path)) == {"items": [], "next_cursor": None}
    assert ok(await tenant.get(path, params={"limit": 5})) == {"items": [], "next_cursor": None}
    assert (await cancel(tenant, t["id"])).status_code == 200
    assert ok(await tenant.get(path)) == {"items": [], "next_cursor": None}
    for task_id in ("0" * 32, "nope"):
        assert_error(await tenant.get(f"/v1/tasks/{task_id}/attempts"), 404, "NOT_FOUND")
    scoped = await tenant.credential(["tasks:read"], queue_scope=[other["id"]])
    assert_error(await tenant.get(path, token=scoped), 404, "NOT_FOUND")
    stranger = await make_tenant(db, http)
    assert_error(await stranger.get(path), 404, "NOT_FOUND")
    no_read = await tenant.credential(["tasks:submit"])
    assert_error(await tenant.get(path, token=no_read), 403, "PERMISSION_DENIED")
    for limit in ("0", "1001"):
        assert_error(await tenant.get(path, params={"limit": limit}), 400, "INVALID_ARGUMENT", "limit")


async def test_list_default_limit_is_100(tenant):
    q = await tenant.create_queue()
    items = [{"idempotency_key": f"d-{i}", "payload": i} for i in range(101)]
    ok(await tenant.post(batch_path(q), {"tasks": items}))
    page = ok(await tenant.get(tasks_path(q)))
    assert len(page["items"]) == 100 and page["next_cursor"] is not None
    assert [t["payload"] for t in page["items"]] == list(range(100, 0, -1))
    rest = ok(await tenant.get(tasks_path(q), params={"cursor": page["next_cursor"]}))
    assert [t["payload"] for t in rest["items"]] == [0] and rest["next_cursor"] is None


async def test_list_tells_leased_from_running(tenant, base):
    """LEASED and RUNNING share one range of the state index: a listing keeps only the state asked for."""
    q = await tenant.create_queue(max_concurrency=10)
    ts = [await submit(tenant, q, {"payload": i}) for i in range(3)]
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        first, second = (await w.call("claim", queue_id=q["id"], max_tasks=2))["tasks"]
        assert (await w.call("start", lease_id=first["lease_id"]))["ok"]

        async def ids(*states: str) -> list[str]:
            params = [("state", s) for s in states]
            return [t["id"] for t in ok(await tenant.get(tasks_path(q), params=params))["items"]]

        assert await ids("RUNNING") == [first["task_id"]]
        assert await ids("LEASED") == [second["task_id"]]
        assert await ids("LEASED", "RUNNING") == sorted([first["task_id"], second["task_id"]], reverse=True)
        assert await ids("RUNNING", "WAITING") == sorted([first["task_id"], ts[2]["id"]], reverse=True)
        done = await w.call("complete", lease_id=first["lease_id"], outcome="succeeded", result=None)
        assert done["ok"]
        assert await ids("RUNNING") == [] and await ids("SUCCEEDED") == [first["task_id"]]
