"""A claim planned on a snapshot leases from just after the latest permit its queue gave back.

A permit given back at a database time at or after the claim's clock (a report committed through
another connection meanwhile) must not let the new lease's stored interval overlap the old one:
the lease is moved to one microsecond after it, and the claim's reply says so. On MySQL the
move travels with the COMMIT (`usage.note_freed`, `leases.retime_after_freed`); elsewhere the
usage rows are read under the lock first. Here the later give-back is simulated by a
`permits_freed_at` ahead of the clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from orbit.server.store.tx import Stmt

from .worker_client import Worker

pytestmark = pytest.mark.anyio


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=None)


async def _rows(db, sql: str, *params):
    return await db.read(lambda tx: tx.rows(Stmt(sql, params)))


async def _write(db, sql: str, *params) -> None:
    await db.transaction(lambda tx: tx.count(Stmt(sql, params)))


@pytest.mark.parametrize("layer", ["queue", "application"])
async def test_a_claim_leases_just_after_a_permit_given_back_after_its_clock(tenant, base, db, layer):
    q = await tenant.create_queue(max_concurrency=5)
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1})
    assert r.status_code == 201, r.text
    (now,) = await _rows(db, "SELECT {NOW} AS db_now")
    later = now["db_now"].replace(tzinfo=None) + timedelta(seconds=5)
    if layer == "queue":
        await _write(db, "UPDATE queue_usage SET permits_freed_at = ? WHERE queue_id = ?", later, q["id"])
    else:
        await _write(db, "UPDATE application_usage SET permits_freed_at = ? WHERE application_id = ?",
                     later, tenant.application["id"])
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        reply = await w.call("claim", queue_id=q["id"], max_tasks=1, lease_ms=30_000)
    assert reply["ok"], reply
    (lease,) = reply["tasks"]
    (row,) = await _rows(db, "SELECT leased_at, expires_at FROM leases WHERE id = ?", lease["lease_id"])
    after = later + timedelta(microseconds=1)
    assert row["leased_at"].replace(tzinfo=None) == after
    assert row["expires_at"].replace(tzinfo=None) == after + timedelta(seconds=30)
    assert _ts(lease["lease_expires_at"]) == after + timedelta(seconds=30)


async def test_a_claim_after_every_give_back_keeps_its_own_clock(tenant, base, db):
    q = await tenant.create_queue(max_concurrency=5)
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1})
    assert r.status_code == 201, r.text
    (now,) = await _rows(db, "SELECT {NOW} AS db_now")
    earlier = now["db_now"].replace(tzinfo=None) - timedelta(seconds=5)
    await _write(db, "UPDATE queue_usage SET permits_freed_at = ? WHERE queue_id = ?", earlier, q["id"])
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        reply = await w.call("claim", queue_id=q["id"], max_tasks=1, lease_ms=30_000)
    (lease,) = reply["tasks"]
    (row,) = await _rows(db, "SELECT leased_at, expires_at FROM leases WHERE id = ?", lease["lease_id"])
    assert row["leased_at"].replace(tzinfo=None) > earlier + timedelta(seconds=4)
    assert row["expires_at"] - row["leased_at"] == timedelta(seconds=30)
    assert _ts(lease["lease_expires_at"]) == row["expires_at"].replace(tzinfo=None)
