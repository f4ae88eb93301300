"""A command cancelled in the same loop turn as its reply arrives is still cancelled.

On Python 3.11 `asyncio.wait_for` returns the reply instead; a worker's renew loop,
cancelled when its handler ended, then kept renewing the lease until the worker exited
(a chaos run found a task held RUNNING for 148 s after its handler succeeded)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from orbit.sdk.session import WorkerSession

pytestmark = pytest.mark.anyio


class _Socket:
    """Enough of a websockets connection: sends are recorded, receives wait forever."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    async def send(self, frame: str | bytes, text: bool = True) -> None:
        self.sent.append(orjson.loads(frame))

    async def recv(self) -> str:
        await asyncio.Event().wait()
        raise AssertionError

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        return await self.recv()

    async def close(self, *args) -> None:
        return None


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_cancel_together_with_the_reply_cancels():
    session = WorkerSession(_Socket())
    try:
        for _ in range(50):
            call = asyncio.create_task(session.call("renew", msg_id="m1", lease_id="l1", lease_ms=1000))
            while "m1" not in session._waiting:
                await asyncio.sleep(0)
            await asyncio.sleep(0)
            session._waiting["m1"].set_result({"reply_to": "m1", "ok": True})
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            session._waiting.pop("m1", None)
    finally:
        await session.close()
