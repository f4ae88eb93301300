"""Schedules on three server nodes (1-second intervals): every trigger point is handled once —
a task or a SKIPPED record with its reason — none twice and none lost, a full queue holds the
cursor until room appears, and the catch-up window and `latest` are honoured after every node
was down."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from .nodes import async_client, fetch_all, post, warm_up

pytestmark = pytest.mark.cluster


def _iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


async def _schedule(client, node, token: str, queue_id: str, **fields) -> str:
    body = {"name": f"s-{uuid.uuid4().hex[:8]}", "queue_id": queue_id, "interval_seconds": 1,
            "task": {"payload": {"k": 1}}, **fields}
    r = await post(client, node, "/v1/schedules", body, token=token, key=uuid.uuid4().hex)
    assert r.status == 201, r
    return r.data["schedule"]["id"]


async def _queue(client, node, token: str, **fields) -> str:
    body = {"name": f"q-{uuid.uuid4().hex[:8]}", "max_concurrency": 10, "rate_per_second": 100, **fields}
    r = await post(client, node, "/v1/queues", body, token=token, key=uuid.uuid4().hex)
    assert r.status == 201, r
    return r.data["queue"]["id"]


def _runs(url: str, schedule_id: str) -> list[dict]:
    return asyncio.run(fetch_all(url, "SELECT trigger_at, outcome, task_id, reason FROM schedule_runs "
                                      "WHERE schedule_id=:s ORDER BY trigger_at", s=schedule_id))


def _tasks(url: str, schedule_id: str) -> list[dict]:
    return asyncio.run(fetch_all(url, "SELECT id, trigger_at FROM tasks WHERE schedule_id=:s ORDER BY trigger_at",
                                 s=schedule_id))


def _accounted(runs: list[dict], tasks: list[dict]) -> None:
    """Consecutive one-second points, each once; a task for every SUBMITTED record and no other."""
    points = [r["trigger_at"] for r in runs]
    assert len(set(points)) == len(points)
    assert all(b - a == timedelta(seconds=1) for a, b in zip(points, points[1:])), points
    submitted = {r["task_id"] for r in runs if r["outcome"] == "SUBMITTED"}
    # The nodes go on generating between the two reads: compare up to the last point read first.
    assert submitted == {t["id"] for t in tasks if t["trigger_at"] <= points[-1]}
    assert all(r["reason"] in ("MISFIRE", "OVERLAP") for r in runs if r["outcome"] == "SKIPPED")


def test_three_nodes_handle_every_point_once(cluster, tenant, mariadb_url):
    nodes = cluster.start_nodes(3)

    async def setup():
        async with async_client() as client:
            await warm_up(client, nodes, connections=1)
            q = await _queue(client, nodes[0], tenant["token"], max_unfinished_tasks=100000)
            full = await _queue(client, nodes[1], tenant["token"], max_unfinished_tasks=3)
            ids = [await _schedule(client, nodes[i % 3], tenant["token"], q) for i in range(6)]
            ids.append(await _schedule(client, nodes[0], tenant["token"], q, overlap="skip"))
            held = await _schedule(client, nodes[2], tenant["token"], full,
                                   misfire={"policy": "catch_up", "catch_up_window_seconds": 3600})
            return ids, held

    ids, held = asyncio.run(setup())
    time.sleep(8)
    for sid in ids:
        runs, tasks = _runs(mariadb_url, sid), _tasks(mariadb_url, sid)
        assert len(runs) >= 5
        _accounted(runs, tasks)
    overlap_runs = _runs(mariadb_url, ids[-1])
    assert overlap_runs[0]["outcome"] == "SUBMITTED"
    assert all((r["outcome"], r["reason"]) == ("SKIPPED", "OVERLAP") for r in overlap_runs[1:])
    held_runs = _runs(mariadb_url, held)
    assert [r["outcome"] for r in held_runs] == ["SUBMITTED"] * 3  # the queue is full: the cursor waits

    async def make_room():
        async with async_client() as client:
            for r in held_runs:
                c = await post(client, nodes[1], f"/v1/tasks/{r['task_id']}:cancel", {"reason": "room"},
                               token=tenant["token"], key=uuid.uuid4().hex)
                assert c.status == 200, c

    asyncio.run(make_room())
    time.sleep(2.5)
    after = _runs(mariadb_url, held)
    assert len(after) == 6 and all(r["outcome"] == "SUBMITTED" for r in after)
    _accounted(after, _tasks(mariadb_url, held))


def test_misfire_policies_after_every_node_was_down(cluster, tenant, mariadb_url):
    nodes = cluster.start_nodes(2)

    async def setup():
        async with async_client() as client:
            await warm_up(client, nodes, connections=1)
            q = await _queue(client, nodes[0], tenant["token"], max_unfinished_tasks=100000)
            catch_up = await _schedule(client, nodes[0], tenant["token"], q,
                                       misfire={"policy": "catch_up", "catch_up_window_seconds": 6})
            latest = await _schedule(client, nodes[1], tenant["token"], q,
                                     misfire={"policy": "latest", "catch_up_window_seconds": 60})
            return catch_up, latest

    catch_up, latest = asyncio.run(setup())
    time.sleep(2)
    for n in nodes:
        n.kill()
    down_at = datetime.now(timezone.utc).replace(tzinfo=None)
    time.sleep(15)
    for n in nodes:
        n.restart()
    time.sleep(3)
    for sid in (catch_up, latest):
        _accounted(_runs(mariadb_url, sid), _tasks(mariadb_url, sid))
    missed = [r for r in _runs(mariadb_url, catch_up) if r["trigger_at"] > down_at + timedelta(seconds=1)]
    skipped = [r for r in missed if r["outcome"] == "SKIPPED"]
    assert skipped and all(r["reason"] == "MISFIRE" for r in skipped)
    assert sum(r["outcome"] == "SUBMITTED" for r in missed) >= 6  # the window's points, then on time
    missed_latest = [r for r in _runs(mariadb_url, latest)
                     if down_at + timedelta(seconds=1) < r["trigger_at"] < down_at + timedelta(seconds=14)]
    assert missed_latest and all(r["outcome"] == "SKIPPED" for r in missed_latest)
