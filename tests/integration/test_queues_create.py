"""POST /v1/queues: field rules, uniqueness, defaults and the create receipt.

Cases of one rule run in one test against one tenant (a test per case would spend
most of its time building tenants); every assertion names its case.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import make_tenant
from .queue_helpers import (
    assert_error,
    assert_queue_object,
    audit_rows,
    create_body,
    event_rows,
    ok,
    post_raw,
    retire_body,
    state,
    unique_name,
)

pytestmark = pytest.mark.anyio


VALID_NAMES = ["a", "Z", "0", "9lives", "a" * 128, "a_b.c:d-e", "A-._:", "0-0", "Q.1:2_3-4"]

INVALID_NAMES = [
    "",
    "a" * 129,
    "-a",
    "_a",
    ".a",
    ":a",
    " a",
    "a ",
    "a b",
    "a\tb",
    "a\n",
    "a\r\n",
    "\na",
    "é",
    "aé",
    "名前",
    "ａbc",  # fullwidth letter
    "a٣",  # Arabic-Indic digit
    "a/b",
    "a@b",
    "a+b",
    "a,b",
    "a\x00",
    "a*",
]


async def rejected(tenant, db, bodies: list[tuple[Any, str | None]]) -> None:
    """Each body gets 400 INVALID_ARGUMENT naming the field, and nothing is written."""
    before = await state(db, tenant.namespace_id)
    for body, field in bodies:
        r = await tenant.post("/v1/queues", body)
        try:
            assert_error(r, 400, "INVALID_ARGUMENT", field)
        except AssertionError as exc:
            raise AssertionError(f"body {body!r}: {exc}") from None
    assert await state(db, tenant.namespace_id) == before


async def test_create_returns_201_with_the_full_queue_object(tenant):
    name = unique_name("images")
    r = await tenant.post("/v1/queues", create_body(name, max_concurrency=8, rate_per_second=100))
    data = ok(r, 201)
    assert set(data) == {"deduplicated", "queue"} and data["deduplicated"] is False
    q = data["queue"]
    assert_queue_object(q)
    assert q["name"] == name
    assert q["namespace_id"] == tenant.namespace_id
    assert q["paused"] is False
    assert (q["max_concurrency"], q["rate_per_second"], q["max_unfinished_tasks"]) == (8, 100, 100000)
    assert q["unfinished_tasks"] == "0" and q["revision"] == "1" and q["retired_at"] is None
    assert q["created_at"] == q["updated_at"]


async def test_valid_names_are_accepted(tenant):
    for name in VALID_NAMES:
        q = ok(await tenant.post("/v1/queues", create_body(name)), 201)["queue"]
        assert q["name"] == name


async def test_invalid_names_are_rejected(tenant, db):
    await rejected(tenant, db, [(create_body(name), "name") for name in INVALID_NAMES])


async def test_name_must_be_a_string(tenant, db):
    values = [None, 5, True, ["a"], {"a": 1}, 1.5]
    await rejected(tenant, db, [(create_body() | {"name": v}, "name") for v in values])


async def test_name_is_unique_in_the_namespace(tenant, db):
    name = unique_name()
    ok(await tenant.post("/v1/queues", create_body(name)), 201)
    before = await state(db, tenant.namespace_id)
    r = await tenant.post("/v1/queues", create_body(name, max_concurrency=3))
    assert_error(r, 409, "STATE_CONFLICT")
    assert name in r.json()["error"]["message"]
    assert await state(db, tenant.namespace_id) == before


async def test_a_retired_queue_keeps_its_name(tenant, db):
    name = unique_name()
    q = ok(await tenant.post("/v1/queues", create_body(name)), 201)["queue"]
    ok(await tenant.post(f"/v1/queues/{q['id']}:retire", retire_body("1")))
    before = await state(db, tenant.namespace_id)
    assert_error(await tenant.post("/v1/queues", create_body(name)), 409, "STATE_CONFLICT")
    assert await state(db, tenant.namespace_id) == before


async def test_names_are_case_sensitive(tenant):
    name = unique_name("Images")
    a = ok(await tenant.post("/v1/queues", create_body(name)), 201)["queue"]
    b = ok(await tenant.post("/v1/queues", create_body(name.lower())), 201)["queue"]
    assert a["id"] != b["id"]


async def test_same_name_in_another_namespace_is_allowed(tenant, db, http):
    other = await make_tenant(db, http)
    name = unique_name()
    a = ok(await tenant.post("/v1/queues", create_body(name)), 201)["queue"]
    b = ok(await other.post("/v1/queues", create_body(name)), 201)["queue"]
    assert a["id"] != b["id"] and a["namespace_id"] != b["namespace_id"]


async def test_limit_bounds_are_inclusive(tenant):
    for field, value in [
        ("max_concurrency", 1),
        ("max_concurrency", 100_000),
        ("rate_per_second", 1),
        ("rate_per_second", 1_000_000),
        ("max_unfinished_tasks", 1),
        ("max_unfinished_tasks", 1_000_000),
    ]:
        q = ok(await tenant.post("/v1/queues", create_body(**{field: value})), 201)["queue"]
        assert q[field] == value, (field, value)
        got = ok(await tenant.get(f"/v1/queues/{q['id']}"))
        assert got[field] == value, (field, value)


async def test_max_unfinished_tasks_omitted_or_zero_means_100000(tenant):
    for extra in ({}, {"max_unfinished_tasks": 0}):
        q = ok(await tenant.post("/v1/queues", create_body(**extra)), 201)["queue"]
        assert q["max_unfinished_tasks"] == 100_000, extra
        assert ok(await tenant.get(f"/v1/queues/{q['id']}"))["max_unfinished_tasks"] == 100_000


async def test_out_of_range_limits_are_rejected(tenant, db):
    cases = [
        ("max_concurrency", 0),
        ("max_concurrency", -1),
        ("max_concurrency", 100_001),
        ("max_concurrency", 2**32),
        ("max_concurrency", 2**64),
        ("max_concurrency", 2**70),
        ("rate_per_second", 0),
        ("rate_per_second", -5),
        ("rate_per_second", 1_000_001),
        ("max_unfinished_tasks", -1),
        ("max_unfinished_tasks", 1_000_001),
        ("max_unfinished_tasks", 2**63),
    ]
    await rejected(tenant, db, [(create_body(**{f: v}), f) for f, v in cases])


async def test_integer_fields_accept_only_json_integers(tenant, db):
    wrong = [8.0, 8.5, "8", "", True, False, [8], {"v": 8}, 1e3, -0.0]
    fields = ["max_concurrency", "rate_per_second", "max_unfinished_tasks"]
    # null: refused where a value is required; the optional backlog limit takes its default.
    await rejected(tenant, db, [(create_body(**{f: v}), f) for f in fields for v in wrong]
                   + [(create_body(**{f: None}), f) for f in fields[:2]])


async def test_required_fields(tenant, db):
    bodies = []
    for field in ("name", "max_concurrency", "rate_per_second"):
        body = create_body()
        del body[field]
        bodies.append((body, field))
    await rejected(tenant, db, bodies + [({}, None)])


async def test_unknown_fields_are_rejected(tenant, db):
    fields = ["id", "paused", "revision", "Name", "namespace_id", "unfinished_tasks", "max_concurrency_", "x y"]
    await rejected(tenant, db, [(create_body() | {f: 1}, f) for f in fields] + [(create_body() | {"": 1}, None)])


MALFORMED = [
    b"[]",
    b'[{"name":"a","max_concurrency":1,"rate_per_second":1}]',
    b'"name"',
    b"1",
    b"null",
    b"true",
    b"",
    b"   ",
    b"{",
    b"{'name': 'a'}",
    b'{"name":"a",}',
    b'{"name":"a","max_concurrency":1,"rate_per_second":1} x',
    b'{"name":"a","max_concurrency":NaN,"rate_per_second":1}',
    b'{"name":"a","max_concurrency":Infinity,"rate_per_second":1}',
    b"\xff\xfe",
    b'{"name":"\\ud800","max_concurrency":1,"rate_per_second":1}',
    b'{"name":"a\xc3","max_concurrency":1,"rate_per_second":1}',
    b"\xef\xbb\xbf{}",
]


async def test_non_object_or_malformed_bodies_are_rejected(tenant, db):
    before = await state(db, tenant.namespace_id)
    for raw in MALFORMED:
        r = await post_raw(tenant.http, "/v1/queues", raw, token=tenant.token, key=tenant.key())
        try:
            assert_error(r, 400, "INVALID_ARGUMENT")
        except AssertionError as exc:
            raise AssertionError(f"body {raw!r}: {exc}") from None
    assert await state(db, tenant.namespace_id) == before


async def test_create_writes_one_audit_record_and_one_event(tenant, db):
    key = tenant.key()
    r = await tenant.post("/v1/queues", create_body(), key=key)
    q = ok(r, 201)["queue"]
    (audit,) = await audit_rows(db, q["id"])
    assert audit["action"] == "queue.create" and audit["namespace_id"] == tenant.namespace_id
    assert audit["resource_type"] == "queue"
    assert audit["actor_credential_id"] == tenant.credential_id
    assert audit["request_id"] == r.headers["x-request-id"] and audit["idempotency_key"] == key
    (event,) = await event_rows(db, q["id"])
    assert event["type"] == "queue.created" and event["namespace_id"] == tenant.namespace_id
