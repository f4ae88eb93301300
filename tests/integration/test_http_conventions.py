"""HTTP conventions: media type, body limit, Idempotency-Key, request ids,
error envelopes for unknown routes and methods, health endpoints."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from .queue_helpers import (
    HEX32,
    assert_error,
    configure_body,
    create_body,
    envelope,
    ok,
    post_raw,
    retire_body,
    state,
)

pytestmark = pytest.mark.anyio

MIB = 1024 * 1024


async def write_targets(tenant) -> list[tuple[str, dict[str, Any]]]:
    """One valid (path, body) per state-changing queue endpoint."""
    q = await tenant.create_queue()
    return [
        ("/v1/queues", create_body()),
        (f"/v1/queues/{q['id']}:configure", configure_body("1")),
        (f"/v1/queues/{q['id']}:retire", retire_body("1")),
    ]


async def test_bodies_need_content_type_application_json(tenant, db):
    targets = await write_targets(tenant)
    before = await state(db, tenant.namespace_id)
    for path, body in targets:
        raw = orjson.dumps(body)
        for ctype in (None, "", "text/plain", "application/x-www-form-urlencoded", "application/jsonx",
                      "application/json-seq", "text/json", "multipart/form-data; boundary=x", "json"):
            r = await post_raw(tenant.http, path, raw, token=tenant.token, key=tenant.key(), content_type=ctype)
            try:
                assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
            except AssertionError as exc:
                raise AssertionError(f"{path} with Content-Type {ctype!r}: {exc}") from None
        r = await tenant.http.post(path, data={"name": "x"}, headers=tenant.headers(key=tenant.key()))
        assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await state(db, tenant.namespace_id) == before


async def test_content_type_parameters_and_case_are_accepted(tenant):
    for ctype in ("application/json; charset=utf-8", "Application/JSON", "application/json ; charset=UTF-8"):
        r = await post_raw(tenant.http, "/v1/queues", orjson.dumps(create_body()), token=tenant.token,
                           key=tenant.key(), content_type=ctype)
        ok(r, 201)


async def test_bodies_over_one_mib_are_413(tenant, db):
    targets = await write_targets(tenant)
    before = await state(db, tenant.namespace_id)
    for path, body in targets:
        raw = orjson.dumps(body)
        padded = raw[:-1] + b" " * (MIB + 1 - len(raw)) + b"}"
        assert len(padded) == MIB + 1
        r = await post_raw(tenant.http, path, padded, token=tenant.token, key=tenant.key())
        assert_error(r, 413, "PAYLOAD_TOO_LARGE")

        # Without a Content-Length (chunked), the limit is enforced while reading.
        async def chunks(data: bytes):
            for i in range(0, len(data), 64 * 1024):
                yield data[i:i + 64 * 1024]

        r = await post_raw(tenant.http, path, chunks(padded), token=tenant.token, key=tenant.key())
        assert "content-length" not in {k.lower() for k in r.request.headers}
        assert_error(r, 413, "PAYLOAD_TOO_LARGE")
        # Far larger, with a huge string value.
        huge = orjson.dumps(body | {"name": "a" * (2 * MIB)})
        assert_error(await post_raw(tenant.http, path, huge, token=tenant.token, key=tenant.key()), 413,
                     "PAYLOAD_TOO_LARGE")
    assert await state(db, tenant.namespace_id) == before


async def test_a_body_of_exactly_one_mib_is_accepted(tenant):
    raw = orjson.dumps(create_body())
    padded = raw[:-1] + b" " * (MIB - len(raw)) + b"}"
    assert len(padded) == MIB
    ok(await post_raw(tenant.http, "/v1/queues", padded, token=tenant.token, key=tenant.key()), 201)


BAD_KEYS: list[Any] = [
    "",
    "k" * 129,
    "a b",
    "a\tb",
    b"cl\xc3\xa9",
    b"\xff",
    "a\x7fb",
    "a\x01",
]


async def test_idempotency_key_is_required_and_validated(tenant, db):
    targets = await write_targets(tenant)
    before = await state(db, tenant.namespace_id)
    for path, body in targets:
        raw = orjson.dumps(body)
        r = await post_raw(tenant.http, path, raw, token=tenant.token, key=None)
        assert_error(r, 400, "INVALID_ARGUMENT", "Idempotency-Key")
        for key in BAD_KEYS:
            r = await post_raw(tenant.http, path, raw, token=tenant.token, extra={"Idempotency-Key": key})
            try:
                assert_error(r, 400, "INVALID_ARGUMENT", "Idempotency-Key")
            except AssertionError as exc:
                raise AssertionError(f"key {key!r} on {path}: {exc}") from None
    assert await state(db, tenant.namespace_id) == before


async def test_idempotency_key_edges_that_are_valid(tenant):
    visible = "".join(chr(c) for c in range(0x21, 0x7F))
    assert len(visible) == 94
    for key in ("k", "k" * 128, visible, visible[:64] + visible[:64]):
        r = await post_raw(tenant.http, "/v1/queues", orjson.dumps(create_body()), token=tenant.token,
                           extra={"Idempotency-Key": key})
        ok(r, 201)


async def test_every_response_carries_a_fresh_request_id(tenant):
    q = await tenant.create_queue()
    responses = [
        await tenant.post("/v1/queues", create_body()),
        await tenant.get(f"/v1/queues/{q['id']}"),
        await tenant.get("/v1/queues"),
        await tenant.get("/v1/queues/" + "0" * 32),
        await tenant.post("/v1/queues", {"name": ""}),
        await tenant.http.get("/v1/queues"),
        await tenant.http.get("/healthz"),
        await tenant.http.get("/readyz"),
        await tenant.http.get("/no/such/route"),
        await tenant.http.delete("/v1/queues", headers=tenant.headers()),
        await post_raw(tenant.http, "/v1/queues", b"{}", token=tenant.token, key="k", content_type="text/plain"),
        await tenant.http.get(f"/v1/queues/{q['id']}", headers={**tenant.headers(), "X-Request-Id": "f" * 32}),
    ]
    ids = set()
    for r in responses:
        body = envelope(r)
        ids.add(body["request_id"])
        assert HEX32.match(r.headers["x-request-id"])
    assert len(ids) == len(responses), "request ids must be unique"
    # A client-sent X-Request-Id does not replace the server's id.
    assert responses[-1].headers["x-request-id"] != "f" * 32


async def test_unknown_routes_are_404_envelopes(tenant):
    for path in ("/v1/nope", "/v2/queues", "/", "/v1", "/v1/queues/x/y/z", "/openapi.yaml"):
        assert_error(await tenant.get(path), 404, "NOT_FOUND")
    r = await post_raw(tenant.http, "/v1/nope", b"{}", token=tenant.token, key="k")
    assert_error(r, 404, "NOT_FOUND")


async def test_wrong_methods_get_an_error_envelope(tenant, db):
    q = await tenant.create_queue()
    before = await state(db, tenant.namespace_id)
    h = tenant.headers(key=tenant.key())
    for method, path in (
        ("DELETE", "/v1/queues"),
        ("PUT", "/v1/queues"),
        ("PATCH", f"/v1/queues/{q['id']}"),
        ("DELETE", f"/v1/queues/{q['id']}"),
        ("POST", f"/v1/queues/{q['id']}"),
        ("PUT", f"/v1/queues/{q['id']}:configure"),
        ("POST", "/healthz"),
    ):
        r = await tenant.http.request(method, path, headers=h, content=b"{}")
        assert r.status_code == 405, (method, path, r.status_code)
        body = envelope(r)
        assert set(body) == {"request_id", "error"} and body["error"]["code"] and body["error"]["message"]
    assert await state(db, tenant.namespace_id) == before


async def test_health_endpoints(http):
    assert ok(await http.get("/healthz")) == {"status": "ok"}
    ready = ok(await http.get("/readyz"))
    assert ready["status"] == "ready" and ready["node_id"] == "test"



async def test_a_chunked_body_under_the_limit_is_accepted(tenant):
    raw = orjson.dumps(create_body())

    async def chunks():
        for i in range(0, len(raw), 7):
            yield raw[i:i + 7]

    r = await post_raw(tenant.http, "/v1/queues", chunks(), token=tenant.token, key=tenant.key())
    assert "content-length" not in {k.lower() for k in r.request.headers}
    ok(r, 201)
