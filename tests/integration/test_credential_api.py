"""GET /v1/credential: what the calling token is, for clients holding nothing else (the dashboard)."""

from __future__ import annotations

import asyncio

import pytest

import orbit

from .queue_helpers import assert_error, ok

pytestmark = pytest.mark.anyio


async def test_the_credential_describes_itself(tenant):
    data = ok(await tenant.get("/v1/credential"))
    assert data["id"] == tenant.credential_id
    assert data["application_id"] == tenant.application["id"]
    assert data["namespace_id"] == tenant.namespace_id
    assert data["queue_scope"] == "*"
    assert data["permissions"] == sorted(data["permissions"]) and "queues:read" in data["permissions"]
    assert "orb_" not in str(data)  # never the token


async def test_a_scoped_credential_without_permissions_still_reads_itself(tenant):
    q = await tenant.create_queue()
    token = await tenant.credential(["tasks:read"], queue_scope=[q["id"]])
    data = ok(await tenant.get("/v1/credential", token=token))
    assert data["permissions"] == ["tasks:read"] and data["queue_scope"] == [q["id"]]


async def test_no_or_a_bad_token_is_refused(tenant):
    r = await tenant.http.get("/v1/credential")
    assert_error(r, 401, "UNAUTHENTICATED")
    r = await tenant.get("/v1/credential", token="orb_nope_nope")
    assert_error(r, 401, "UNAUTHENTICATED")


async def test_the_sdk_reads_its_credential_on_both_clients(tenant, base):
    def sync_read():
        with orbit.Client(base, token=tenant.token) as client:
            return client.get_credential()

    mine = await asyncio.to_thread(sync_read)
    async with orbit.AsyncClient(base, token=tenant.token) as aclient:
        theirs = await aclient.get_credential()
    assert mine == theirs
    assert (mine.id, mine.application_id, mine.queue_scope) == (tenant.credential_id, tenant.application["id"], "*")
