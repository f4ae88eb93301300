"""What travels together to MariaDB: a read's independent statements go in one round trip, and
a Start planned on unlocked reads reads the clock with its queues' usage, after the locks,
rather than with a statement of its own."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from orbit.server.store.dialect import MYSQL
from orbit.server.store.tx import Stmt, Tx

from .worker_client import Worker

pytestmark = pytest.mark.anyio


@pytest.fixture
def trips(monkeypatch) -> list[list[str]]:
    """The statements of every multi-statement round trip, in order."""
    sent: list[list[str]] = []
    real = Tx._run_mysql

    async def spy(self, statements):
        sent.append([*self._deferred, *statements])
        return await real(self, statements)

    monkeypatch.setattr(Tx, "_run_mysql", spy)
    return sent


async def test_a_read_sends_its_statements_in_one_round_trip(db, trips):
    rows = await db.read(lambda tx: tx.rows_multi([Stmt("SELECT 1 AS one"), Stmt("SELECT ? AS two", [2]),
                                                   Stmt("SELECT 3 AS three")]))
    assert rows == [[{"one": 1}], [{"two": 2}], [{"three": 3}]]
    if db.dialect == MYSQL:
        assert len(trips) == 1 and len(trips[0]) == 3
    else:
        assert trips == []


async def test_a_start_reads_the_clock_with_the_usage_after_the_locks(tenant, base, db, trips):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        r = await http.post(f"/v1/queues/{q['id']}/tasks", json={"payload": {"n": 1}},
                            headers=tenant.headers(None, tenant.key()))
        assert r.status_code == 201, r.text
        (lease,) = (await w.call("claim", id="c-1", queue_id=q["id"], max_tasks=1))["tasks"]
        del trips[:]
        started = await w.call("start", lease_id=lease["lease_id"])
        assert started["ok"] and started["attempt"] == 1
    if db.dialect != MYSQL:
        return
    # Background work (the event sequencer) may share the spy; keep the Start's own trips.
    locking = [t for t in trips if any("FOR UPDATE" in s and "tasks" in s for s in t)]
    assert locking, trips
    first = locking[0]
    assert not any(s.strip() == "SELECT NOW(6) AS db_now" for s in first), first
    # Locks first (tasks, then leases), then the usage with the clock.
    assert "FOR UPDATE" in first[0] and "FOR UPDATE" in first[1] and "AS db_now" in first[-1]


async def test_a_submit_serving_a_waiting_claim_writes_the_task_and_its_lease_first(tenant, base, db, trips):
    """The claim hears its lease once the writes are made, as the COMMIT goes out alone, and its
    Start may reach the database before the COMMIT: the rows it locks lead the writes, so its
    reads wait for them. The usage rows are written once each."""
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        claim = asyncio.create_task(w.call("claim", id="c-first", queue_id=q["id"], max_tasks=1, wait_ms=5000))
        await asyncio.sleep(0.3)
        del trips[:]
        r = await http.post(f"/v1/queues/{q['id']}/tasks", json={"payload": {"n": 1}},
                            headers=tenant.headers(None, tenant.key()))
        assert r.status_code == 201, r.text
        assert (await asyncio.wait_for(claim, 5))["tasks"]
    if db.dialect != MYSQL:
        return
    # The writes go alone, then the COMMIT: the claim is answered in between.
    (i,) = [i for i, t in enumerate(trips) if any(s.startswith("INSERT INTO leases") for s in t)]
    commit = trips[i]
    assert commit[-1] != "COMMIT" and trips[i + 1] == ["COMMIT"], trips[i:i + 2]
    assert commit[0].startswith("INSERT INTO tasks ") and commit[1].startswith("INSERT INTO leases "), commit
    # Each usage row takes its backlog slot and its permit in one UPDATE.
    for table in ("queue_usage", "application_usage"):
        (update,) = [s for s in commit if s.startswith(f"UPDATE {table} ")]
        assert "unfinished = CASE" in update and "permits_in_use = CASE" in update, update
