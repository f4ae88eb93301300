"""A value the database refuses inside a grouped worker command is that command's INVALID_ARGUMENT,
never UNAVAILABLE (which tells a worker to resend forever), and the other commands of its group
still succeed. On both backends, against a real server."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from orbit.server import batching
from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.errors import ValueRefused
from orbit.server.services import dispatch

from .test_worker_protocol import submit, task
from .worker_client import Worker, serve

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def _no_shedding(monkeypatch):
    """Commands are held back on purpose to meet in one group: not shed for waiting meanwhile."""
    monkeypatch.setattr(batching, "MAX_QUEUED_S", 120.0)

POISON = {"refused": "by the database"}
MIB = 1024 * 1024


@pytest.fixture
async def node(db, db_url):
    app = create_app(Settings(database_url=db_url, node_id="t", background_loops=False), db)
    async with serve(app) as url:
        yield url, app.state.node.hub


@contextlib.asynccontextmanager
async def one_group(committer, size: int):
    """Hold the group committer's transactions until `size` commands wait, so that they are
    served as one group (the first arrival may form a group of its own)."""
    slots = committer._slots
    held = 0
    while not slots.locked():
        await slots.acquire()
        held += 1
    try:
        yield
        for _ in range(500):
            if len(committer._pending) >= size:
                break
            await asyncio.sleep(0.01)
    finally:
        for _ in range(held):
            slots.release()


async def running_leases(tenant, base, queue_id, workers):
    leases = []
    for w in workers:
        [lease] = (await w.call("claim", queue_id=queue_id, max_tasks=1))["tasks"]
        assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        leases.append(lease)
    return leases


async def test_a_refused_value_fails_only_its_own_command_in_the_group(tenant, node, monkeypatch):
    """The database refuses one report's value (a data error) while it shares a transaction with
    other sessions' reports: that report is answered INVALID_ARGUMENT, the others succeed."""
    base, hub = node
    original = dispatch.complete
    groups: list[int] = []

    async def complete(db, commands):
        groups.append(len(commands))
        if any(c.result == POISON for c in commands):
            raise ValueRefused()  # what the store raises for a data error of the database
        return await original(db, commands)

    monkeypatch.setattr(dispatch, "complete", complete)
    q = await tenant.create_queue(max_concurrency=10)
    ids = await submit(tenant, q["id"], 4)
    async with contextlib.AsyncExitStack() as stack:
        workers = [await stack.enter_async_context(Worker.connect(base, tenant.token)) for _ in range(4)]
        for w in workers:
            await w.hello(q["id"])
        leases = await running_leases(tenant, base, q["id"], workers)
        results = [{"n": 0}, POISON, {"n": 2}, {"n": 3}]
        async with one_group(hub.completes, 3):
            calls = [asyncio.create_task(w.call("complete", lease_id=lease["lease_id"], outcome="succeeded",
                                                result=r))
                     for w, lease, r in zip(workers, leases, results)]
        replies = await asyncio.gather(*calls)
        assert max(groups) >= 3, groups  # the bad report did share a group with good ones
        bad = replies[1]
        assert bad["ok"] is False and bad["error"]["code"] == "INVALID_ARGUMENT", bad
        assert "retry_after_ms" not in bad["error"]
        assert [r["ok"] for i, r in enumerate(replies) if i != 1] == [True] * 3, replies
        states = [(await task(tenant, i))["state"] for i in ids]
        assert states == ["SUCCEEDED", "RUNNING", "SUCCEEDED", "SUCCEEDED"], states
        # The refused report changed nothing: a good one for the same lease is taken.
        again = await workers[1].call("complete", lease_id=leases[1]["lease_id"], outcome="succeeded", result=None)
        assert again["ok"] and again["task_state"] == "SUCCEEDED", again


async def test_reports_too_large_to_commit_together_each_succeed(tenant, node):
    """Reports whose results together exceed what one round trip to the database may carry
    (MariaDB's max_allowed_packet, 16 MiB by default) are not refused for it: each succeeds."""
    base, hub = node
    n = 20
    q = await tenant.create_queue(max_concurrency=n)
    ids = await submit(tenant, q["id"], n)
    async with contextlib.AsyncExitStack() as stack:
        workers = [await stack.enter_async_context(Worker.connect(base, tenant.token)) for _ in range(n)]
        for w in workers:
            await w.hello(q["id"])
        leases = await running_leases(tenant, base, q["id"], workers)
        big = "r" * (MIB - 1000)
        async with one_group(hub.completes, n - 1):
            calls = [asyncio.create_task(w.call("complete", lease_id=lease["lease_id"], outcome="succeeded",
                                                result=[i, big]))
                     for i, (w, lease) in enumerate(zip(workers, leases))]
        replies = await asyncio.gather(*calls)
    assert [r.get("task_state") or r["error"] for r in replies] == ["SUCCEEDED"] * n
    t = await task(tenant, ids[7])
    assert t["result"] == [7, big]


async def test_late_reports_never_outgrow_what_the_lease_can_store(tenant, node):
    """Late evidence is kept within a byte budget: reports with large results for a lease that
    expired are answered LEASE_LOST however many arrive, never refused by the database."""
    base, _ = node
    q = await tenant.create_queue(max_concurrency=1)
    [task_id] = await submit(tenant, q["id"], 1)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        [lease] = (await w.call("claim", queue_id=q["id"], max_tasks=1, lease_ms=1000))["tasks"]
        assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        await asyncio.sleep(1.1)
        big = "l" * (MIB - 1000)
        for i in range(20):
            r = await w.call("complete", lease_id=lease["lease_id"], outcome="succeeded", result=[i, big])
            assert r["ok"] is False and r["error"]["code"] == "LEASE_LOST", (i, r)
    attempts = (await tenant.get(f"/v1/tasks/{task_id}/attempts")).json()["data"]["items"]
    late = attempts[0]["late_reports"]
    assert len(late) == 20 and late[0]["result"] == [0, big] and "result_omitted" not in late[0]
    assert all(r["result_omitted"] is True and "result" not in r for r in late[1:]), late[1]
    assert [r["outcome"] for r in late] == ["succeeded"] * 20
