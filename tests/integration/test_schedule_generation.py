"""Schedule generation: exactly one task or SKIPPED record per trigger point,
misfire and overlap policies, backpressure holding the cursor, pause, and template deadlines."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from orbit.server.services import scheduler
from orbit.server.store.tx import Stmt

from .queue_helpers import ok

pytestmark = pytest.mark.anyio


def iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


async def create_schedule(tenant, queue_id: str, **fields) -> dict:
    body = {"name": f"s-{uuid.uuid4().hex[:10]}", "queue_id": queue_id, "interval_seconds": 1,
            "task": {"payload": {"report": "x"}}}
    body.update(fields)
    r = await tenant.post("/v1/schedules", body)
    assert r.status_code == 201, r.text
    return r.json()["data"]["schedule"]


async def rewind(db, schedule: dict, seconds: int) -> None:
    """As if no scheduler had run for `seconds` (every node down): the cursor goes back that far
    (a multiple of the interval, so the points stay aligned)."""
    from sqlalchemy import select, update

    from orbit.server.store.tables import schedules

    async def back(tx):
        row = (await tx.conn.execute(select(schedules.c.next_trigger_at, schedules.c.due_at, schedules.c.anchor_at)
                                     .where(schedules.c.id == schedule["id"]))).one()
        shift = timedelta(seconds=seconds)
        await tx.conn.execute(update(schedules).where(schedules.c.id == schedule["id"]).values(
            next_trigger_at=row.next_trigger_at - shift, anchor_at=row.anchor_at - shift,
            due_at=None if row.due_at is None else row.due_at - shift))

    await db.core_transaction(back)


async def runs(tenant, schedule_id: str) -> list[dict]:
    out, cursor = [], None
    while True:
        params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = ok(await tenant.get(f"/v1/schedules/{schedule_id}/runs", params=params))
        out += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return out


async def generated(db, schedule_id: str) -> list[dict]:
    return await db.read(lambda tx: tx.rows(Stmt(
        "SELECT id, trigger_at, available_at, deadline_at, start_deadline_at, state FROM tasks "
        "WHERE schedule_id = ? ORDER BY trigger_at", (schedule_id,))))


def parse(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).replace(tzinfo=None)


def consecutive(points: list[datetime], step: float) -> bool:
    return all(abs((b - a).total_seconds() - step) < 1e-6 for a, b in zip(points, points[1:]))


async def test_due_points_become_tasks_once_each(tenant, db):
    q = await tenant.create_queue()
    s = await create_schedule(tenant, q["id"], task={"payload": {"n": 1}, "priority": 3, "deadline_seconds": 600,
                                                     "start_deadline_seconds": 30})
    await rewind(db, s, 5)
    await scheduler.run_once(tenant.db)
    await scheduler.run_once(tenant.db)
    records = await runs(tenant, s["id"])
    assert len(records) >= 4 and all(r["outcome"] == "SUBMITTED" for r in records)
    points = [parse(r["trigger_at"]) for r in records]
    assert points[0] == parse(s["next_trigger_at"]) - timedelta(seconds=5) and consecutive(points, 1)
    tasks = await generated(db, s["id"])
    assert [t["id"] for t in tasks] == [r["task_id"] for r in records]
    for t in tasks:
        assert t["available_at"] == t["trigger_at"]
        assert t["deadline_at"] == t["trigger_at"] + timedelta(seconds=600)
        assert t["start_deadline_at"] == t["trigger_at"] + timedelta(seconds=30)
    listed = ok(await tenant.get(f"/v1/queues/{q['id']}/tasks", params={"schedule_id": s["id"], "limit": 100}))
    assert {t["id"] for t in listed["items"]} == {t["id"] for t in tasks}
    assert all(t["schedule_id"] == s["id"] and t["trigger_at"] for t in listed["items"])
    after = ok(await tenant.get(f"/v1/schedules/{s['id']}"))
    assert parse(after["last_trigger_at"]) == points[-1]
    assert parse(after["next_trigger_at"]) == points[-1] + timedelta(seconds=1)
    assert ok(await tenant.get(f"/v1/queues/{q['id']}"))["unfinished_tasks"] == str(len(tasks))


async def test_catch_up_skips_points_older_than_the_window(tenant, db):
    q = await tenant.create_queue()
    s = await create_schedule(tenant, q["id"], interval_seconds=10,
                              misfire={"policy": "catch_up", "catch_up_window_seconds": 60})
    await rewind(db, s, 300)
    await scheduler.run_once(tenant.db)
    records = await runs(tenant, s["id"])
    points = [parse(r["trigger_at"]) for r in records]
    assert consecutive(points, 10) and points[0] == parse(s["next_trigger_at"]) - timedelta(seconds=300)
    now = utc_now().replace(tzinfo=None)
    for r, p in zip(records, points):
        if p < now - timedelta(seconds=62):
            assert (r["outcome"], r["reason"]) == ("SKIPPED", "MISFIRE")
        elif p > now - timedelta(seconds=58):
            assert r["outcome"] == "SUBMITTED" and r["task_id"]
    assert 5 <= sum(r["outcome"] == "SUBMITTED" for r in records) <= 7


async def test_latest_runs_only_the_most_recent_missed_point(tenant, db):
    q = await tenant.create_queue()
    s = await create_schedule(tenant, q["id"], interval_seconds=10,
                              misfire={"policy": "latest", "catch_up_window_seconds": 3600})
    await rewind(db, s, 200)
    await scheduler.run_once(tenant.db)
    records = await runs(tenant, s["id"])
    assert [r["outcome"] for r in records] == ["SKIPPED"] * (len(records) - 1) + ["SUBMITTED"]
    assert all(r["reason"] == "MISFIRE" for r in records[:-1])


async def test_a_full_queue_holds_the_cursor_until_room_appears(tenant, db):
    q = await tenant.create_queue(max_unfinished_tasks=2)
    s = await create_schedule(tenant, q["id"], misfire={"policy": "catch_up", "catch_up_window_seconds": 3600})
    await rewind(db, s, 6)
    await scheduler.run_once(tenant.db)
    first = await runs(tenant, s["id"])
    assert [r["outcome"] for r in first] == ["SUBMITTED", "SUBMITTED"]
    held = ok(await tenant.get(f"/v1/schedules/{s['id']}"))
    assert parse(held["next_trigger_at"]) == parse(first[-1]["trigger_at"]) + timedelta(seconds=1)
    await scheduler.run_once(tenant.db)
    assert len(await runs(tenant, s["id"])) == 2  # still full: no task, no record
    for r in first:
        ok(await tenant.post(f"/v1/tasks/{r['task_id']}:cancel", {"reason": "make room"}))
    await scheduler.run_once(tenant.db)
    later = await runs(tenant, s["id"])
    points = [parse(r["trigger_at"]) for r in later]
    assert consecutive(points, 1) and later[2]["outcome"] == "SUBMITTED"
    assert len(later) == 4  # two more fit, then the queue is full again


async def test_overlap_skip_waits_for_the_previous_task(tenant, db):
    q = await tenant.create_queue()
    s = await create_schedule(tenant, q["id"], overlap="skip")
    await rewind(db, s, 4)
    await scheduler.run_once(tenant.db)
    records = await runs(tenant, s["id"])
    assert records[0]["outcome"] == "SUBMITTED"
    assert all((r["outcome"], r["reason"]) == ("SKIPPED", "OVERLAP") for r in records[1:]) and len(records) >= 3
    ok(await tenant.post(f"/v1/tasks/{records[0]['task_id']}:cancel", {"reason": "done"}))
    await asyncio.sleep(1.1)
    await scheduler.run_once(tenant.db)
    more = (await runs(tenant, s["id"]))[len(records):]
    assert more and more[0]["outcome"] == "SUBMITTED"


async def test_a_paused_schedule_generates_nothing_and_resumes_under_its_misfire_policy(tenant, db):
    q = await tenant.create_queue()
    s = await create_schedule(tenant, q["id"], paused=True,
                              misfire={"policy": "latest", "catch_up_window_seconds": 60})
    await rewind(db, s, 4)
    await scheduler.run_once(tenant.db)
    assert await runs(tenant, s["id"]) == []
    body = {k: s[k] for k in ("cron", "interval_seconds", "timezone", "start_at", "end_at", "misfire", "overlap",
                              "task")}
    ok(await tenant.post(f"/v1/schedules/{s['id']}:configure",
                         {**body, "paused": False, "expected_revision": s["revision"], "reason": "resume"}))
    await scheduler.run_once(tenant.db)
    records = await runs(tenant, s["id"])
    assert records and records[-1]["outcome"] == "SUBMITTED"
    assert all(r["outcome"] == "SKIPPED" for r in records[:-1])


async def test_a_paused_queue_does_not_stop_generation(tenant, db):
    q = await tenant.create_queue()
    ok(await tenant.post(f"/v1/queues/{q['id']}:configure",
                         {"expected_revision": q["revision"], "reason": "hold", "paused": True,
                          "max_concurrency": q["max_concurrency"], "rate_per_second": q["rate_per_second"],
                          "max_unfinished_tasks": q["max_unfinished_tasks"]}))
    s = await create_schedule(tenant, q["id"])
    await rewind(db, s, 2)
    await scheduler.run_once(tenant.db)
    assert any(r["outcome"] == "SUBMITTED" for r in await runs(tenant, s["id"]))


async def test_concurrent_scheduler_passes_never_handle_a_point_twice(tenant, db):
    q = await tenant.create_queue(max_unfinished_tasks=100000)
    schedules = [await create_schedule(tenant, q["id"],
                                       misfire={"policy": "catch_up", "catch_up_window_seconds": 3600})
                 for _ in range(5)]
    for s in schedules:
        await rewind(db, s, 20)
    await asyncio.gather(*(scheduler.run_once(tenant.db) for _ in range(4)))
    for s in schedules:
        records = await runs(tenant, s["id"])
        points = [parse(r["trigger_at"]) for r in records]
        assert len(points) >= 20 and len(set(points)) == len(points) and consecutive(points, 1)
        tasks = await generated(db, s["id"])
        assert len(tasks) == len(records)
