"""Idempotency of the queue writes."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from .conftest import make_tenant
from .queue_helpers import (
    assert_error,
    configure_body,
    create_body,
    idempotency_count,
    ok,
    post_raw,
    retire_body,
    state,
)

pytestmark = pytest.mark.anyio


async def test_replay_returns_the_identical_original_snapshot(tenant, db):
    key = tenant.key()
    body = create_body(max_unfinished_tasks=5)
    first = ok(await tenant.post("/v1/queues", body, key=key), 201)
    q = first["queue"]
    before = await state(db, tenant.namespace_id)
    for _ in range(2):
        assert ok(await tenant.post("/v1/queues", body, key=key), 200) == {"deduplicated": True, "queue": q}
    assert await state(db, tenant.namespace_id) == before
    # Still the snapshot as of creation after the queue changed and even after it retired.
    ok(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1", paused=True)))
    ok(await tenant.post(f"/v1/queues/{q['id']}:retire", retire_body("2")))
    assert ok(await tenant.post("/v1/queues", body, key=key), 200) == {"deduplicated": True, "queue": q}


async def test_same_key_different_content_is_a_conflict(tenant, db):
    key = tenant.key()
    body = create_body()
    ok(await tenant.post("/v1/queues", body, key=key), 201)
    before = await state(db, tenant.namespace_id)
    for other in (
        create_body(),
        body | {"max_concurrency": 9},
        body | {"rate_per_second": 101},
        body | {"max_unfinished_tasks": 5},
        # Omitted optional fields are not filled with defaults before digesting.
        body | {"max_unfinished_tasks": 0},
    ):
        assert_error(await tenant.post("/v1/queues", other, key=key), 409, "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before


async def test_the_digest_ignores_key_order_and_whitespace(tenant):
    key = tenant.key()
    body = create_body()
    ok(await tenant.post("/v1/queues", body, key=key), 201)
    reordered = b'{ "rate_per_second" : 100,\n "max_concurrency": 8,\t"name": "%s" }' % body["name"].encode()
    r = await post_raw(tenant.http, "/v1/queues", reordered, token=tenant.token, key=key)
    assert ok(r)["deduplicated"] is True


async def test_a_rejected_request_leaves_no_record(tenant, db):
    taken = await tenant.create_queue()
    key = tenant.key()
    readonly = await tenant.credential(["queues:read"])
    before = await state(db, tenant.namespace_id)
    rejections = [
        (await tenant.post("/v1/queues", create_body(""), key=key), 400),
        (await tenant.post("/v1/queues", create_body(max_concurrency=0), key=key), 400),
        (await tenant.post("/v1/queues", create_body(taken["name"]), key=key), 409),
        (await tenant.post("/v1/queues", create_body(), key=key, token=readonly), 403),
        (await post_raw(tenant.http, "/v1/queues", b"{}", token=tenant.token, key=key, content_type="text/plain"),
         415),
        (await post_raw(tenant.http, "/v1/queues", b" " * (1024 * 1024 + 1), token=tenant.token, key=key), 413),
        (await post_raw(tenant.http, "/v1/queues", orjson.dumps(create_body()), token=None, key=key), 401),
    ]
    assert [r.status_code for r, _ in rejections] == [s for _, s in rejections]
    assert await idempotency_count(db, tenant.namespace_id, key) == 0
    assert await state(db, tenant.namespace_id) == before
    # The key is still free: valid content with it is a new operation.
    assert ok(await tenant.post("/v1/queues", create_body(), key=key), 201)["deduplicated"] is False
    assert await idempotency_count(db, tenant.namespace_id, key) == 1


async def test_keys_are_scoped_by_operation(tenant):
    key = tenant.key()
    q = ok(await tenant.post("/v1/queues", create_body(), key=key), 201)["queue"]
    configured = ok(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1"), key=key))
    assert configured["deduplicated"] is False and configured["queue"]["revision"] == "2"
    retired = ok(await tenant.post(f"/v1/queues/{q['id']}:retire", retire_body("2"), key=key))
    assert retired["deduplicated"] is False and retired["queue"]["revision"] == "3"


async def test_keys_are_scoped_by_namespace(tenant, db, http):
    other = await make_tenant(db, http)
    key = tenant.key()
    body = create_body()
    a = ok(await tenant.post("/v1/queues", body, key=key), 201)["queue"]
    b = ok(await other.post("/v1/queues", body, key=key), 201)["queue"]
    assert a["id"] != b["id"]
    assert ok(await other.post("/v1/queues", create_body(), key=tenant.key()), 201)


async def test_keys_are_case_sensitive(tenant):
    ok(await tenant.post("/v1/queues", create_body(), key="Queue-Key-1"), 201)
    ok(await tenant.post("/v1/queues", create_body(), key="queue-key-1"), 201)


async def test_configure_digest_covers_the_queue_id(tenant, db):
    a = await tenant.create_queue()
    b = await tenant.create_queue()
    key = tenant.key()
    body = configure_body("1")
    ok(await tenant.post(f"/v1/queues/{a['id']}:configure", body, key=key))
    before = await state(db, tenant.namespace_id)
    r = await tenant.post(f"/v1/queues/{b['id']}:configure", body, key=key)
    assert_error(r, 409, "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before


async def test_concurrent_requests_with_one_key_create_one_queue(tenant, db):
    key = tenant.key()
    body = create_body()
    before = await state(db, tenant.namespace_id)
    responses = await asyncio.gather(*(tenant.post("/v1/queues", body, key=key) for _ in range(5)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 200, 200, 200, 201], [r.text for r in responses]
    queues = {orjson.dumps(r.json()["data"]["queue"]) for r in responses}
    assert len(queues) == 1
    after = await state(db, tenant.namespace_id)
    assert after["counts"]["queues"] == before["counts"]["queues"] + 1
    assert after["counts"]["idempotency_records"] == before["counts"]["idempotency_records"] + 1
    assert after["counts"]["audit_records"] == before["counts"]["audit_records"] + 1


async def test_concurrent_creates_of_one_name_with_different_keys(tenant, db):
    body = create_body()
    before = await state(db, tenant.namespace_id)
    responses = await asyncio.gather(*(tenant.post("/v1/queues", body) for _ in range(5)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201, 409, 409, 409, 409], [r.text for r in responses]
    for r in responses:
        if r.status_code == 409:
            assert_error(r, 409, "STATE_CONFLICT")
    after = await state(db, tenant.namespace_id)
    assert after["counts"]["queues"] == before["counts"]["queues"] + 1
    assert after["counts"]["idempotency_records"] == before["counts"]["idempotency_records"] + 1


async def test_concurrent_configures_at_one_revision(tenant, db):
    q = await tenant.create_queue()
    path = f"/v1/queues/{q['id']}:configure"
    responses = await asyncio.gather(
        *(tenant.post(path, configure_body("1", max_concurrency=n)) for n in range(1, 6))
    )
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200, 409, 409, 409, 409], [r.text for r in responses]
    winner = next(r for r in responses if r.status_code == 200).json()["data"]["queue"]
    live = ok(await tenant.get(f"/v1/queues/{q['id']}"))
    assert live == winner and live["revision"] == "2"
