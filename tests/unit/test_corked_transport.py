"""Worker frames are written once per loop iteration, in order, and never after a close."""

import asyncio

import pytest

from orbit._cork import CorkedTransport
from orbit.server.ws.corked import websocket_protocol

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class FakeTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_extra_info(self, name: str):
        return ("127.0.0.1", 1) if name == "peername" else None


async def test_writes_of_one_iteration_reach_the_socket_as_one_write_in_order():
    raw = FakeTransport()
    t = CorkedTransport(raw, asyncio.get_running_loop())
    for frame in (b"a", b"b", b"c"):
        t.write(frame)
    assert raw.writes == []
    await asyncio.sleep(0)
    assert raw.writes == [b"abc"]
    t.write(b"d")
    await asyncio.sleep(0)
    assert raw.writes == [b"abc", b"d"]
    assert t.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else is the real transport's


async def test_close_flushes_first_and_abort_drops():
    raw = FakeTransport()
    t = CorkedTransport(raw, asyncio.get_running_loop())
    t.write(b"close-frame")
    t.close()
    assert raw.writes == [b"close-frame"] and raw.closed
    await asyncio.sleep(0)
    assert raw.writes == [b"close-frame"]

    raw2 = FakeTransport()
    t2 = CorkedTransport(raw2, asyncio.get_running_loop())
    t2.write(b"lost")
    t2.abort()
    await asyncio.sleep(0)
    assert raw2.writes == [] and raw2.aborted


def test_the_server_uses_the_corked_protocol():
    proto = websocket_protocol()
    assert proto == "auto" or proto.__name__ == "CorkedWebSocketProtocol"
