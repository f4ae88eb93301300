"""WebSocket upgrades are requests like any other: every refusal answers an error envelope whose
`request_id` is the `X-Request-Id` header, an accepted upgrade names its id too, and each one is
logged once by its route's template, never by its raw path or query."""

from __future__ import annotations

import json
import re

import pytest
import structlog
import websockets

from orbit.server.services import tenancy

pytestmark = pytest.mark.anyio

RID = re.compile(r"[0-9a-f]{32}")


async def _refused(base: str, path: str, token: str | None) -> tuple[int, dict, str | None]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    with pytest.raises(websockets.InvalidStatus) as denied:
        async with websockets.connect(base.replace("http", "ws", 1) + path, additional_headers=headers):
            pass
    response = denied.value.response
    return response.status_code, json.loads(response.body), response.headers.get("X-Request-Id")


async def test_every_refused_upgrade_carries_its_request_id(tenant, base, db):
    reader = await tenant.credential(["tasks:read"])
    revoked = await tenant.credential(["worker"])
    assert await db.transaction(lambda tx: tenancy.revoke_credential(tx, revoked[4:36], "rotated"))
    cases = [
        ("/v1/workers/connect", None, 401, "UNAUTHENTICATED"),  # no token
        (f"/v1/workers/connect?token={tenant.token}", None, 401, "UNAUTHENTICATED"),  # never from the URL
        ("/v1/workers/connect", "orb_" + "0" * 32 + "_nope", 401, "UNAUTHENTICATED"),  # unknown
        ("/v1/workers/connect", "not-a-token", 401, "UNAUTHENTICATED"),  # malformed
        ("/v1/workers/connect", revoked, 401, "UNAUTHENTICATED"),  # revoked
        ("/v1/workers/connect", reader, 403, "PERMISSION_DENIED"),  # no worker permission
        ("/v1/workers/elsewhere", tenant.token, 404, "NOT_FOUND"),  # no such route
        (f"/v1/workers/connect/{tenant.token}", None, 404, "NOT_FOUND"),
    ]
    seen = set()
    with structlog.testing.capture_logs() as events:
        for path, token, status, code in cases:
            got_status, body, header = await _refused(base, path, token)
            assert (got_status, body["error"]["code"]) == (status, code), (path, body)
            assert RID.fullmatch(body["request_id"]) and header == body["request_id"], (path, body, header)
            seen.add(header)
    assert len(seen) == len(cases)  # one id per upgrade
    lines = [e for e in events if e["event"] == "request"]
    assert [e["status"] for e in lines] == [c[2] for c in cases]
    assert {e["request_id"] for e in lines} == seen
    assert [e["route"] for e in lines] == ["/v1/workers/connect"] * 6 + ["unmatched"] * 2
    assert all(tenant.token not in str(e) for e in events)


async def test_an_accepted_upgrade_names_its_request_id_and_credential(tenant, base):
    url = base.replace("http", "ws", 1) + f"/v1/workers/connect?token={tenant.token}"
    with structlog.testing.capture_logs() as events:
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {tenant.token}"}) as ws:
            rid = ws.response.headers.get("X-Request-Id")
            await ws.send(json.dumps({"id": "p1", "type": "ping"}))
            assert json.loads(await ws.recv())["ok"]
    assert RID.fullmatch(rid or "")
    [line] = [e for e in events if e["event"] == "request"]
    assert (line["request_id"], line["status"], line["route"], line["credential_id"]) == (
        rid, 101, "/v1/workers/connect", tenant.credential_id)
    assert all(tenant.token not in str(e) for e in events)
