"""Bearer authentication, permissions and queue scopes."""

from __future__ import annotations

from typing import Any

import pytest

from orbit.server.core.ids import new_id
from orbit.server.services import tenancy

from .conftest import make_tenant
from .queue_helpers import (
    assert_error,
    configure_body,
    create_body,
    idempotency_count,
    ok,
    retire_body,
    state,
)

pytestmark = pytest.mark.anyio


def endpoints(q: dict[str, Any]) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(method, path, body) for every queue endpoint, valid apart from the credential."""
    return [
        ("POST", "/v1/queues", create_body()),
        ("GET", "/v1/queues", None),
        ("GET", f"/v1/queues/{q['id']}", None),
        ("POST", f"/v1/queues/{q['id']}:configure", configure_body(q["revision"])),
        ("POST", f"/v1/queues/{q['id']}:retire", retire_body(q["revision"])),
    ]


async def call(tenant, method: str, path: str, body: Any, authorization: str | None, key: str | None = None):
    headers = {"Idempotency-Key": key or tenant.key()}
    if authorization is not None:
        headers["Authorization"] = authorization
    if method == "GET":
        return await tenant.http.get(path, headers=headers)
    return await tenant.http.post(path, json=body, headers=headers)


async def test_bad_credentials_are_401_on_every_endpoint(tenant, db):
    q = await tenant.create_queue()
    token = tenant.token
    cred_id = tenant.credential_id
    secret = token[len("orb_") + 33:]
    stranger = new_id()
    variants = [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer    ",
        f"Basic {token}",
        "Basic dXNlcjpwYXNz",
        f"Token {token}",
        token,
        f"Bearer{token}",
        "Bearer orb_",
        "Bearer orb_xyz",
        f"Bearer orb_{cred_id}",
        f"Bearer orb_{cred_id}_",
        f"Bearer orb_{cred_id.upper()}_{secret}",
        f"Bearer orx_{cred_id}_{secret}",
        f"Bearer orb_{cred_id}-{secret}",
        f"Bearer orb_{cred_id}_{secret}x",
        f"Bearer orb_{cred_id}_{secret[:-1]}",
        f"Bearer orb_{cred_id}_{'A' * len(secret)}",
        f"Bearer orb_{cred_id}_{secret * 10}",
        f"Bearer orb_{stranger}_{secret}",
        f"Bearer {token} extra",
    ]
    before = await state(db, tenant.namespace_id)
    for method, path, body in endpoints(q):
        for auth in variants:
            r = await call(tenant, method, path, body, auth)
            try:
                err = assert_error(r, 401, "UNAUTHENTICATED")
            except AssertionError as exc:
                raise AssertionError(f"{method} {path} with {auth!r}: {exc}") from None
            # Tokens never appear in errors.
            assert secret not in err["message"]
    assert await state(db, tenant.namespace_id) == before
    # Authentication comes before body validation.
    r = await tenant.http.post("/v1/queues", json={"name": ""}, headers={"Idempotency-Key": ""})
    assert_error(r, 401, "UNAUTHENTICATED")
    # And before query parameter validation, on every list.
    for path in ("/v1/queues?limit=0", f"/v1/queues/{q['id']}/tasks?limit=abc&state=NOPE",
                 f"/v1/tasks/{new_id()}/attempts?limit=1001", "/v1/queues?include_retired=maybe"):
        for auth in (None, "Bearer orb_xyz", f"Bearer orb_{stranger}_{secret}"):
            assert_error(await call(tenant, "GET", path, None, auth), 401, "UNAUTHENTICATED")


async def test_the_scheme_is_case_insensitive(tenant):
    for scheme in ("bearer", "BEARER", "Bearer"):
        r = await tenant.http.get("/v1/queues", headers={"Authorization": f"{scheme} {tenant.token}"})
        ok(r)


async def test_a_revoked_credential_is_401_at_once(tenant, db):
    q = await tenant.create_queue()
    token = await tenant.credential(["queues:read", "queues:manage"])
    cred_id = token[4:36]
    ok(await tenant.get(f"/v1/queues/{q['id']}", token=token))

    async def revoke(tx):
        return await tenancy.revoke_credential(tx, cred_id, "leaked in a log")

    assert await db.transaction(revoke) is True
    before = await state(db, tenant.namespace_id)
    for method, path, body in endpoints(q):
        assert_error(await call(tenant, method, path, body, f"Bearer {token}"), 401, "UNAUTHENTICATED")
    assert await state(db, tenant.namespace_id) == before
    # Other credentials of the namespace keep working.
    ok(await tenant.get(f"/v1/queues/{q['id']}"))


async def test_permissions(tenant, db):
    q = await tenant.create_queue()
    read = await tenant.credential(["queues:read"])
    manage = await tenant.credential(["queues:manage"])
    unrelated = await tenant.credential(["tasks:submit", "tasks:read", "worker", "events:read", "audit:read"])
    nothing = await tenant.credential([])
    before = await state(db, tenant.namespace_id)
    for token in (read, unrelated, nothing):
        for method, path, body in endpoints(q):
            if token == read and method == "GET":
                continue
            r = await call(tenant, method, path, body, f"Bearer {token}")
            err = assert_error(r, 403, "PERMISSION_DENIED")
            assert "queues:" in err["message"], err
    for method, path, body in endpoints(q):
        if method == "GET":
            assert_error(await call(tenant, method, path, body, f"Bearer {manage}"), 403, "PERMISSION_DENIED")
    assert await state(db, tenant.namespace_id) == before
    # Permission checks come before body validation.
    r = await tenant.http.post("/v1/queues", json={"bogus": 1}, headers=tenant.headers(read, key=tenant.key()))
    assert_error(r, 403, "PERMISSION_DENIED")

    ok(await tenant.get(f"/v1/queues/{q['id']}", token=read))
    ok(await tenant.get("/v1/queues", token=read))
    created = ok(await tenant.post("/v1/queues", create_body(), token=manage), 201)["queue"]
    ok(await tenant.post(f"/v1/queues/{created['id']}:configure", configure_body("1"), token=manage))
    ok(await tenant.post(f"/v1/queues/{created['id']}:retire", retire_body("2"), token=manage))


async def test_single_queue_scope(tenant, db):
    mine = await tenant.create_queue()
    other = await tenant.create_queue()
    scoped = await tenant.credential(["queues:read", "queues:manage"], [mine["id"]])

    # Creating a queue and listing need the all-queues scope.
    for r in (
        await tenant.post("/v1/queues", create_body(), token=scoped),
        await tenant.get("/v1/queues", token=scoped),
        await tenant.get("/v1/queues", token=scoped, params={"name": mine["name"]}),
    ):
        assert_error(r, 403, "PERMISSION_DENIED")

    # Outside the scope looks exactly like a queue that does not exist.
    missing = assert_error(await tenant.get("/v1/queues/" + "0" * 32, token=scoped), 404, "NOT_FOUND")
    before = await state(db, tenant.namespace_id)
    for r in (
        await tenant.get(f"/v1/queues/{other['id']}", token=scoped),
        await tenant.post(f"/v1/queues/{other['id']}:configure", configure_body("1"), token=scoped),
        await tenant.post(f"/v1/queues/{other['id']}:retire", retire_body("1"), token=scoped),
        await tenant.post(f"/v1/queues/{other['id']}:configure", {"junk": True}, token=scoped),
        await tenant.post("/v1/queues/" + "0" * 32 + ":configure", configure_body("1"), token=scoped),
    ):
        assert assert_error(r, 404, "NOT_FOUND") == missing
    assert await state(db, tenant.namespace_id) == before

    # Inside the scope everything works.
    assert ok(await tenant.get(f"/v1/queues/{mine['id']}", token=scoped)) == mine
    ok(await tenant.post(f"/v1/queues/{mine['id']}:configure", configure_body("1"), token=scoped))
    ok(await tenant.post(f"/v1/queues/{mine['id']}:retire", retire_body("2"), token=scoped))
    assert ok(await tenant.get(f"/v1/queues/{other['id']}"))["revision"] == "1"


async def test_an_empty_scope_sees_no_queue(tenant):
    q = await tenant.create_queue()
    token = await tenant.credential(["queues:read", "queues:manage"], [])
    assert_error(await tenant.get(f"/v1/queues/{q['id']}", token=token), 404, "NOT_FOUND")
    assert_error(await tenant.get("/v1/queues", token=token), 403, "PERMISSION_DENIED")
    assert_error(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1"), token=token), 404,
                 "NOT_FOUND")


async def test_another_namespace_token_cannot_reach_the_queue(tenant, db, http):
    q = await tenant.create_queue()
    other = await make_tenant(db, http)
    before = await state(db, tenant.namespace_id)
    for method, path, body in endpoints(q)[2:]:
        assert_error(await call(tenant, method, path, body, f"Bearer {other.token}"), 404, "NOT_FOUND")
    assert ok(await other.get("/v1/queues"))["items"] == []
    assert await state(db, tenant.namespace_id) == before


async def test_permissions_are_rechecked_on_replays(tenant, db):
    key = tenant.key()
    body = create_body()
    q = ok(await tenant.post("/v1/queues", body, key=key), 201)["queue"]
    ckey = tenant.key()
    configured = ok(await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1"), key=ckey))

    read = await tenant.credential(["queues:read"])
    scoped_manage = await tenant.credential(["queues:read", "queues:manage"], [new_id()])
    before = await state(db, tenant.namespace_id)
    assert_error(await tenant.post("/v1/queues", body, key=key, token=read), 403, "PERMISSION_DENIED")
    assert_error(await tenant.post("/v1/queues", body, key=key, token=scoped_manage), 403, "PERMISSION_DENIED")
    r = await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1"), key=ckey, token=read)
    assert_error(r, 403, "PERMISSION_DENIED")
    r = await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1"), key=ckey, token=scoped_manage)
    assert_error(r, 404, "NOT_FOUND")

    # Revoked: 401 even for a replay.
    async def revoke(tx):
        return await tenancy.revoke_credential(tx, tenant.credential_id, "rotated")

    assert await state(db, tenant.namespace_id) == before
    await db.transaction(revoke)
    before = await state(db, tenant.namespace_id)
    assert_error(await tenant.post("/v1/queues", body, key=key), 401, "UNAUTHENTICATED")
    assert await state(db, tenant.namespace_id) == before
    assert await idempotency_count(db, tenant.namespace_id, key) == 1

    # Keys belong to the namespace: another sufficiently privileged credential gets the replay.
    manager = await tenant.credential(["queues:manage"])
    assert ok(await tenant.post("/v1/queues", body, key=key, token=manager)) == {"deduplicated": True, "queue": q}
    r = await tenant.post(f"/v1/queues/{q['id']}:configure", configure_body("1"), key=ckey, token=manager)
    assert ok(r) == {"deduplicated": True, "queue": configured["queue"]}


async def test_a_revoked_credential_cannot_submit_even_after_it_submitted_before(tenant, db):
    """Single submits re-check revocation inside their transaction instead of looking the token up
    first: a token that already submitted (and is known to the node) must still be refused."""
    q = await tenant.create_queue()
    token = await tenant.credential(["tasks:submit"])
    path = f"/v1/queues/{q['id']}/tasks"
    ok(await call(tenant, "POST", path, {"payload": {"n": 1}}, f"Bearer {token}"), 201)

    async def revoke(tx):
        return await tenancy.revoke_credential(tx, token[4:36], "leaked in a log")

    assert await db.transaction(revoke) is True
    before = await state(db, tenant.namespace_id)
    for body in ({"payload": {"n": 2}}, {"payload": {"n": 2}, "unknown": True}, {"priority": "high"}):
        assert_error(await call(tenant, "POST", path, body, f"Bearer {token}"), 401, "UNAUTHENTICATED")
    assert await state(db, tenant.namespace_id) == before
    # Other credentials of the namespace keep working.
    ok(await call(tenant, "POST", path, {"payload": {"n": 3}}, f"Bearer {tenant.token}"), 201)


async def test_a_revoked_credential_cannot_batch_submit_even_after_it_did_before(tenant, db):
    """Batch submits, too, re-check revocation inside their transaction for a token the node
    knows: once revoked it hears 401 for a new batch, a replay of its earlier batch (same key)
    and a batch whose key was used for another body, and nothing changes."""
    q = await tenant.create_queue()
    token = await tenant.credential(["tasks:submit"])
    path = f"/v1/queues/{q['id']}/tasks:batch"
    first = {"tasks": [{"idempotency_key": "b-1", "payload": {"n": 1}}]}
    key = tenant.key()
    ok(await call(tenant, "POST", path, first, f"Bearer {token}", key=key))
    assert ok(await call(tenant, "POST", path, first, f"Bearer {token}", key=key))["deduplicated"] is True

    async def revoke(tx):
        return await tenancy.revoke_credential(tx, token[4:36], "leaked in a log")

    assert await db.transaction(revoke) is True
    before = await state(db, tenant.namespace_id)
    second = {"tasks": [{"idempotency_key": "b-2", "payload": {"n": 2}}]}
    for body, k in ((second, None), (first, key), (second, key), ({"tasks": []}, None)):
        assert_error(await call(tenant, "POST", path, body, f"Bearer {token}", key=k), 401, "UNAUTHENTICATED")
    assert await state(db, tenant.namespace_id) == before
    ok(await call(tenant, "POST", path, second, f"Bearer {tenant.token}"))
