"""The bench's lean WebSocket client (bench/_lean.py) against the `websockets` library's own
frame codec: what it sends parses as the same masked frame, and what a server sends
(any length, fragmented, split anywhere across reads) comes out whole."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode

from bench._lean import _Frames, encode_frame
from tests.support.frames import parse_client_frame

OP_CONT, OP_TEXT, OP_PING = Opcode.CONT, Opcode.TEXT, Opcode.PING


@given(st.binary(max_size=70_000))
def test_sent_frames_parse_as_masked_text(payload: bytes) -> None:
    frame = parse_client_frame(encode_frame(payload))
    assert frame.opcode == OP_TEXT and frame.fin and frame.data == payload


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200_000])
def test_received_frames_of_every_length_form(size: int) -> None:
    payload = bytes(i % 251 for i in range(size))
    wire = Frame(OP_TEXT, payload).serialize(mask=False, extensions=[])
    assert _Frames().feed(wire) == [(OP_TEXT, payload)]


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=5), st.data())
def test_fragments_split_anywhere_come_out_whole(parts: list[bytes], data) -> None:
    wire = io.BytesIO()
    for i, part in enumerate(parts):
        opcode = OP_TEXT if i == 0 else OP_CONT
        wire.write(Frame(opcode, part, fin=i == len(parts) - 1).serialize(mask=False, extensions=[]))
    wire.write(Frame(OP_PING, b"p").serialize(mask=False, extensions=[]))
    raw = wire.getvalue()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=6)))
    parser, got, last = _Frames(), [], 0
    for cut in [*cuts, len(raw)]:
        got += parser.feed(raw[last:cut])
        last = cut
    assert got == [(OP_TEXT, b"".join(parts)), (OP_PING, b"p")]
