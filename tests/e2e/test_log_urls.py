"""No token reaches a log line of a real node, wherever a client puts it: in the Authorization
header, a query string or a path, of HTTP requests and of WebSocket upgrades, accepted or refused
(uvicorn writes each upgrade's raw URL at INFO unless told otherwise)."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from orbit.server.core.permissions import ALL_PERMISSIONS, ALL_QUEUES
from orbit.server.services import tenancy
from orbit.server.store import migrate

from .conftest import run_db


def _issue(url: str) -> str:
    async def body(tx):
        app = await tenancy.ensure_application(tx, f"logs-{uuid.uuid4().hex[:8]}")
        ns = await tenancy.ensure_namespace(tx, app["id"], "default", "development")
        await tenancy.ensure_queue(tx, ns["id"], "default")
        issued = await tenancy.issue_credential(tx, application=app, namespace=ns,
                                                permissions=list(ALL_PERMISSIONS), queue_scope=ALL_QUEUES)
        return issued.token

    return run_db(url, body)


def _upgrade(base: str, path: str, headers: dict[str, str]) -> int:
    """The upgrade's status: 101 (then one ping) or the refusal's, whose request id is checked."""
    try:
        with connect(base.replace("http", "ws", 1) + path, additional_headers=headers) as ws:
            ws.send(json.dumps({"id": "p1", "type": "ping"}))
            assert json.loads(ws.recv(timeout=10))["ok"]
            return 101
    except InvalidStatus as refused:
        body = json.loads(refused.response.body)
        rid = refused.response.headers.get("X-Request-Id")
        assert rid and body["request_id"] == rid, (path, body, rid)
        return refused.response.status_code


@pytest.mark.parametrize("command", ["dev", "server"])
def test_no_token_in_any_log_line_wherever_the_client_puts_it(tmp_path, spawn, command):
    if command == "dev":
        data = tmp_path / "orbit-data"
        node = spawn("orbit", "dev", "--data-dir", str(data), "--log-level", "debug")
        node.wait_ready()
        token = json.loads((data / "credentials.json").read_text())["token"]
    else:  # the production command at its default level, INFO
        url = f"sqlite:///{tmp_path / 'node.db'}"
        asyncio.run(migrate.upgrade(url))
        token = _issue(url)
        node = spawn("orbit", "server", "--database-url", url)
        node.wait_ready()
    bearer = {"Authorization": f"Bearer {token}"}
    base = node.base

    def get(path: str, headers: dict[str, str] | None = None, **params: str) -> int:
        return httpx.get(base + path, headers=headers or {}, params=params, timeout=10).status_code

    http = [
        get("/v1/queues", bearer, token=token),  # in the header and the query
        get("/v1/queues", access_token=token),  # in the query only: never accepted from there
        get(f"/v1/queues/{token}", bearer),  # in a path parameter
        get(f"/v1/{token}", bearer, token=token),  # in a path no route has
        get("/v1/queues", {"Authorization": token}),  # without its scheme
        get("/v1/queues", {"Authorization": f"Bearer {token}x"}),  # damaged
        httpx.post(base + "/v1/queues", params={"token": token}, json={"name": "x"},
                   headers={**bearer, "Idempotency-Key": token}, timeout=10).status_code,  # as an idempotency key
    ]
    assert http == [200, 401, 404, 404, 401, 401, 400], http
    upgrades = [
        _upgrade(base, f"/v1/workers/connect?token={token}", {}),
        _upgrade(base, f"/v1/workers/connect?token={token}", bearer),
        _upgrade(base, f"/v1/workers/connect/{token}", bearer),
        _upgrade(base, f"/v1/workers/{token}?access_token={token}", {}),
        _upgrade(base, "/v1/workers/connect", bearer),
        _upgrade(base, "/v1/workers/connect", {"Authorization": f"Bearer {token}x"}),
    ]
    assert upgrades == [401, 101, 404, 404, 101, 401], upgrades
    with connect(base.replace("http", "ws", 1) + "/v1/workers/connect", additional_headers=bearer) as ws:
        ws.send(json.dumps({"id": token, "type": "ping"}))  # a message id is the client's to choose
        assert json.loads(ws.recv(timeout=10))["reply_to"] == token
    assert node.terminate(timeout=15) == 0, node.stderr

    logs = node.stdout + node.stderr
    secret = token[37:]  # orb_<32 hex id>_<secret>
    leaked = [line for line in logs.splitlines() if token in line or secret in line]
    assert not leaked, "\n".join(leaked)
    events = [json.loads(line) for line in node.stderr.splitlines() if line.startswith("{")]
    upgrade_lines = [e for e in events if e.get("event") == "request" and e.get("websocket")]
    assert sorted(e["status"] for e in upgrade_lines) == sorted([*upgrades, 101])
    assert all(e["route"] in ("/v1/workers/connect", "unmatched") for e in upgrade_lines)
    assert len([e for e in events if e.get("event") == "request" and not e.get("websocket")]) >= len(http)
    if command == "dev":  # at DEBUG a line per frame names its message id: here, redacted
        assert [e["msg_id"] for e in events if e.get("event") == "frame"] == ["p1", "p1", "orb_[redacted]"]
