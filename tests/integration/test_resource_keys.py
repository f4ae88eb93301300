"""Resource key management and retirement: create, read, list,
configure and retire over HTTP and through both SDK clients, on SQLite and MariaDB.

The permits a key's tasks hold are set directly on its usage row here: their enforcement in
dispatch is tested with dispatch.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
import uuid
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection
from sqlalchemy import func, select, update

from orbit import APIError, AsyncClient, Client, ConfigureResourceKeyRequest, CreateResourceKeyRequest
from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.core.ids import new_id
from orbit.server.store.tables import audit_records, event_batches, idempotency_records, resource_key_usage, resource_keys

from .conftest import make_tenant
from .queue_helpers import (
    DECIMAL,
    HEX32,
    TIMESTAMP,
    assert_error,
    audit_rows,
    envelope,
    event_rows,
    idempotency_count,
    ok,
    post_raw,
    unique_name,
)
from .test_openapi import CHECKS, FUZZ, cases, checks_after_send, negative_parts, send
from .test_queues_create import INVALID_NAMES, MALFORMED, VALID_NAMES
from .worker_client import serve

pytestmark = pytest.mark.anyio

BASE = "/v1/resource-keys"
FIELDS = {"id", "namespace_id", "name", "max_concurrency", "in_use", "revision", "retired_at", "created_at",
          "updated_at"}


# ---------------------------------------------------------------- helpers


def key_path(key: dict[str, Any] | str, action: str = "") -> str:
    return f"{BASE}/{key if isinstance(key, str) else key['id']}{action}"


def create_body(name: str | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": unique_name("rk") if name is None else name, "max_concurrency": 5}
    body.update(fields)
    return body


def configure_body(revision: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"expected_revision": revision, "reason": "db-primary has more room", "max_concurrency": 9}
    body.update(fields)
    return body


def retire_body(revision: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"expected_revision": revision, "reason": "customer offboarded"}
    body.update(fields)
    return body


async def create(tenant, name: str | None = None, **fields: Any) -> dict[str, Any]:
    return ok(await tenant.post(BASE, create_body(name, **fields)), 201)["resource_key"]


def assert_key_object(k: dict[str, Any]) -> None:
    """Every field of the resource key object, with its wire types."""
    assert set(k) == FIELDS, sorted(k)
    assert HEX32.match(k["id"]) and HEX32.match(k["namespace_id"])
    assert isinstance(k["name"], str)
    assert type(k["max_concurrency"]) is int
    for f in ("in_use", "revision"):
        assert isinstance(k[f], str) and DECIMAL.match(k[f]), (f, k[f])
    assert int(k["revision"]) >= 1
    for f in ("created_at", "updated_at"):
        assert isinstance(k[f], str) and TIMESTAMP.match(k[f]), (f, k[f])
    assert k["retired_at"] is None or TIMESTAMP.match(k["retired_at"]), k["retired_at"]


async def state(db, namespace_id: str) -> dict[str, Any]:
    """Row counts of everything a write touches, plus every key's columns and usage row."""

    async def read(tx):
        counts = {}
        for t in (idempotency_records, audit_records, event_batches):
            counts[t.name] = await tx.scalar(
                select(func.count()).select_from(t).where(t.c.namespace_id == namespace_id))
        rows = await tx.all(
            select(resource_keys, resource_key_usage.c.unfinished, resource_key_usage.c.permits_in_use)
            .join(resource_key_usage, resource_key_usage.c.resource_key_id == resource_keys.c.id)
            .where(resource_keys.c.namespace_id == namespace_id).order_by(resource_keys.c.id))
        return {"counts": counts, "keys": [tuple(r.values()) for r in rows]}

    return await db.core_read(read)


async def set_usage(db, resource_key_id: str, **counters: int) -> None:
    """What dispatch and submit would count: permits held, unfinished tasks naming the key."""

    async def write(tx):
        await tx.execute(update(resource_key_usage)
                         .where(resource_key_usage.c.resource_key_id == resource_key_id).values(**counters))

    await db.core_transaction(write)


async def rejected(tenant, db, path: str, bodies: list[tuple[Any, str | None]]) -> None:
    """Each body gets 400 INVALID_ARGUMENT naming the field, and nothing is written."""
    before = await state(db, tenant.namespace_id)
    for body, field in bodies:
        r = await tenant.post(path, body)
        try:
            assert_error(r, 400, "INVALID_ARGUMENT", field)
        except AssertionError as exc:
            raise AssertionError(f"body {body!r}: {exc}") from None
    assert await state(db, tenant.namespace_id) == before


# ---------------------------------------------------------------- create


async def test_create_returns_201_with_the_key_object_and_writes_audit_and_event(tenant, db):
    key = tenant.key()
    body = create_body(max_concurrency=5)
    r = await tenant.post(BASE, body, key=key)
    data = ok(r, 201)
    assert set(data) == {"deduplicated", "resource_key"} and data["deduplicated"] is False
    k = data["resource_key"]
    assert_key_object(k)
    assert (k["namespace_id"], k["name"], k["max_concurrency"]) == (tenant.namespace_id, body["name"], 5)
    assert (k["in_use"], k["revision"], k["retired_at"]) == ("0", "1", None)
    assert k["created_at"] == k["updated_at"]
    assert ok(await tenant.get(key_path(k))) == k

    (audit,) = await audit_rows(db, k["id"])
    assert (audit["action"], audit["resource_type"], audit["namespace_id"]) == \
        ("resource_key.create", "resource_key", tenant.namespace_id)
    assert audit["actor_credential_id"] == tenant.credential_id
    assert audit["request_id"] == r.headers["x-request-id"] and audit["idempotency_key"] == key
    assert audit["before"] is None and orjson.loads(audit["after"]) == k
    (event,) = await event_rows(db, k["id"])
    assert (event["type"], event["namespace_id"], event["resource_type"]) == \
        ("resource_key.created", tenant.namespace_id, "resource_key")
    assert orjson.loads(event["data"]) == {"resource_key": k}


async def test_create_is_idempotent(tenant, db):
    key = tenant.key()
    body = create_body()
    first = ok(await tenant.post(BASE, body, key=key), 201)["resource_key"]
    before = await state(db, tenant.namespace_id)
    assert ok(await tenant.post(BASE, body, key=key)) == {"deduplicated": True, "resource_key": first}
    for other in (create_body(body["name"], max_concurrency=6), create_body()):
        assert_error(await tenant.post(BASE, other, key=key), 409, "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before
    assert await idempotency_count(db, tenant.namespace_id, key) == 1


async def test_writes_require_an_idempotency_key(tenant, db):
    k = await create(tenant)
    before = await state(db, tenant.namespace_id)
    for path, body in ((BASE, create_body()), (key_path(k, ":configure"), configure_body("1")),
                       (key_path(k, ":retire"), retire_body("1"))):
        for extra in ({}, {"Idempotency-Key": ""}, {"Idempotency-Key": "a b"}, {"Idempotency-Key": "x" * 129}):
            r = await post_raw(tenant.http, path, orjson.dumps(body), token=tenant.token, extra=extra)
            assert_error(r, 400, "INVALID_ARGUMENT", "Idempotency-Key")
    assert await state(db, tenant.namespace_id) == before


async def test_names_follow_the_queue_name_rules(tenant, db):
    for name in VALID_NAMES:
        assert (await create(tenant, name))["name"] == name
    await rejected(tenant, db, BASE, [(create_body(name), "name") for name in INVALID_NAMES])
    await rejected(tenant, db, BASE, [(create_body() | {"name": v}, "name") for v in (None, 5, True, ["a"], 1.5)])


async def test_name_is_unique_in_the_namespace(tenant, db, http):
    name = unique_name("db-primary")
    k = await create(tenant, name)
    before = await state(db, tenant.namespace_id)
    r = await tenant.post(BASE, create_body(name, max_concurrency=3))
    err = assert_error(r, 409, "STATE_CONFLICT")
    assert name in err["message"] and err["details"] == {"name": name}
    assert await state(db, tenant.namespace_id) == before
    # Names are case-sensitive; the same name is free in another namespace and among queues.
    assert (await create(tenant, name.upper()))["id"] != k["id"]
    other = await make_tenant(db, http)
    assert (await create(other, name))["namespace_id"] == other.namespace_id
    assert (await tenant.create_queue(name))["name"] == name


async def test_create_body_rules(tenant, db):
    for value in (1, 100_000):
        assert (await create(tenant, max_concurrency=value))["max_concurrency"] == value
    bad = [0, -1, 100_001, 2**32, 2**64, 5.0, 5.5, "5", "", True, None, [5], {"v": 5}]
    cases: list[tuple[Any, str | None]] = [(create_body(max_concurrency=v), "max_concurrency") for v in bad]
    cases += [({"name": unique_name()}, "max_concurrency"), ({"max_concurrency": 5}, "name"), ({}, None)]
    cases += [(create_body() | {f: 1}, f) for f in ("id", "in_use", "revision", "reason", "namespace_id",
                                                     "rate_per_second")]
    await rejected(tenant, db, BASE, cases)
    before = await state(db, tenant.namespace_id)
    for raw in MALFORMED:
        r = await post_raw(tenant.http, BASE, raw, token=tenant.token, key=tenant.key())
        assert_error(r, 400, "INVALID_ARGUMENT")
    r = await post_raw(tenant.http, BASE, orjson.dumps(create_body()), token=tenant.token, key=tenant.key(),
                       content_type="text/plain")
    assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await state(db, tenant.namespace_id) == before


# ---------------------------------------------------------------- read and list


async def test_get_of_a_missing_malformed_or_foreign_key_is_404(tenant, db, http):
    k = await create(tenant)
    other = await make_tenant(db, http)
    foreign = await create(other)
    queue = await tenant.create_queue()
    ids = ["0" * 32, new_id(), k["id"].upper(), k["id"][:-1], k["id"] + "0", "not-a-key", foreign["id"],
           queue["id"]]
    errors = [assert_error(await tenant.get(key_path(i)), 404, "NOT_FOUND") for i in ids]
    assert all(e == errors[0] for e in errors), errors  # a foreign key answers exactly like a missing one
    before = await state(db, other.namespace_id)
    for action, body in ((":configure", configure_body("1")), (":retire", retire_body("1"))):
        for target in (foreign, "nope", new_id()):
            assert_error(await tenant.post(key_path(target, action), body), 404, "NOT_FOUND")
    assert await state(db, other.namespace_id) == before
    assert ok(await other.get(key_path(foreign))) == foreign


async def _list_all(tenant, **params) -> list[dict]:
    items: list[dict] = []
    cursor = None
    while True:
        page = ok(await tenant.get(BASE, params={**params, **({"cursor": cursor} if cursor else {})}))
        assert set(page) == {"items", "next_cursor"}
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
        assert isinstance(cursor, str) and cursor


async def test_list_paginates_in_creation_order(tenant, db, http):
    created = [await create(tenant) for _ in range(5)]
    other = await make_tenant(db, http)
    await create(other)
    ids = [k["id"] for k in created]
    for limit in (1, 2, 5, 1000):
        assert [i["id"] for i in await _list_all(tenant, limit=limit)] == ids, limit
    first = ok(await tenant.get(BASE, params={"limit": 2}))
    assert len(first["items"]) == 2 and first["next_cursor"]
    rest = ok(await tenant.get(BASE, params={"limit": 3, "cursor": first["next_cursor"]}))
    assert [i["id"] for i in rest["items"]] == ids[2:] and rest["next_cursor"] is None
    everything = ok(await tenant.get(BASE))
    assert everything == {"items": created, "next_cursor": None}
    for item in everything["items"]:
        assert_key_object(item)


async def test_list_rejects_invalid_parameters(tenant):
    await create(tenant)
    bad_cursors = ["!!!", "abc", base64.urlsafe_b64encode(b'{"after": 5}').decode(),
                   base64.urlsafe_b64encode(b"[]").decode()]
    cases = [({"limit": v}, "limit") for v in ("0", "1001", "-1", "abc", "1.5", "")]
    cases += [({"cursor": c}, "cursor") for c in bad_cursors]
    cases += [({"include_retired": "maybe"}, "include_retired"), ({"name": "a" * 129}, "name")]
    for params, field in cases:
        try:
            assert_error(await tenant.get(BASE, params=params), 400, "INVALID_ARGUMENT", field)
        except AssertionError as exc:
            raise AssertionError(f"params {params!r}: {exc}") from None


async def test_list_filters_by_exact_name_and_hides_retired_keys_unless_asked(tenant):
    name = unique_name("customer")
    k = await create(tenant, name)
    await create(tenant, name + "-2")
    await create(tenant, "x" + name)
    assert ok(await tenant.get(BASE, params={"name": name}))["items"] == [k]
    for miss in (name[:-1], name.upper(), "nope"):
        assert ok(await tenant.get(BASE, params={"name": miss}))["items"] == []
    retired = ok(await tenant.post(key_path(k, ":retire"), retire_body("1")))["resource_key"]
    assert ok(await tenant.get(BASE, params={"name": name}))["items"] == []
    named = ok(await tenant.get(BASE, params={"name": name, "include_retired": "true"}))
    assert named == {"items": [retired], "next_cursor": None}
    assert k["id"] not in [i["id"] for i in await _list_all(tenant)]
    assert [i["id"] for i in await _list_all(tenant, include_retired="true", limit=1)][0] == k["id"]


async def test_in_use_is_the_usage_rows_permits_and_never_bumps_the_revision(tenant, db):
    k = await create(tenant)
    await set_usage(db, k["id"], permits_in_use=3, unfinished=4)
    live = ok(await tenant.get(key_path(k)))
    assert live == {**k, "in_use": "3"}
    assert ok(await tenant.get(BASE))["items"] == [live]


# ---------------------------------------------------------------- permissions


async def test_permissions(tenant):
    k = await create(tenant)
    reader = await tenant.credential(["resource_keys:read"])
    manager = await tenant.credential(["resource_keys:manage"])
    nobody = await tenant.credential(["queues:read", "queues:manage", "tasks:submit"])
    for token in (reader, nobody):
        for path, body in ((BASE, create_body()), (key_path(k, ":configure"), configure_body("1")),
                           (key_path(k, ":retire"), retire_body("1"))):
            assert_error(await tenant.post(path, body, token=token), 403, "PERMISSION_DENIED")
    for path in (BASE, key_path(k), key_path(new_id())):
        assert_error(await tenant.get(path, token=nobody), 403, "PERMISSION_DENIED")
        assert_error(await tenant.get(path, token=manager), 403, "PERMISSION_DENIED")
    assert ok(await tenant.get(key_path(k), token=reader)) == k
    assert ok(await tenant.get(BASE, token=reader))["items"] == [k]
    made = ok(await tenant.post(BASE, create_body(), token=manager), 201)["resource_key"]
    assert ok(await tenant.post(key_path(made, ":configure"), configure_body("1"), token=manager))
    # Permissions are checked on replays too.
    key = tenant.key()
    body = create_body()
    ok(await tenant.post(BASE, body, key=key), 201)
    assert_error(await tenant.post(BASE, body, key=key, token=reader), 403, "PERMISSION_DENIED")
    assert_error(await tenant.http.get(BASE), 401, "UNAUTHENTICATED")


async def test_a_key_belongs_to_the_namespace_whatever_the_queue_scope(tenant):
    """Like the application's quotas, a key is no queue: a credential scoped to some queues
    manages and reads it with the permissions alone."""
    queue = await tenant.create_queue()
    scoped = await tenant.credential(["resource_keys:read", "resource_keys:manage"], queue_scope=[queue["id"]])
    k = ok(await tenant.post(BASE, create_body(), token=scoped), 201)["resource_key"]
    assert ok(await tenant.get(BASE, token=scoped))["items"] == [k]
    assert ok(await tenant.post(key_path(k, ":retire"), retire_body("1"), token=scoped))["resource_key"]["retired_at"]


# ---------------------------------------------------------------- configure


async def test_configure_replaces_the_controls_and_is_idempotent(tenant, db):
    k = await create(tenant, max_concurrency=5)
    await set_usage(db, k["id"], permits_in_use=4)
    key = tenant.key()
    r = await tenant.post(key_path(k, ":configure"), configure_body("1", max_concurrency=2), key=key)
    data = ok(r)
    assert data["deduplicated"] is False
    after = data["resource_key"]
    assert_key_object(after)
    # Lowering below the permits in use revokes nothing: they stay in use.
    assert (after["max_concurrency"], after["revision"], after["in_use"]) == (2, "2", "4")
    assert after["updated_at"] >= k["updated_at"] and after["created_at"] == k["created_at"]
    assert {f: after[f] for f in ("id", "namespace_id", "name", "retired_at")} == \
        {f: k[f] for f in ("id", "namespace_id", "name", "retired_at")}
    assert ok(await tenant.get(key_path(k))) == after

    (audit,) = [a for a in await audit_rows(db, k["id"]) if a["action"] == "resource_key.configure"]
    assert (audit["reason"], audit["idempotency_key"], audit["request_id"]) == \
        ("db-primary has more room", key, r.headers["x-request-id"])
    assert orjson.loads(audit["before"]) == {**k, "in_use": "4"} and orjson.loads(audit["after"]) == after
    event = (await event_rows(db, k["id"]))[-1]
    assert event["type"] == "resource_key.configured"
    assert orjson.loads(event["data"]) == {"resource_key": after, "reason": "db-primary has more room"}

    # Replays answer with the original snapshot, even after a later configure.
    later = ok(await tenant.post(key_path(k, ":configure"), configure_body("2", max_concurrency=7)))["resource_key"]
    before = await state(db, tenant.namespace_id)
    replay = ok(await tenant.post(key_path(k, ":configure"), configure_body("1", max_concurrency=2), key=key))
    assert replay == {"deduplicated": True, "resource_key": after}
    for other in (configure_body("1", max_concurrency=3), configure_body("1", max_concurrency=2, reason="other")):
        assert_error(await tenant.post(key_path(k, ":configure"), other, key=key), 409, "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before
    assert ok(await tenant.get(key_path(k)))["revision"] == later["revision"] == "3"


async def test_configure_with_a_stale_revision_is_a_state_conflict(tenant, db):
    k = await create(tenant)
    ok(await tenant.post(key_path(k, ":configure"), configure_body("1")))
    before = await state(db, tenant.namespace_id)
    for rev in ("1", "3", "18446744073709551615"):
        key = tenant.key()
        err = assert_error(await tenant.post(key_path(k, ":configure"), configure_body(rev), key=key), 409,
                           "STATE_CONFLICT")
        assert err["details"] == {"current_revision": "2"}, err
        assert await idempotency_count(db, tenant.namespace_id, key) == 0
    assert await state(db, tenant.namespace_id) == before
    # A rejected configure left no record: its key is free for the right revision.
    assert ok(await tenant.post(key_path(k, ":configure"), configure_body("2"), key=key))["resource_key"][
        "revision"] == "3"


async def test_configure_body_rules(tenant, db):
    k = await create(tenant)
    path = key_path(k, ":configure")
    cases: list[tuple[Any, str | None]] = [({}, None)]
    for field in ("expected_revision", "reason", "max_concurrency"):
        body = configure_body("1")
        del body[field]
        cases.append((body, field))
    cases += [(configure_body("1", max_concurrency=v), "max_concurrency")
              for v in (0, -1, 100_001, 2**64, 5.0, "5", True, None)]
    cases += [(configure_body(v), "expected_revision") for v in ("0", "01", 1, None, "18446744073709551616", "x")]
    cases += [(configure_body("1", reason=v), "reason") for v in ("", "  \n", None, 7, "x" * 1025)]
    cases += [(configure_body("1") | {f: 1}, f) for f in ("name", "paused", "in_use", "rate_per_second")]
    await rejected(tenant, db, path, cases)
    for value in (1, 100_000):
        assert ok(await tenant.post(path, configure_body(ok(await tenant.get(key_path(k)))["revision"],
                                                         max_concurrency=value, reason="é" * 1024)))
    assert ok(await tenant.get(key_path(k)))["max_concurrency"] == 100_000


# ---------------------------------------------------------------- retire


async def test_retire_lifecycle(tenant, db):
    k = await create(tenant, max_concurrency=4)
    configure_key = tenant.key()
    configured = ok(await tenant.post(key_path(k, ":configure"), configure_body("1"), key=configure_key))
    key = tenant.key()
    r = await tenant.post(key_path(k, ":retire"), retire_body("2"), key=key)
    data = ok(r)
    assert set(data) == {"deduplicated", "resource_key"} and data["deduplicated"] is False
    retired = data["resource_key"]
    assert_key_object(retired)
    assert retired["revision"] == "3" and retired["retired_at"] is not None
    assert retired["updated_at"] == retired["retired_at"] >= k["created_at"]
    for field in ("id", "namespace_id", "name", "max_concurrency", "in_use", "created_at"):
        assert retired[field] == configured["resource_key"][field], field

    (audit,) = [a for a in await audit_rows(db, k["id"]) if a["action"] == "resource_key.retire"]
    assert (audit["reason"], audit["idempotency_key"], audit["request_id"]) == \
        ("customer offboarded", key, r.headers["x-request-id"])
    assert orjson.loads(audit["before"]) == configured["resource_key"] and orjson.loads(audit["after"]) == retired
    event = (await event_rows(db, k["id"]))[-1]
    assert event["type"] == "resource_key.retired"
    assert orjson.loads(event["data"]) == {"resource_key": retired, "reason": "customer offboarded"}

    # Still readable; it keeps its name.
    assert ok(await tenant.get(key_path(k))) == retired
    before = await state(db, tenant.namespace_id)
    assert_error(await tenant.post(BASE, create_body(k["name"])), 409, "STATE_CONFLICT")
    err = assert_error(await tenant.post(key_path(k, ":configure"), configure_body("3")), 409, "STATE_CONFLICT")
    assert err["details"] == {"retired_at": retired["retired_at"]}
    assert_error(await tenant.post(key_path(k, ":retire"), retire_body("3")), 409, "STATE_CONFLICT")
    assert await state(db, tenant.namespace_id) == before

    # Replays answer with their original snapshots and change nothing; other content conflicts.
    assert ok(await tenant.post(key_path(k, ":retire"), retire_body("2"), key=key)) == \
        {"deduplicated": True, "resource_key": retired}
    replayed = ok(await tenant.post(key_path(k, ":configure"), configure_body("1"), key=configure_key))
    assert replayed == {"deduplicated": True, "resource_key": configured["resource_key"]}
    assert_error(await tenant.post(key_path(k, ":retire"), retire_body("2", reason="other"), key=key), 409,
                 "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before


async def test_retire_with_a_stale_revision_is_a_state_conflict(tenant, db):
    k = await create(tenant)
    before = await state(db, tenant.namespace_id)
    for rev in ("2", "18446744073709551615"):
        err = assert_error(await tenant.post(key_path(k, ":retire"), retire_body(rev)), 409, "STATE_CONFLICT")
        assert err["details"] == {"current_revision": "1"}
    assert await state(db, tenant.namespace_id) == before


async def test_retire_body_rules(tenant, db):
    k = await create(tenant)
    path = key_path(k, ":retire")
    cases: list[tuple[Any, str | None]] = [
        ({}, None), ({"reason": "x"}, "expected_revision"), ({"expected_revision": "1"}, "reason"),
        (retire_body("1", reason="  "), "reason"), (retire_body("1", reason="x" * 1025), "reason"),
        (retire_body("0"), "expected_revision"), (retire_body(1), "expected_revision"),
        (retire_body("1", max_concurrency=1), "max_concurrency"), (retire_body("1", retired_at=None), "retired_at"),
    ]
    await rejected(tenant, db, path, cases)


@pytest.mark.parametrize("counters, blocker", [
    ({"permits_in_use": 2}, {"blocker": "in_use", "in_use": "2"}),
    ({"unfinished": 3}, {"blocker": "unfinished_tasks", "unfinished_tasks": "3"}),
    ({"permits_in_use": 1, "unfinished": 1}, {"blocker": "in_use", "in_use": "1"}),
])
async def test_retire_is_refused_while_tasks_hold_or_reference_the_key(tenant, db, counters, blocker):
    k = await create(tenant)
    await set_usage(db, k["id"], **counters)
    before = await state(db, tenant.namespace_id)
    key = tenant.key()
    err = assert_error(await tenant.post(key_path(k, ":retire"), retire_body("1"), key=key), 409, "STATE_CONFLICT")
    assert err["details"] == blocker and "resource key" in err["message"]
    assert await state(db, tenant.namespace_id) == before
    assert await idempotency_count(db, tenant.namespace_id, key) == 0
    assert ok(await tenant.get(key_path(k)))["retired_at"] is None

    # Once the tasks are gone, the same key retires it.
    await set_usage(db, k["id"], permits_in_use=0, unfinished=0)
    retired = ok(await tenant.post(key_path(k, ":retire"), retire_body("1"), key=key))["resource_key"]
    assert retired["retired_at"] is not None and retired["in_use"] == "0"


async def test_retire_is_refused_while_a_live_schedule_names_the_key(tenant, db):
    """A schedule whose template names a retired key could never generate a task again: the key
    retires only once no live schedule names it (a name with LIKE's own characters in it, and a
    schedule naming a key whose name merely contains it, do not confuse the check)."""
    k = await create(tenant, name=f"sftp_out_{unique_name('k')}")
    longer = await create(tenant, name=f"x{k['name']}")
    queue = await tenant.create_queue()
    schedule = ok(await tenant.post("/v1/schedules", {
        "name": unique_name("exporter"), "queue_id": queue["id"], "interval_seconds": 3600,
        "task": {"payload": {"export": True}, "resource_keys": [k["name"]]}}), 201)["schedule"]
    other = ok(await tenant.post("/v1/schedules", {
        "name": unique_name("other"), "queue_id": queue["id"], "interval_seconds": 3600,
        "task": {"payload": 1, "resource_keys": [longer["name"]]}}), 201)["schedule"]
    before = await state(db, tenant.namespace_id)
    err = assert_error(await tenant.post(key_path(k, ":retire"), retire_body("1")), 409, "STATE_CONFLICT")
    assert err["details"] == {"blocker": "schedule", "schedule_id": schedule["id"], "schedule_name": schedule["name"]}
    assert schedule["name"] in err["message"]
    assert await state(db, tenant.namespace_id) == before

    ok(await tenant.post(f"/v1/schedules/{schedule['id']}:retire", {"expected_revision": "1", "reason": "done"}))
    assert ok(await tenant.post(key_path(k, ":retire"), retire_body("1")))["resource_key"]["retired_at"]
    assert other["retired_at"] is None


async def test_concurrent_retires_of_one_key_retire_it_once(tenant, db):
    k = await create(tenant)
    answers = await asyncio.gather(*[tenant.post(key_path(k, ":retire"), retire_body("1")) for _ in range(4)])
    assert sorted(r.status_code for r in answers) == [200, 409, 409, 409]
    assert [a["action"] for a in await audit_rows(db, k["id"])] == ["resource_key.create", "resource_key.retire"]


# ---------------------------------------------------------------- OpenAPI


async def fetch_openapi(http) -> dict[str, Any]:
    r = await http.get("/openapi.json")
    assert r.status_code == 200, r.text
    return r.json()


ROUTES = {
    "/v1/resource-keys": ({"get", "post"}, "CreateResourceKeyRequest"),
    "/v1/resource-keys/{resource_key_id}": ({"get"}, None),
    "/v1/resource-keys/{resource_key_id}:configure": ({"post"}, "ConfigureResourceKeyRequest"),
    "/v1/resource-keys/{resource_key_id}:retire": ({"post"}, "RetireResourceKeyRequest"),
}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_openapi_describes_the_resource_key_api(http):
    doc = await fetch_openapi(http)
    schemas = doc["components"]["schemas"]
    for path, (methods, request) in ROUTES.items():
        assert methods <= set(doc["paths"][path]), path
        if request is None:
            continue
        op = doc["paths"][path]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{request}"}
        assert [p for p in op["parameters"] if p["name"] == "Idempotency-Key"][0]["required"] is True
        assert {"400", "401", "403", "404", "409"} <= set(op["responses"]) and "422" not in op["responses"]
        assert schemas[request]["additionalProperties"] is False
    assert set(schemas["CreateResourceKeyRequest"]["required"]) == {"name", "max_concurrency"}
    assert set(schemas["ConfigureResourceKeyRequest"]["required"]) == {"expected_revision", "reason",
                                                                       "max_concurrency"}
    limits = schemas["ConfigureResourceKeyRequest"]["properties"]["max_concurrency"]
    assert (limits["minimum"], limits["maximum"]) == (1, 100_000)
    assert set(schemas["ResourceKey"]["properties"]) == FIELDS
    assert "201" in doc["paths"]["/v1/resource-keys"]["post"]["responses"]


def _key_operations() -> list[Any]:
    """The resource key operations of the app's own document, built without touching a database."""
    unused = os.path.join(tempfile.gettempdir(), "orbit-openapi-never-opened.db")
    document = create_app(Settings(database_url=f"sqlite:///{unused}", background_loops=False)).openapi()
    ops = [r.ok() for r in schemathesis.openapi.from_dict(document).get_all_operations()]
    ops = [op for op in ops if op.path in ROUTES and op.method.lower() in ROUTES[op.path][0]]
    assert len(ops) == sum(len(m) for m, _ in ROUTES.values())
    return ops


KEY_OPERATIONS = _key_operations()


async def check_case(tenant, http, case, existing: bool, checks: list[Any]) -> None:
    """Send a generated case, aimed at an existing key when `existing`; the answer must match the
    document and carry the envelope."""
    if not hasattr(tenant, "fuzz_key"):
        tenant.fuzz_key = await create(tenant)
    negative = negative_parts(case)
    # A path id drawn to be invalid stays so: aiming it at the key would make the case valid.
    if existing and "path" not in negative and "resource_key_id" in (case.path_parameters or {}):
        case.path_parameters["resource_key_id"] = tenant.fuzz_key["id"]
    r = await send(http, case, tenant.token)
    checks = checks_after_send(case, negative, checks)
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
@given(drawn=cases(GenerationMode.POSITIVE, KEY_OPERATIONS))
async def test_schemathesis_positive(tenant, http, drawn):
    await check_case(tenant, http, *drawn, CHECKS)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@FUZZ
@given(drawn=cases(GenerationMode.NEGATIVE, KEY_OPERATIONS))
async def test_schemathesis_negative(tenant, http, drawn):
    await check_case(tenant, http, *drawn, [*CHECKS, negative_data_rejection])


# ---------------------------------------------------------------- SDK


def new_key() -> str:
    return f"sdk-{uuid.uuid4().hex}"


async def test_sdk_async_client_round_trip(tenant, app):
    async with AsyncClient("http://orbit.test", token=tenant.token, transport=httpx.ASGITransport(app=app)) as c:
        key = new_key()
        request = CreateResourceKeyRequest(name=unique_name("sdk"), max_concurrency=5)
        created = await c.create_resource_key(key, request)
        k = created.resource_key
        assert created.deduplicated is False
        assert (k.name, k.max_concurrency, k.in_use, k.revision) == (request.name, 5, 0, 1)
        assert isinstance(k.revision, int) and k.created_at.tzinfo is not None and k.retired_at is None
        assert (await c.create_resource_key(key, request)).deduplicated is True
        with pytest.raises(APIError) as exc:
            await c.create_resource_key(new_key(), {"name": request.name, "max_concurrency": 2})
        assert (exc.value.status_code, exc.value.code) == (409, "STATE_CONFLICT")
        assert await c.get_resource_key(k.id) == k

        others = [(await c.create_resource_key(new_key(), {"name": unique_name("sdk"), "max_concurrency": 1}))
                  .resource_key for _ in range(2)]
        assert [x.id async for x in c.list_resource_keys(page_size=1)] == [k.id] + [o.id for o in others]
        page = await c.list_resource_keys_page(page_size=2)
        assert [x.id for x in page.items] == [k.id, others[0].id] and page.next_cursor
        assert [x.id async for x in c.list_resource_keys(name=request.name)] == [k.id]

        ckey = new_key()
        fields = {"expected_revision": k.revision, "reason": "more room", "max_concurrency": 8}
        configured = await c.configure_resource_key(k.id, ckey, fields)
        assert (configured.deduplicated, configured.resource_key.revision, configured.resource_key.max_concurrency) \
            == (False, 2, 8)
        again = await c.configure_resource_key(k.id, ckey, ConfigureResourceKeyRequest(**{**fields,
                                                                                         "expected_revision": "1"}))
        assert again.deduplicated is True and again.resource_key == configured.resource_key
        with pytest.raises(APIError) as exc:
            await c.configure_resource_key(k.id, new_key(), fields)
        assert (exc.value.code, exc.value.details) == ("STATE_CONFLICT", {"current_revision": "2"})

        retired = await c.retire_resource_key(k.id, new_key(), 2, "done")
        assert retired.resource_key.revision == 3 and retired.resource_key.retired_at.tzinfo is not None
        assert [x.id async for x in c.list_resource_keys()] == [o.id for o in others]
        assert [x.id async for x in c.list_resource_keys(include_retired=True)][0] == k.id
        with pytest.raises(APIError) as exc:
            await c.get_resource_key(new_id())
        assert (exc.value.status_code, exc.value.code) == (404, "NOT_FOUND")
        with pytest.raises(ValueError):
            await c.get_resource_key("not/an id")
        with pytest.raises(ValueError):
            c.list_resource_keys(page_size=0)


def sync_scenario(base: str, token: str) -> None:
    with Client(base, token=token) as c:
        name = unique_name("sync")
        key = new_key()
        k = c.create_resource_key(key, CreateResourceKeyRequest(name=name, max_concurrency=3)).resource_key
        assert c.create_resource_key(key, {"name": name, "max_concurrency": 3}).deduplicated is True
        assert c.get_resource_key(k.id) == k and k.in_use == 0
        assert [x.id for x in c.list_resource_keys(name=name)] == [k.id]
        assert c.list_resource_keys_page(page_size=1).items == [k]
        configured = c.configure_resource_key(k.id, new_key(), ConfigureResourceKeyRequest(
            expected_revision=str(k.revision), reason="fewer", max_concurrency=1)).resource_key
        assert (configured.max_concurrency, configured.revision) == (1, 2)
        with pytest.raises(APIError) as exc:
            c.retire_resource_key(k.id, new_key(), 1, "stale")
        assert (exc.value.status_code, exc.value.code) == (409, "STATE_CONFLICT")
        retired = c.retire_resource_key(k.id, new_key(), configured.revision, "all done").resource_key
        assert retired.retired_at is not None and c.get_resource_key(k.id).retired_at == retired.retired_at
        assert list(c.list_resource_keys()) == []
        assert [x.id for x in c.list_resource_keys(include_retired=True)] == [k.id]


async def test_sdk_sync_client_against_a_real_server(app, tenant):
    async with serve(app) as base:
        await asyncio.to_thread(sync_scenario, base, tenant.token)
