"""A worker socket's life before `hello`: it is bounded in time and reached by revocation."""

from __future__ import annotations

import asyncio
import time

import pytest
import websockets

from orbit.server.services import tenancy
from orbit.server.ws import session as session_module

from .worker_client import Worker

pytestmark = pytest.mark.anyio


async def _closed(w: Worker, within: float) -> tuple[int | None, str | None]:
    await asyncio.wait_for(w._reader, within)
    return w.ws.close_code, w.ws.close_reason


async def test_a_socket_without_hello_is_closed_1008_after_the_hello_timeout(tenant, base, monkeypatch):
    monkeypatch.setattr(session_module, "HELLO_TIMEOUT_S", 0.6)
    async with Worker.connect(base, tenant.token) as silent, Worker.connect(base, tenant.token) as pinging, \
            Worker.connect(base, tenant.token) as greeted, Worker.connect(base, tenant.token) as refused:
        t0 = time.monotonic()
        await greeted.hello()
        assert (await refused.call("hello", node_id=""))["error"]["code"] == "INVALID_ARGUMENT"
        for _ in range(3):  # pings are answered, but do not stand in for hello
            assert (await pinging.call("ping"))["ok"]
            await asyncio.sleep(0.1)
        for w in (silent, pinging, refused):
            code, reason = await _closed(w, 5)
            assert code == 1008 and "hello" in reason
        assert 0.5 < time.monotonic() - t0 < 4
        await asyncio.sleep(0.3)
        assert (await greeted.call("ping"))["ok"]  # a session that said hello in time stays


async def test_a_hello_still_being_answered_at_the_deadline_is_not_cut_off(tenant, base, monkeypatch):
    monkeypatch.setattr(session_module, "HELLO_TIMEOUT_S", 0.3)
    real = session_module.workers.missing_queues

    async def slow_missing_queues(*args):
        await asyncio.sleep(0.6)
        return await real(*args)

    monkeypatch.setattr(session_module.workers, "missing_queues", slow_missing_queues)
    q = await tenant.create_queue()
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        await asyncio.sleep(0.4)
        assert (await w.call("ping"))["ok"]


async def test_revoking_the_credential_closes_a_socket_that_never_sent_hello(tenant, base, db,
                                                                            monkeypatch):
    monkeypatch.setattr(session_module, "HELLO_TIMEOUT_S", 60)
    token = await tenant.credential(["worker"])
    async with Worker.connect(base, token) as silent, Worker.connect(base, tenant.token) as other:
        await other.hello()
        await asyncio.sleep(0.1)  # the upgrade is accepted and the session registered
        assert await db.transaction(lambda tx: tenancy.revoke_credential(tx, token[4:36], "rotated"))
        t0 = time.monotonic()
        code, reason = await _closed(silent, 8)
        assert code == 4401 and reason == "credential revoked"
        assert time.monotonic() - t0 < 5.5  # operations: closed within 5 seconds
        assert (await other.call("ping"))["ok"]  # another credential's session is untouched
    with pytest.raises(websockets.InvalidStatus) as denied:
        async with Worker.connect(base, token):
            pass
    assert denied.value.response.status_code == 401
