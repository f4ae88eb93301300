"""`WorkerSession.send_nowait`: a reply goes to its callback as the frame carrying it is read;
a reply that does not come in time, or a session that closes first, reaches the callback as the
`WorkerConnectionClosed` a `call` would raise, so the worker resends the same message id."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from orbit.sdk.session import WorkerConnectionClosed, WorkerSession, reply_result

pytestmark = pytest.mark.anyio


class _Socket:
    """Enough of the worker's connection: frames written now are recorded; nothing is read."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.close_code = 1000
        self.close_reason = ""

    def send_now(self, frame: bytes) -> bool:
        self.sent.append(orjson.loads(frame))
        return True

    async def wait_closed(self) -> None:
        await asyncio.Event().wait()

    async def close(self, *args) -> None:
        return None


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _session(reply_timeout: float = 30.0) -> tuple[WorkerSession, _Socket]:
    sock = _Socket()
    session = WorkerSession(sock, reply_timeout=reply_timeout)
    session._direct = True  # as for the SDK's own connection class
    return session, sock


async def test_the_reply_reaches_its_callback_as_it_is_read():
    session, sock = _session()
    got: list = []
    try:
        assert session.send_nowait("start", "s-1", {"lease_id": "l1"}, got.append)
        assert sock.sent == [{"type": "start", "id": "s-1", "lease_id": "l1"}]
        session._on_text(orjson.dumps({"reply_to": "s-1", "ok": True, "attempt": 1}))
        assert got == [{"reply_to": "s-1", "ok": True, "attempt": 1}]
        assert reply_result(got[0]) == {"attempt": 1}
        session._on_text(orjson.dumps({"reply_to": "s-1", "ok": True}))  # a duplicate: nobody waits
        assert len(got) == 1
    finally:
        await session.close()


async def test_a_failing_callback_does_not_stop_the_next_reply():
    session, _ = _session()
    got: list = []

    def boom(_reply) -> None:
        raise RuntimeError("bug in a callback")

    try:
        assert session.send_nowait("complete", "d-1", {"lease_id": "l1", "outcome": "succeeded"}, boom)
        assert session.send_nowait("complete", "d-2", {"lease_id": "l2", "outcome": "succeeded"}, got.append)
        session._on_text(orjson.dumps({"reply_to": "d-1", "ok": True}))
        session._on_text(orjson.dumps({"reply_to": "d-2", "ok": True}))
        assert got == [{"reply_to": "d-2", "ok": True}]
    finally:
        await session.close()


async def test_no_reply_in_time_reaches_the_callback_as_connection_closed():
    session, _ = _session(reply_timeout=0.2)
    got: list = []
    try:
        assert session.send_nowait("start", "s-1", {"lease_id": "l1"}, got.append)
        assert session.send_nowait("start", "s-2", {"lease_id": "l2"}, got.append)
        session._on_text(orjson.dumps({"reply_to": "s-2", "ok": True}))
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.02)
        assert got[0] == {"reply_to": "s-2", "ok": True}
        assert isinstance(got[1], WorkerConnectionClosed)
        with pytest.raises(WorkerConnectionClosed):
            reply_result(got[1])
        assert "s-1" not in session._waiting
    finally:
        await session.close()


async def test_a_closing_session_fails_what_waits_with_connection_closed():
    session, _ = _session()
    got: list = []
    assert session.send_nowait("complete", "d-1", {"lease_id": "l1", "outcome": "succeeded"}, got.append)
    await session.close()
    await asyncio.sleep(0)
    assert len(got) == 1 and isinstance(got[0], WorkerConnectionClosed)
    assert not session.send_nowait("start", "s-9", {"lease_id": "l9"}, got.append)
