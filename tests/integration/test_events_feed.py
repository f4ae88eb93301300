"""The event feed: numbered after commit, read in seq order exactly once,
long polls, type filters, parameters, permissions, retention and CURSOR_EXPIRED."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from orbit.server.services import dispatch
from orbit.server.services import events as event_service

from .conftest import make_tenant
from .queue_helpers import assert_error, ok
from .test_worker_protocol import submit
from .worker_client import Worker

pytestmark = pytest.mark.anyio


async def number(tenant) -> None:
    await event_service.number_namespace(tenant.db, tenant.namespace["id"])


async def feed(tenant, **params) -> dict:
    return ok(await tenant.get("/v1/events", params={k: v for k, v in params.items() if v is not None}))


async def drain_feed(tenant, after: str = "0", **params) -> tuple[list[dict], str]:
    items = []
    while True:
        page = await feed(tenant, after=after, limit=50, **params)
        items += page["items"]
        if page["next_after"] == after:
            return items, after
        after = page["next_after"]


async def test_events_are_read_once_in_seq_order(tenant):
    q = await tenant.create_queue()
    ids = await submit(tenant, q["id"], 7)
    await number(tenant)
    items, cursor = await drain_feed(tenant)
    seqs = [int(e["seq"]) for e in items]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] == 1
    assert all(b == a + 1 for a, b in zip(seqs, seqs[1:]))  # consecutive per namespace
    submitted = [e["resource_id"] for e in items if e["type"] == "task.submitted"]
    assert submitted == ids
    assert {"seq", "type", "time", "resource_type", "resource_id", "data"} == set(items[0])
    more = await submit(tenant, q["id"], 2)
    await number(tenant)
    page = await feed(tenant, after=cursor)
    assert [e["resource_id"] for e in page["items"] if e["type"] == "task.submitted"] == more
    assert int(page["items"][0]["seq"]) == int(cursor) + 1


async def test_a_lease_that_ends_unstarted_gives_its_task_back_with_an_event(tenant, base):
    """Every state change has its event: LEASED -> WAITING too, when the worker releases the lease
    (`released`) or it expires before any Start (`lease_expired`)."""
    q = await tenant.create_queue()
    released_id, expired_id = await submit(tenant, q["id"], 2)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = await w.call("claim", queue_id=q["id"], max_tasks=2, lease_ms=1000)
        by_task = {t["task_id"]: t["lease_id"] for t in c["tasks"]}
        assert (await w.call("release", lease_id=by_task[released_id]))["ok"]
        await asyncio.sleep(1.1)
        assert await dispatch.recover_expired_leases(tenant.db) >= 1
    await number(tenant)
    items, _ = await drain_feed(tenant, type="task.released")
    got = {e["resource_id"]: e["data"] for e in items}
    assert got == {
        released_id: {"task_id": released_id, "queue_id": q["id"], "state": "WAITING",
                      "lease_id": by_task[released_id], "reason": "released"},
        expired_id: {"task_id": expired_id, "queue_id": q["id"], "state": "WAITING",
                     "lease_id": by_task[expired_id], "reason": "lease_expired"},
    }


async def test_type_filters_and_a_cursor_past_other_types(tenant):
    q = await tenant.create_queue()
    await submit(tenant, q["id"], 3)
    await number(tenant)
    page = await feed(tenant, type="task.submitted")
    assert [e["type"] for e in page["items"]] == ["task.submitted"] * 3
    only_queues = await feed(tenant, type="queue.*")
    assert [e["type"] for e in only_queues["items"]] == ["queue.created"]
    assert only_queues["next_after"] == page["next_after"]  # past the other types too
    both = await feed(tenant, type="queue.created,task.submitted")
    assert len(both["items"]) == 4


async def test_a_long_poll_returns_soon_after_an_event(tenant, base):
    q = await tenant.create_queue()
    await number(tenant)
    cursor = (await feed(tenant))["next_after"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    waiting = asyncio.create_task(tenant.get("/v1/events", params={"after": cursor, "wait_ms": 5000}))
    await asyncio.sleep(0.3)
    await submit(tenant, q["id"], 1)
    await number(tenant)
    page = ok(await waiting)
    assert [e["type"] for e in page["items"]] == ["task.submitted"]
    assert loop.time() - started < 2.5
    empty = await feed(tenant, after=page["next_after"], wait_ms=300)
    assert empty == {"items": [], "next_after": page["next_after"]}


@pytest.mark.parametrize("params", [{"after": "-1"}, {"after": "x"}, {"after": "1" * 25}, {"limit": 0},
                                    {"limit": 1001}, {"wait_ms": 30001}, {"wait_ms": -1}, {"type": "Task"},
                                    {"type": "task"}, {"type": "task.*.x"}])
async def test_bad_parameters_are_refused(tenant, params):
    assert_error(await tenant.get("/v1/events", params=params), 400, "INVALID_ARGUMENT")


async def test_the_feed_needs_events_read_and_every_queue(tenant):
    q = await tenant.create_queue()
    nobody = await tenant.credential(["queues:read"])
    assert_error(await tenant.get("/v1/events", token=nobody), 403, "PERMISSION_DENIED")
    scoped = await tenant.credential(["events:read"], queue_scope=[q["id"]])
    assert_error(await tenant.get("/v1/events", token=scoped), 403, "PERMISSION_DENIED")
    reader = await tenant.credential(["events:read"])
    ok(await tenant.get("/v1/events", token=reader))


async def test_retention_prunes_the_oldest_and_an_older_cursor_expires(tenant):
    q = await tenant.create_queue()
    await submit(tenant, q["id"], 6)
    await number(tenant)
    items, cursor = await drain_feed(tenant)
    assert len(items) == 7
    await event_service.prune(tenant.db, retention=timedelta(days=7), max_rows=3)
    left, _ = await drain_feed(tenant, after=str(int(cursor) - 3))
    assert [e["seq"] for e in left] == [str(int(cursor) - 2), str(int(cursor) - 1), cursor]
    gone = assert_error(await tenant.get("/v1/events", params={"after": "1"}), 410, "CURSOR_EXPIRED")
    assert gone["details"]["pruned_through"] == str(int(cursor) - 3)
    await event_service.prune(tenant.db, retention=timedelta(seconds=0), max_rows=10_000)
    assert (await feed(tenant, after=cursor))["items"] == []
    assert_error(await tenant.get("/v1/events", params={"after": str(int(cursor) - 1)}), 410, "CURSOR_EXPIRED")


async def test_the_sdk_follows_the_feed_on_both_clients(tenant, base):
    import orbit

    q = await tenant.create_queue()
    ids = await submit(tenant, q["id"], 3)
    await number(tenant)
    def sync_side() -> None:  # the blocking client runs beside the server's event loop
        with orbit.Client(base, token=tenant.token) as client:
            seen = []
            for event in client.events(types=["task.submitted"], wait_ms=200):
                seen.append(event)
                if len(seen) == 3:
                    break
            assert [e.resource_id for e in seen] == ids and all(isinstance(e.seq, int) for e in seen)
            page = client.events_page(after=seen[-1].seq)
            assert all(e.seq > seen[-1].seq for e in page.items)
            with pytest.raises(ValueError):
                client.events(after="-1")

    await asyncio.to_thread(sync_side)
    async with orbit.AsyncClient(base, token=tenant.token) as aclient:
        got = []
        async for event in aclient.events(types=["task.submitted"], wait_ms=200):
            got.append(event.resource_id)
            if len(got) == 3:
                break
        assert got == ids


async def test_tail_starts_at_the_newest_events_and_follows_on(tenant):
    q = await tenant.create_queue()
    ids = await submit(tenant, q["id"], 9)
    await number(tenant)
    page = await feed(tenant, tail="true", limit=3)
    assert [e["resource_id"] for e in page["items"]] == ids[-3:]
    assert page["next_after"] == "10"  # queue.created + 9 submits
    more = await submit(tenant, q["id"], 2)
    await number(tenant)
    after = await feed(tenant, after=page["next_after"])
    assert [e["resource_id"] for e in after["items"]] == more
    only_queues = await feed(tenant, tail="true", limit=3, type="queue.*")
    assert only_queues["items"] == [] and only_queues["next_after"] == "12"  # the newest seqs hold no queue event
    empty = await make_tenant(tenant.db, tenant.http)
    assert ok(await empty.get("/v1/events", params={"tail": "true"})) == {"items": [], "next_after": "0"}
