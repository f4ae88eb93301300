"""Application quotas: read and configure, and the application's pause."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from orbit.server.core.ids import new_id
from orbit.server.store.tx import Stmt
from tests.support.history import max_overlap

from .conftest import make_tenant
from .queue_helpers import assert_error, audit_rows, event_rows, ok
from .test_worker_protocol import submit
from .worker_client import Worker

pytestmark = pytest.mark.anyio

FIELDS = {"id", "name", "paused", "max_concurrency", "rate_per_second", "max_unfinished_tasks", "unfinished_tasks",
          "in_flight", "revision", "created_at", "updated_at"}


def app_path(tenant, suffix: str = "") -> str:
    return f"/v1/applications/{tenant.application['id']}{suffix}"


def quotas(revision: str, **overrides):
    body = {"expected_revision": revision, "reason": "capacity plan", "paused": False, "max_concurrency": 50,
            "rate_per_second": 500, "max_unfinished_tasks": 5000}
    body.update(overrides)
    return body


async def test_an_application_reads_with_its_defaults_and_live_usage(tenant):
    app = ok(await tenant.get(app_path(tenant)))
    assert set(app) == FIELDS
    assert (app["paused"], app["max_concurrency"], app["rate_per_second"], app["max_unfinished_tasks"]) == \
        (False, 1_000_000, 10_000_000, 100_000_000)
    assert (app["unfinished_tasks"], app["in_flight"], app["revision"]) == ("0", "0", "1")
    q = await tenant.create_queue()
    await submit(tenant, q["id"], 2)
    assert ok(await tenant.get(app_path(tenant)))["unfinished_tasks"] == "2"


async def test_only_the_credentials_own_application_is_visible(tenant, db, http):
    other = await make_tenant(db, http)
    for path in (f"/v1/applications/{other.application['id']}", f"/v1/applications/{new_id()}",
                 "/v1/applications/not-an-id", f"/v1/applications/{tenant.application['id'].upper()}"):
        assert_error(await tenant.get(path), 404, "NOT_FOUND")
        assert_error(await tenant.post(path + ":configure", quotas("1")), 404, "NOT_FOUND")
    assert ok(await other.get(app_path(other)))["id"] == other.application["id"]


async def test_permissions(tenant):
    reader = await tenant.credential(["applications:read"])
    nobody = await tenant.credential(["queues:read"])
    ok(await tenant.get(app_path(tenant), token=reader))
    assert_error(await tenant.get(app_path(tenant), token=nobody), 403, "PERMISSION_DENIED")
    assert_error(await tenant.post(app_path(tenant, ":configure"), quotas("1"), token=reader), 403,
                 "PERMISSION_DENIED")


async def test_configure_replaces_every_quota_once_per_key(tenant, db):
    key = tenant.key()
    r = ok(await tenant.post(app_path(tenant, ":configure"), quotas("1"), key=key))
    assert r["deduplicated"] is False
    app = r["application"]
    assert (app["max_concurrency"], app["rate_per_second"], app["max_unfinished_tasks"], app["revision"]) == \
        (50, 500, 5000, "2")
    assert ok(await tenant.get(app_path(tenant))) == app
    again = ok(await tenant.post(app_path(tenant, ":configure"), quotas("1"), key=key))
    assert again == {"deduplicated": True, "application": app}
    assert_error(await tenant.post(app_path(tenant, ":configure"), quotas("1", max_concurrency=7), key=key), 409,
                 "IDEMPOTENCY_CONFLICT")
    stale = assert_error(await tenant.post(app_path(tenant, ":configure"), quotas("1")), 409, "STATE_CONFLICT")
    assert stale["details"]["current_revision"] == "2"
    (audit,) = [a for a in await audit_rows(db, tenant.application["id"]) if a["action"] != "application.create"]
    assert (audit["action"], audit["reason"], audit["idempotency_key"]) == ("application.configure", "capacity plan",
                                                                            key)
    assert orjson.loads(audit["after"])["revision"] == "2" and orjson.loads(audit["before"])["revision"] == "1"
    (event,) = await event_rows(db, tenant.application["id"])
    assert event["type"] == "application.configured" and event["namespace_id"] == tenant.namespace_id


@pytest.mark.parametrize("field, value", [
    ("max_concurrency", 0), ("max_concurrency", 1_000_001), ("rate_per_second", 0),
    ("rate_per_second", 10_000_001), ("max_unfinished_tasks", 0), ("max_unfinished_tasks", 100_000_001),
    ("max_concurrency", 5.0), ("max_concurrency", "5"), ("paused", None), ("paused", "false"),
    ("expected_revision", 1), ("reason", "  "),
])
async def test_configure_refuses_bad_quotas_and_changes_nothing(tenant, db, field, value):
    r = await tenant.post(app_path(tenant, ":configure"), quotas("1", **{field: value}))
    assert_error(r, 400, "INVALID_ARGUMENT", field)
    assert ok(await tenant.get(app_path(tenant)))["revision"] == "1"
    assert [a["action"] for a in await audit_rows(db, tenant.application["id"])] == ["application.create"]


async def test_every_quota_is_required(tenant):
    for field in ("paused", "max_concurrency", "rate_per_second", "max_unfinished_tasks", "reason"):
        body = quotas("1")
        del body[field]
        assert_error(await tenant.post(app_path(tenant, ":configure"), body), 400, "INVALID_ARGUMENT", field)


async def test_an_application_pause_stops_claims_and_starts_in_every_queue(tenant, base):
    q1, q2 = await tenant.create_queue(), await tenant.create_queue()
    await submit(tenant, q1["id"], 2)
    await submit(tenant, q2["id"], 1)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q1["id"], q2["id"])
        leased = (await w.call("claim", queue_id=q1["id"], max_tasks=1))["tasks"]
        assert len(leased) == 1
        ok(await tenant.post(app_path(tenant, ":configure"), quotas("1", paused=True)))
        assert (await w.call("claim", queue_id=q1["id"], max_tasks=5))["tasks"] == []
        assert (await w.call("claim", queue_id=q2["id"], max_tasks=5))["tasks"] == []
        refused = await w.call("start", lease_id=leased[0]["lease_id"])
        assert refused["error"]["code"] == "QUEUE_PAUSED" and refused["error"]["retry_after_ms"] > 0
        ok(await tenant.post(app_path(tenant, ":configure"), quotas("2", paused=False)))
        assert (await w.call("start", lease_id=leased[0]["lease_id"]))["ok"]
        assert len((await w.call("claim", queue_id=q2["id"], max_tasks=5))["tasks"]) == 1


async def _configure(tenant, revision: str, **quota) -> dict:
    return ok(await tenant.post(app_path(tenant, ":configure"), quotas(revision, **quota)))["application"]


async def test_the_applications_concurrency_is_shared_by_its_queues(tenant, base):
    """The issue's case: max_concurrency=1 across queues; one claim gets one lease, not four."""
    await _configure(tenant, "1", max_concurrency=2, rate_per_second=1000)
    q1, q2 = await tenant.create_queue(max_concurrency=10), await tenant.create_queue(max_concurrency=10)
    await submit(tenant, q1["id"], 4)
    await submit(tenant, q2["id"], 4)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q1["id"], q2["id"])
        first = (await w.call("claim", queue_id=q1["id"], max_tasks=4))["tasks"]
        assert len(first) == 2
        assert (await w.call("claim", queue_id=q2["id"], max_tasks=4))["tasks"] == []
        assert ok(await tenant.get(app_path(tenant)))["in_flight"] == "2"
        assert (await w.call("start", lease_id=first[0]["lease_id"]))["ok"]
        assert (await w.call("complete", lease_id=first[0]["lease_id"], outcome="succeeded"))["ok"]
        assert (await w.call("release", lease_id=first[1]["lease_id"]))["ok"]
        second = (await w.call("claim", queue_id=q2["id"], max_tasks=4))["tasks"]
        assert len(second) == 2 and {t["queue_id"] for t in second} == {q2["id"]}


async def test_the_applications_rate_window_bounds_claims_and_starts(tenant, base):
    await _configure(tenant, "1", rate_per_second=2)
    q1, q2 = await tenant.create_queue(rate_per_second=100), await tenant.create_queue(rate_per_second=100)
    await submit(tenant, q1["id"], 3)
    await submit(tenant, q2["id"], 3)
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q1["id"], q2["id"])
        a = (await w.call("claim", queue_id=q1["id"], max_tasks=3))["tasks"]
        b = (await w.call("claim", queue_id=q2["id"], max_tasks=3))["tasks"]
        assert (len(a), len(b)) == (2, 0)  # two Starts reserved in the application's window
        await _configure(tenant, "2", rate_per_second=1)
        assert (await w.call("start", lease_id=a[0]["lease_id"]))["ok"]
        refused = await w.call("start", lease_id=a[1]["lease_id"])
        assert refused["error"]["code"] == "RATE_LIMITED" and 0 < refused["error"]["retry_after_ms"] <= 1000
        assert "application" in refused["error"]["message"]
        await asyncio.sleep(refused["error"]["retry_after_ms"] / 1000 + 0.05)
        assert (await w.call("start", lease_id=a[1]["lease_id"]))["ok"]


async def test_stored_leases_never_overlap_beyond_the_applications_concurrency(tenant, base, db):
    await _configure(tenant, "1", max_concurrency=3, rate_per_second=1000)
    queues = [await tenant.create_queue(max_concurrency=3) for _ in range(3)]
    for q in queues:
        await submit(tenant, q["id"], 6)
    async with Worker.connect(base, tenant.token) as w1, Worker.connect(base, tenant.token) as w2:
        ids = [q["id"] for q in queues]
        await w1.hello(*ids)
        await w2.hello(*ids)

        done = [0]
        deadline = asyncio.get_running_loop().time() + 30

        async def drain(w, order):
            while done[0] < 18 and asyncio.get_running_loop().time() < deadline:
                for qid in order:
                    for t in (await w.call("claim", queue_id=qid, max_tasks=2, wait_ms=100))["tasks"]:
                        assert (await w.call("start", lease_id=t["lease_id"]))["ok"]
                        await asyncio.sleep(0.005)
                        assert (await w.call("complete", lease_id=t["lease_id"], outcome="succeeded"))["ok"]
                        done[0] += 1

        await asyncio.gather(drain(w1, ids), drain(w2, ids[::-1]))
        assert done[0] == 18

    async def intervals(tx):
        rows = await tx.rows(Stmt("SELECT leased_at, ended_at FROM leases WHERE application_id = ?",
                                  (tenant.application["id"],)))
        return [(r["leased_at"], r["ended_at"]) for r in rows]

    spans = await db.read(intervals)
    assert len(spans) == 18 and max_overlap(spans) <= 3
