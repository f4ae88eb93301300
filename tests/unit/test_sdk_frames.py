"""The SDK writes its text frames itself (`session._text_frame`): the `websockets` library's own
parser reads them back as the server would, at every length class, with fresh masks."""

from __future__ import annotations

import pytest
from websockets.frames import Opcode

from orbit.sdk.session import _masks, _text_frame
from tests.support.frames import parse_client_frame


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 300_000])
def test_a_text_frame_reads_back(size):
    payload = (b'{"type":"ping","id":"x"}' * (size // 24 + 1))[:size]
    frame = parse_client_frame(_text_frame(payload))
    assert frame.opcode is Opcode.TEXT and frame.fin and frame.data == payload


def test_masks_differ_from_frame_to_frame():
    masks = {_masks.next() for _ in range(5000)}
    assert len(masks) > 4990 and all(len(m) == 4 for m in masks)
