"""The SDK writes its text frames itself (`session._text_frame`): the `websockets` library's own
parser reads them back as the server would, at every length class, with fresh masks."""

from __future__ import annotations

import asyncio
import random

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri
from websockets.utils import accept_key

from orbit.sdk.session import _Connection, _masks, _text_frame
from tests.support.frames import parse_client_frame, parse_client_frames


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 300_000])
def test_a_text_frame_reads_back(size):
    payload = (b'{"type":"ping","id":"x"}' * (size // 24 + 1))[:size]
    frame = parse_client_frame(_text_frame(payload))
    assert frame.opcode is Opcode.TEXT and frame.fin and frame.data == payload


def test_masks_differ_from_frame_to_frame():
    masks = {_masks.next() for _ in range(5000)}
    assert len(masks) > 4990 and all(len(m) == 4 for m in masks)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name, default=None):
        return default

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass


async def _open_connection() -> tuple[_Connection, _Transport, list[bytes]]:
    """A worker's connection after its handshake, reading its messages directly (as a session does)."""
    protocol = ClientProtocol(parse_uri("ws://orbit.test/v1/workers/connect"))
    request = protocol.connect()
    conn, transport = _Connection(protocol), _Transport()
    conn.connection_made(transport)
    protocol.send_request(request)
    key = request.headers["Sec-WebSocket-Key"]
    conn.data_received(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       b"Sec-WebSocket-Accept: " + accept_key(key).encode() + b"\r\n\r\n")
    await asyncio.sleep(0)  # the corked transport writes at the end of the loop's iteration
    transport.written.clear()  # the handshake's request
    got: list[bytes] = []
    conn.on_text = got.append
    return conn, transport, got


def _server_frame(opcode: Opcode, data: bytes, fin: bool = True) -> bytes:
    return Frame(opcode, data, fin=fin).serialize(mask=False, extensions=[])


@pytest.mark.anyio
@pytest.mark.parametrize("seed", range(20))
async def test_frames_cut_by_the_connection_arrive_whole_and_in_order_however_the_bytes_come(seed):
    """Text frames of every length class are handed over whole; a ping (answered), a fragmented
    message and a close go through the library, between them, in order."""
    conn, transport, got = await _open_connection()
    conn.data_received(_server_frame(Opcode.TEXT, b'{"reply_to":"hello"}'))  # through the library
    assert got == [b'{"reply_to":"hello"}'] and conn._own is not None  # from now on, cut here
    sizes = [0, 5, 125, 126, 300, 65535, 65536, 70_000]
    texts = [bytes([97 + i]) * n for i, n in enumerate(sizes)]
    stream = b"".join(_server_frame(Opcode.TEXT, t) for t in texts[:4])
    stream += _server_frame(Opcode.PING, b"hb")
    stream += _server_frame(Opcode.TEXT, b"part-1,", fin=False) + _server_frame(Opcode.CONT, b"part-2", fin=True)
    stream += b"".join(_server_frame(Opcode.TEXT, t) for t in texts[4:])
    rng = random.Random(seed)
    pos = 0
    while pos < len(stream):
        step = rng.choice([1, 2, 3, 7, 100, 4096, 70_000])
        conn.data_received(stream[pos:pos + step])
        pos += step
    assert got[1:] == [*texts[:4], b"part-1,part-2", *texts[4:]]
    await asyncio.sleep(0)
    assert [(f.opcode, f.data) for f in parse_client_frames(b"".join(transport.written))] == [(Opcode.PONG, b"hb")]
    conn.data_received(_server_frame(Opcode.CLOSE, b"\x03\xe8") + _server_frame(Opcode.TEXT, b"after"))
    assert conn._own is None and conn.protocol.state is not State.OPEN
    assert got[-1] == texts[-1]  # nothing after the close
