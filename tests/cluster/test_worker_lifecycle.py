"""Drain on SIGTERM and credential revocation, against real server processes."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import httpx
import pytest

from tests.integration.worker_client import Worker

from .nodes import async_client, post, run_admin

pytestmark = pytest.mark.cluster


async def _queue_with_tasks(node, token: str, n: int) -> str:
    async with async_client() as client:
        q = await post(client, node, "/v1/queues", {"name": f"life-{uuid.uuid4().hex[:8]}", "max_concurrency": 10,
                                                    "rate_per_second": 100}, token=token, key=uuid.uuid4().hex)
        qid = q.data["queue"]["id"]
        for i in range(n):
            r = await post(client, node, f"/v1/queues/{qid}/tasks", {"payload": i}, token=token, key=uuid.uuid4().hex)
            assert r.status == 201
        return qid


async def _http_refused_while_draining(node, token: str, qid: str) -> None:
    """In the drain window every HTTP request but /healthz hears 503 UNAVAILABLE with Retry-After,
    and /readyz takes the node out of rotation."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=node.base_url, timeout=10) as client:
        for r in (await client.get(f"/v1/queues/{qid}", headers=headers),
                  await client.post(f"/v1/queues/{qid}/tasks", json={"payload": "late"},
                                    headers={**headers, "Idempotency-Key": uuid.uuid4().hex}),
                  await client.get("/readyz")):
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "UNAVAILABLE" and r.headers["retry-after"] == "1"
        assert (await client.get("/healthz")).status_code == 200


def test_sigterm_drains_worker_sessions(cluster, tenant):
    (node,) = cluster.start_nodes(1)
    token = tenant["token"]

    async def scenario():
        qid = await _queue_with_tasks(node, token, 3)
        async with Worker.connect(node.base_url, token) as w:
            await w.hello(qid)
            c = await w.call("claim", queue_id=qid, max_tasks=1)
            lease = c["tasks"][0]
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
            node.send_signal(signal.SIGTERM)
            drain = await w.wait_push("drain", timeout=10)
            assert drain["deadline_ms"] > 0
            await _http_refused_while_draining(node, token, qid)
            # No new claims while draining, but the held lease can still be reported.
            assert (await w.call("claim", queue_id=qid, max_tasks=5))["tasks"] == []
            assert (await w.call("renew", lease_id=lease["lease_id"], lease_ms=30000))["ok"]
            t0 = time.monotonic()
            done = await w.call("complete", lease_id=lease["lease_id"], outcome="succeeded", result=1)
            assert done["task_state"] == "SUCCEEDED"
            return t0

    t0 = asyncio.run(scenario())
    assert node.wait(15) == 0
    assert time.monotonic() - t0 < 10, "the node should stop soon after its sessions hold no lease"


def test_revoked_credential_closes_worker_sessions(cluster, tenant, mariadb_url):
    (node,) = cluster.start_nodes(1)
    token = tenant["token"]

    async def scenario():
        qid = await _queue_with_tasks(node, token, 0)
        async with Worker.connect(node.base_url, token) as w:
            await w.hello(qid)
            r = run_admin(mariadb_url, "credentials", "revoke", tenant["credential_id"], "--reason", "rotated")
            assert r.returncode == 0, r.stderr
            t0 = time.monotonic()
            await asyncio.wait_for(w._reader, 10)
            assert time.monotonic() - t0 < 5.5
            assert w.ws.close_code == 4401

    asyncio.run(scenario())
