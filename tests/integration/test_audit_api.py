"""The audit log: `GET /v1/audit-records` over HTTP and through both SDK
clients, on SQLite and MariaDB. Every management write of the API, and orbit-admin's credential
issue and revoke, shows up with its actor, request, key, reason and snapshots."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection

from orbit import APIError, AsyncClient, AuditRecord, Client
from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.core.ids import new_id
from orbit.server.core.permissions import ALL_PERMISSIONS
from orbit.server.services import dispatch, tenancy

from .conftest import make_tenant
from .queue_helpers import HEX32, TIMESTAMP, assert_error, envelope, ok, unique_name
from .test_openapi import CHECKS, FUZZ, cases, checks_after_send, fetch_openapi, negative_parts, send
from .worker_client import Worker, serve

pytestmark = pytest.mark.anyio

BASE = "/v1/audit-records"
FIELDS = {"id", "time", "actor_credential_id", "actor", "action", "resource_type", "resource_id", "reason",
          "request_id", "idempotency_key", "before", "after"}


# ---------------------------------------------------------------- helpers


async def records(tenant, token: str | None = None, **params: Any) -> dict[str, Any]:
    page = ok(await tenant.get(BASE, token=token, params={k: v for k, v in params.items() if v is not None}))
    assert set(page) == {"items", "next_after"}, page
    for r in page["items"]:
        assert_record(r)
    return page


async def every_record(tenant, **params: Any) -> list[dict[str, Any]]:
    return (await records(tenant, limit=1000, **params))["items"]


def assert_record(r: dict[str, Any]) -> None:
    """Every field of an audit record, with its wire types."""
    assert set(r) == FIELDS, sorted(r)
    assert HEX32.match(r["id"]) and HEX32.match(r["resource_id"]) and TIMESTAMP.match(r["time"]), r
    for f in ("actor_credential_id", "request_id"):
        assert r[f] is None or HEX32.match(r[f]), (f, r[f])
    for f in ("actor", "reason", "idempotency_key"):
        assert r[f] is None or isinstance(r[f], str), (f, r[f])
    assert isinstance(r["action"], str) and isinstance(r["resource_type"], str)
    assert (r["actor_credential_id"] is None) != (r["actor"] is None), r  # a credential or orbit-admin
    for f in ("before", "after"):
        assert r[f] is None or isinstance(r[f], dict), (f, r[f])


async def write(tenant, path: str, body: dict[str, Any], status: int = 200) -> tuple[dict[str, Any], str, str]:
    """POST a write; return its data, its idempotency key and its request id."""
    key = tenant.key()
    r = await tenant.post(path, body, key=key)
    return ok(r, status), key, r.headers["x-request-id"]


def revision_body(obj: dict[str, Any], reason: str, **fields: Any) -> dict[str, Any]:
    return {"expected_revision": obj["revision"], "reason": reason, **fields}


# ---------------------------------------------------------------- what is recorded


async def test_every_management_write_is_recorded_with_its_request_and_snapshots(tenant):
    """Queue create/configure/retire, task cancel, application configure, resource key and schedule
    writes: one record each, oldest first, with the credential, the request id, the key, the reason
    and the snapshots before and after; submits are not management operations."""
    writes: list[tuple[str, str, str, str]] = []  # action, resource id, key, request id

    data, key, rid = await write(tenant, "/v1/queues", {"name": unique_name(), "max_concurrency": 4,
                                                        "rate_per_second": 10}, 201)
    q = data["queue"]
    writes.append(("queue.create", q["id"], key, rid))
    data, key, rid = await write(tenant, f"/v1/queues/{q['id']}:configure", revision_body(
        q, "slow down", paused=True, max_concurrency=2, rate_per_second=5, max_unfinished_tasks=50))
    q2 = data["queue"]
    writes.append(("queue.configure", q["id"], key, rid))
    task = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": {"secret": "not in audit"}}), 201)["task"]
    data, key, rid = await write(tenant, f"/v1/tasks/{task['id']}:cancel", {"reason": "wrong input"})
    writes.append(("task.cancel", task["id"], key, rid))

    data, key, rid = await write(tenant, "/v1/resource-keys", {"name": unique_name("rk"), "max_concurrency": 3}, 201)
    rk = data["resource_key"]
    writes.append(("resource_key.create", rk["id"], key, rid))
    data, key, rid = await write(tenant, f"/v1/resource-keys/{rk['id']}:configure",
                                 revision_body(rk, "more room", max_concurrency=6))
    writes.append(("resource_key.configure", rk["id"], key, rid))
    data, key, rid = await write(tenant, f"/v1/resource-keys/{rk['id']}:retire",
                                 revision_body(data["resource_key"], "unused"))
    writes.append(("resource_key.retire", rk["id"], key, rid))

    data, key, rid = await write(tenant, "/v1/schedules", {
        "name": unique_name("sched"), "queue_id": q["id"], "interval_seconds": 86400, "paused": True,
        "task": {"payload": {"report": "nightly"}}}, 201)
    s = data["schedule"]
    writes.append(("schedule.create", s["id"], key, rid))
    data, key, rid = await write(tenant, f"/v1/schedules/{s['id']}:configure", revision_body(
        s, "weekly now", paused=True, interval_seconds=7 * 86400, task={"payload": {"report": "weekly"}}))
    writes.append(("schedule.configure", s["id"], key, rid))
    data, key, rid = await write(tenant, f"/v1/schedules/{s['id']}:retire", revision_body(data["schedule"], "gone"))
    writes.append(("schedule.retire", s["id"], key, rid))

    app = ok(await tenant.get(f"/v1/applications/{tenant.application['id']}"))
    data, key, rid = await write(tenant, f"/v1/applications/{app['id']}:configure", revision_body(
        app, "capacity plan", paused=False, max_concurrency=50, rate_per_second=500, max_unfinished_tasks=5000))
    writes.append(("application.configure", app["id"], key, rid))
    data, key, rid = await write(tenant, f"/v1/queues/{q['id']}:retire", revision_body(q2, "decommissioned"))
    writes.append(("queue.retire", q["id"], key, rid))

    found = await every_record(tenant)
    assert [r["id"] for r in found] == sorted(r["id"] for r in found)  # oldest first
    # The tenant's own setup comes first: its namespace and its credential, written by orbit-admin.
    setup = [(r["action"], r["actor"]) for r in found[: len(found) - len(writes)]]
    assert setup == [("namespace.create", "orbit-admin"), ("credential.issue", "orbit-admin")]
    api = found[len(found) - len(writes):]
    assert [(r["action"], r["resource_id"], r["idempotency_key"], r["request_id"]) for r in api] == writes
    for r in api:
        assert (r["actor_credential_id"], r["actor"]) == (tenant.credential_id, None)
        assert r["resource_type"] == r["action"].split(".")[0]
        assert r["after"]["id"] == r["resource_id"]
    by_action = {r["action"]: r for r in api}

    created = by_action["queue.create"]
    assert created["before"] is None and created["after"] == q and created["reason"] is None
    configured = by_action["queue.configure"]
    assert configured["reason"] == "slow down"
    assert (configured["before"]["paused"], configured["before"]["revision"]) == (False, "1")
    assert configured["after"] == {**q2, "unfinished_tasks": configured["after"]["unfinished_tasks"]}
    assert (configured["after"]["paused"], configured["after"]["max_concurrency"]) == (True, 2)
    retired = by_action["queue.retire"]
    assert retired["before"]["retired_at"] is None and TIMESTAMP.match(retired["after"]["retired_at"])

    cancelled = by_action["task.cancel"]
    assert cancelled["reason"] == "wrong input"
    assert (cancelled["before"]["state"], cancelled["after"]["state"]) == ("WAITING", "CANCELLED")
    assert "not in audit" not in str(cancelled)  # task snapshots leave the payload out

    assert by_action["resource_key.configure"]["before"]["max_concurrency"] == 3
    assert by_action["resource_key.configure"]["after"]["max_concurrency"] == 6
    assert by_action["resource_key.retire"]["reason"] == "unused"
    assert by_action["resource_key.retire"]["after"]["retired_at"] is not None
    assert by_action["schedule.configure"]["before"]["interval_seconds"] == 86400
    assert by_action["schedule.configure"]["after"]["interval_seconds"] == 7 * 86400
    assert by_action["schedule.retire"]["after"]["retired_at"] is not None
    quotas = by_action["application.configure"]
    assert (quotas["reason"], quotas["before"]["revision"], quotas["after"]["revision"]) == ("capacity plan", "1", "2")
    assert quotas["after"]["max_concurrency"] == 50


async def test_a_replayed_or_refused_write_adds_no_record(tenant):
    body = {"name": unique_name(), "max_concurrency": 4, "rate_per_second": 10}
    key = tenant.key()
    q = ok(await tenant.post("/v1/queues", body, key=key), 201)["queue"]
    ok(await tenant.post("/v1/queues", body, key=key), 200)  # replay
    assert_error(await tenant.post(f"/v1/queues/{q['id']}:retire", {"expected_revision": "7", "reason": "x"}),
                 409, "STATE_CONFLICT")
    assert [r["action"] for r in await every_record(tenant, resource_id=q["id"])] == ["queue.create"]


async def test_a_review_is_recorded_with_its_resolution(tenant, db, app):
    q = await tenant.create_queue()
    task = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1, "max_attempts": 2}), 201)["task"]
    async with serve(app) as base:
        async with Worker.connect(base, tenant.token) as w:
            await w.hello(q["id"])
            (lease,) = (await w.call("claim", queue_id=q["id"], max_tasks=1, lease_ms=1000))["tasks"]
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        await asyncio.sleep(1.1)  # the lease of the RUNNING attempt expires: NEEDS_REVIEW
        for _ in range(20):  # recovery spans the shared test database, in batches
            if await dispatch.recover_expired_leases(db) == 0:
                break
        data, key, rid = await write(tenant, f"/v1/tasks/{task['id']}:review",
                                     {"resolution": "SUCCEEDED", "reason": "checked the ledger",
                                      "evidence": {"ledger": "row 7"}})
        (r,) = await every_record(tenant, resource_id=task["id"], action="task.review")
    assert (r["reason"], r["idempotency_key"], r["request_id"]) == ("checked the ledger", key, rid)
    assert (r["before"]["state"], r["after"]["state"]) == ("NEEDS_REVIEW", "SUCCEEDED")
    assert (r["after"]["resolution"], r["after"]["evidence"]) == ("SUCCEEDED", {"ledger": "row 7"})


async def test_credential_issue_and_revoke_are_recorded_without_secrets(tenant, db):
    """What orbit-admin does in-process (the CLI itself is tested in tests/e2e/test_credentials.py)."""
    q = await tenant.create_queue()

    async def issue(tx):
        return await tenancy.issue_credential(tx, application=tenant.application, namespace=tenant.namespace,
                                              permissions=["queues:read"], queue_scope=[q["id"]], label="ci")

    issued = await db.transaction(issue)
    assert await db.transaction(lambda tx: tenancy.revoke_credential(tx, issued.credential_id, "rotated"))
    assert not await db.transaction(lambda tx: tenancy.revoke_credential(tx, issued.credential_id, "again"))

    found = await every_record(tenant, resource_id=issued.credential_id)
    assert [r["action"] for r in found] == ["credential.issue", "credential.revoke"]
    for r in found:
        assert (r["actor"], r["actor_credential_id"], r["resource_type"]) == ("orbit-admin", None, "credential")
        assert (r["request_id"], r["idempotency_key"]) == (None, None)
        text = str(r)
        assert issued.token not in text and issued.token.split("_", 2)[2] not in text
        assert "secret" not in text and "hash" not in text
    issue_rec, revoke_rec = found
    snapshot = {"id": issued.credential_id, "application_id": tenant.application["id"],
                "namespace_id": tenant.namespace_id, "permissions": ["queues:read"], "queue_scope": [q["id"]],
                "label": "ci", "revoked_at": None, "revoke_reason": None}
    assert issue_rec["before"] is None and issue_rec["reason"] is None
    assert {k: v for k, v in issue_rec["after"].items() if k != "created_at"} == snapshot
    assert revoke_rec["reason"] == "rotated"
    assert revoke_rec["before"] == issue_rec["after"]
    assert revoke_rec["after"] == {**issue_rec["after"], "revoked_at": revoke_rec["after"]["revoked_at"],
                                   "revoke_reason": "rotated"}
    assert TIMESTAMP.match(revoke_rec["after"]["revoked_at"])


# ---------------------------------------------------------------- filters and paging


async def test_filters_and_paging_after_the_last_id(tenant):
    qs = [await tenant.create_queue() for _ in range(3)]
    for q in qs[:2]:
        ok(await tenant.post(f"/v1/queues/{q['id']}:configure", revision_body(
            q, "tune", paused=False, max_concurrency=3, rate_per_second=7, max_unfinished_tasks=9)))
    everything = await every_record(tenant)
    assert [r["action"] for r in everything] == ["namespace.create", "credential.issue", *["queue.create"] * 3,
                                                 *["queue.configure"] * 2]

    one = await every_record(tenant, resource_id=qs[0]["id"])
    assert [(r["action"], r["resource_id"]) for r in one] == [("queue.create", qs[0]["id"]),
                                                              ("queue.configure", qs[0]["id"])]
    configures = await every_record(tenant, action="queue.configure")
    assert [r["resource_id"] for r in configures] == [qs[0]["id"], qs[1]["id"]]
    both = await every_record(tenant, resource_id=qs[1]["id"], action="queue.configure")
    assert [r["id"] for r in both] == [configures[1]["id"]]
    assert await every_record(tenant, resource_id=qs[2]["id"], action="queue.configure") == []
    assert await every_record(tenant, action="queue.retire") == []
    assert await every_record(tenant, resource_id=new_id()) == []

    seen, after = [], None
    while True:
        page = await records(tenant, limit=2, after=after)
        assert len(page["items"]) <= 2
        if not page["items"]:
            assert page["next_after"] == after  # nothing newer: resume from the same place
            break
        assert page["next_after"] == page["items"][-1]["id"]
        seen += page["items"]
        after = page["next_after"]
    assert seen == everything
    page = await records(tenant, action="queue.create", after=everything[2]["id"], limit=1)
    assert [r["id"] for r in page["items"]] == [everything[3]["id"]]
    assert (await records(tenant))["items"] == everything  # default limit 100
    assert await records(tenant, after="f" * 32) == {"items": [], "next_after": "f" * 32}
    empty = await make_tenant(tenant.db, tenant.http)
    assert (await records(empty, action="queue.create")) == {"items": [], "next_after": None}


async def test_a_record_that_commits_late_is_not_behind_a_cursor(tenant):
    """Records are read in commit order: a transaction whose record was made first (an earlier id)
    but commits after another one's still comes after a cursor already past that other record."""
    if tenant.db.dialect != "mysql":
        pytest.skip("concurrent writers: SQLite has a single one")
    from orbit.server.services.outbox import Actor, write_audit

    ns = tenant.namespace["id"]
    written, release = asyncio.Event(), asyncio.Event()
    slow_resource = new_id()

    async def slow(tx):
        await write_audit(tx, Actor(name="slow"), namespace_id=ns, action="queue.configure",
                          resource_type="queue", resource_id=slow_resource, reason="slow")
        written.set()
        await release.wait()

    late = asyncio.create_task(tenant.db.transaction(slow))
    await written.wait()
    q = await tenant.create_queue()  # its record has a later id, and commits first
    page = await records(tenant)
    cursor = page["next_after"]
    assert page["items"][-1]["resource_id"] == q["id"]
    assert slow_resource not in [r["resource_id"] for r in page["items"]]
    release.set()
    await late
    after = await records(tenant, after=cursor)
    assert [r["resource_id"] for r in after["items"]] == [slow_resource]
    assert after["items"][0]["id"] < cursor  # made first, read after


async def test_the_default_limit_is_100_and_the_maximum_1000(tenant):
    for _ in range(101):
        await tenant.create_queue()
    assert len((await records(tenant))["items"]) == 100
    assert len((await records(tenant, limit=1000))["items"]) == 103
    assert len((await records(tenant, limit=1))["items"]) == 1


async def test_another_namespaces_records_are_invisible(tenant, db, http):
    other = await make_tenant(db, http)
    theirs = await other.create_queue()
    mine = await tenant.create_queue()
    assert theirs["id"] not in {r["resource_id"] for r in await every_record(tenant)}
    assert await every_record(tenant, resource_id=theirs["id"]) == []
    assert [r["resource_id"] for r in await every_record(tenant, action="queue.create")] == [mine["id"]]
    assert [r["resource_id"] for r in await every_record(other, action="queue.create")] == [theirs["id"]]
    assert other.credential_id in {r["resource_id"] for r in await every_record(other)}
    assert other.credential_id not in {r["resource_id"] for r in await every_record(tenant)}


# ---------------------------------------------------------------- refusals


async def test_reading_needs_audit_read_and_the_all_queues_scope(tenant, http):
    q = await tenant.create_queue()
    reader = await tenant.credential(["audit:read"])
    everyone_else = await tenant.credential([p for p in ALL_PERMISSIONS if p != "audit:read"])
    narrow = await tenant.credential(["audit:read"], queue_scope=[q["id"]])
    assert (await records(tenant, token=reader))["items"]
    assert_error(await tenant.get(BASE, token=everyone_else), 403, "PERMISSION_DENIED")
    err = assert_error(await tenant.get(BASE, token=narrow), 403, "PERMISSION_DENIED")
    assert '"*"' in err["message"]
    assert_error(await http.get(BASE), 401, "UNAUTHENTICATED")
    assert_error(await http.get(BASE, params={"limit": "0"}, headers={"Authorization": "Bearer orb_nope"}), 401,
                 "UNAUTHENTICATED")  # the token is heard before the parameters


@pytest.mark.parametrize("params, field", [
    ({"resource_id": "not-an-id"}, "resource_id"),
    ({"resource_id": "A" * 32}, "resource_id"),
    ({"resource_id": "0" * 31}, "resource_id"),
    ({"resource_id": "0" * 32 + "\n"}, "resource_id"),
    ({"after": "xyz"}, "after"),
    ({"after": "0" * 33}, "after"),
    ({"after": ""}, "after"),
    ({"action": "queue"}, "action"),
    ({"action": "Queue.create"}, "action"),
    ({"action": "queue.create;"}, "action"),
    ({"action": "a." + "b" * 63}, "action"),
    ({"action": ""}, "action"),
    ({"limit": "0"}, "limit"),
    ({"limit": "1001"}, "limit"),
    ({"limit": "1.5"}, "limit"),
    ({"limit": "ten"}, "limit"),
])
async def test_invalid_parameters_are_400(tenant, params, field):
    assert_error(await tenant.get(BASE, params=params), 400, "INVALID_ARGUMENT", field)


async def test_a_credential_without_audit_read_hears_403_before_its_parameters(tenant):
    nobody = await tenant.credential(["queues:read"])
    assert_error(await tenant.get(BASE, token=nobody, params={"resource_id": "x"}), 403, "PERMISSION_DENIED")


# ---------------------------------------------------------------- OpenAPI


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_openapi_describes_the_audit_api(http):
    doc = await fetch_openapi(http)
    op = doc["paths"][BASE]["get"]
    params = {p["name"]: p for p in op["parameters"]}
    assert set(params) == {"resource_id", "action", "after", "limit"}
    assert params["resource_id"]["schema"]["pattern"] == params["after"]["schema"]["pattern"] == "^[0-9a-f]{32}$"
    assert {"200", "400", "401", "403", "503"} <= set(op["responses"]) and "422" not in op["responses"]
    assert set(doc["components"]["schemas"]["AuditRecord"]["properties"]) == FIELDS
    assert set(doc["components"]["schemas"]["AuditRecordPage"]["properties"]) == {"items", "next_after"}


def _audit_operations() -> list[Any]:
    unused = os.path.join(tempfile.gettempdir(), "orbit-openapi-never-opened.db")
    document = create_app(Settings(database_url=f"sqlite:///{unused}", background_loops=False)).openapi()
    ops = [r.ok() for r in schemathesis.openapi.from_dict(document).get_all_operations()]
    ops = [op for op in ops if op.path == BASE]
    assert len(ops) == 1
    return ops


AUDIT_OPERATIONS = _audit_operations()


async def check_case(tenant, http, case, _existing: bool, checks: list[Any]) -> None:
    r = await send(http, case, tenant.token)
    checks = checks_after_send(case, negative_parts(case), checks)
    try:
        case.validate_response(r, checks=checks)
    except BaseExceptionGroup as failures:
        raise AssertionError(str(failures)) from None
    if r.status_code < 300:
        ok(r, r.status_code)
    else:
        envelope(r)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@FUZZ
@given(drawn=cases(GenerationMode.POSITIVE, AUDIT_OPERATIONS))
async def test_schemathesis_positive(tenant, http, drawn):
    await check_case(tenant, http, *drawn, CHECKS)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@FUZZ
@given(drawn=cases(GenerationMode.NEGATIVE, AUDIT_OPERATIONS))
async def test_schemathesis_negative(tenant, http, drawn):
    await check_case(tenant, http, *drawn, [*CHECKS, negative_data_rejection])


# ---------------------------------------------------------------- SDK


def new_key() -> str:
    return f"sdk-{uuid.uuid4().hex}"


async def test_sdk_async_client_round_trip(tenant, app):
    async with AsyncClient("http://orbit.test", token=tenant.token, transport=httpx.ASGITransport(app=app)) as c:
        queues = [(await c.create_queue(new_key(), {"name": unique_name(), "max_concurrency": 2,
                                                    "rate_per_second": 5})).queue for _ in range(3)]
        everything = [r async for r in c.list_audit_records(page_size=2)]  # 5 records: pages of 2, 2, 1
        assert [r.action for r in everything] == ["namespace.create", "credential.issue", *["queue.create"] * 3]
        assert all(isinstance(r, AuditRecord) for r in everything)
        first = everything[2]
        assert (first.resource_id, first.actor_credential_id, first.before) == (queues[0].id, tenant.credential_id,
                                                                                 None)
        assert first.after["name"] == queues[0].name and first.time.tzinfo is not None
        assert [r.id async for r in c.list_audit_records(page_size=1)] == [r.id for r in everything]
        assert [r.id async for r in c.list_audit_records(action="queue.create", after=everything[2].id)] == \
            [everything[3].id, everything[4].id]
        assert [r.id async for r in c.list_audit_records(resource_id=queues[1].id)] == [everything[3].id]
        page = await c.list_audit_records_page(action="queue.create", page_size=2)
        assert [r.id for r in page.items] == [everything[2].id, everything[3].id]
        assert page.next_after == everything[3].id
        last = await c.list_audit_records_page(action="queue.create", after=page.next_after, page_size=2)
        assert [r.id for r in last.items] == [everything[4].id] and last.next_after == everything[4].id
        assert (await c.list_audit_records_page(after=everything[4].id)).items == []
        with pytest.raises(APIError) as exc:
            await c.list_audit_records_page(action="Not an action")
        assert (exc.value.status_code, exc.value.code) == (400, "INVALID_ARGUMENT")
        with pytest.raises(ValueError):
            c.list_audit_records(resource_id="not/an id")
        with pytest.raises(ValueError):
            c.list_audit_records(page_size=1001)
        with pytest.raises(ValueError):
            await c.list_audit_records_page(action="")


def sync_scenario(base: str, token: str, narrow: str) -> None:
    with Client(base, token=token) as c:
        q = c.create_queue(new_key(), {"name": unique_name(), "max_concurrency": 2, "rate_per_second": 5}).queue
        c.configure_queue(q.id, new_key(), {"expected_revision": q.revision, "reason": "pause it", "paused": True,
                                            "max_concurrency": 2, "rate_per_second": 5, "max_unfinished_tasks": 10})
        found = list(c.list_audit_records(resource_id=q.id))
        assert [r.action for r in found] == ["queue.create", "queue.configure"]
        assert (found[1].reason, found[1].before["paused"], found[1].after["paused"]) == ("pause it", False, True)
        assert found[1].idempotency_key.startswith("sdk-") and found[1].request_id
        page = c.list_audit_records_page(resource_id=q.id, page_size=1)
        assert page.items == found[:1] and page.next_after == found[0].id
        assert c.list_audit_records_page(resource_id=q.id, after=page.next_after).items == found[1:]
    with Client(base, token=narrow) as c, pytest.raises(APIError) as exc:
        c.list_audit_records_page()
    assert (exc.value.status_code, exc.value.code) == (403, "PERMISSION_DENIED")


async def test_sdk_sync_client_against_a_real_server(app, tenant):
    q = await tenant.create_queue()
    narrow = await tenant.credential(["audit:read"], queue_scope=[q["id"]])
    async with serve(app) as base:
        await asyncio.to_thread(sync_scenario, base, tenant.token, narrow)
