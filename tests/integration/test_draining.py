"""A draining node (after SIGTERM) answers every HTTP request but /healthz with 503 UNAVAILABLE and
`Retry-After`, on SQLite and MariaDB; nothing a refused write carried is kept.
The SIGTERM path of a real `orbit server` is in tests/cluster/test_worker_lifecycle.py."""

from __future__ import annotations

import httpx
import pytest

from orbit import APIError, AsyncClient

from .queue_helpers import assert_error, create_body, ok, state
from .worker_client import serve

pytestmark = pytest.mark.anyio


def assert_draining(r: httpx.Response) -> None:
    err = assert_error(r, 503, "UNAVAILABLE")
    assert "draining" in err["message"], err
    assert r.headers["retry-after"] == "1"
    assert r.headers["connection"] == "close"


async def test_every_route_but_healthz_is_503_while_draining(tenant, app, db, http):
    q = await tenant.create_queue()
    node = app.state.node
    before = await state(db, tenant.namespace_id)
    key = tenant.key()
    body = create_body()

    node.draining = True
    for r in (
        await tenant.get("/v1/queues"),
        await tenant.get(f"/v1/queues/{q['id']}"),
        await tenant.get("/v1/audit-records"),
        await tenant.post("/v1/queues", body, key=key),
        await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}),  # the submit fast path
        await tenant.post(f"/v1/queues/{q['id']}/tasks:batch", {"tasks": [{"idempotency_key": "a", "payload": 1}]}),
        await http.get("/v1/queues"),  # before authentication
        await http.get("/v1/no-such-route"),
        await http.get("/openapi.json"),
        await http.get("/readyz"),
    ):
        assert_draining(r)
    assert ok(await http.get("/healthz")) == {"status": "ok"}
    assert await state(db, tenant.namespace_id) == before  # nothing written, no idempotency record kept

    node.draining = False
    assert ok(await http.get("/readyz"))["status"] == "ready"
    created = ok(await tenant.post("/v1/queues", body, key=key), 201)  # the same key is a new operation
    assert created["deduplicated"] is False


async def test_the_sdk_hears_unavailable_with_retry_after(tenant, app):
    app.state.node.draining = True
    async with AsyncClient("http://orbit.test", token=tenant.token, transport=httpx.ASGITransport(app=app)) as c:
        with pytest.raises(APIError) as exc:
            await c.create_queue("drain-1", create_body())
        assert (exc.value.status_code, exc.value.code, exc.value.retry_after) == (503, "UNAVAILABLE", 1.0)
        with pytest.raises(APIError) as exc:
            await c.ready()
        assert exc.value.code == "UNAVAILABLE"
        assert await c.health() == {"status": "ok"}


async def test_a_keep_alive_connection_is_closed_by_the_refusal(tenant, app):
    """Over a real socket: the 503 closes the connection, so the client's next request opens a new
    one, which a load balancer sends to a ready node."""
    async with serve(app) as base, httpx.AsyncClient(base_url=base) as client:
        headers = {"Authorization": f"Bearer {tenant.token}"}
        assert (await client.get("/v1/queues", headers=headers)).status_code == 200
        app.state.node.draining = True
        r = await client.get("/v1/queues", headers=headers)
        assert_draining(r)
        assert r.headers["x-request-id"] == r.json()["request_id"]
        assert (await client.get("/healthz")).status_code == 200
        app.state.node.draining = False
        assert (await client.get("/v1/queues", headers=headers)).status_code == 200
