"""The frame header reader that the server's and the SDK's WebSocket connections cut frames with."""

import pytest

from orbit._frames import frame_head


def frame(payload: bytes, *, first: int = 0x81, mask: bytes | None = None) -> bytes:
    n = len(payload)
    bit = 0x80 if mask is not None else 0
    if n < 126:
        head = bytes((first, bit | n))
    elif n < 65536:
        head = bytes((first, bit | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((first, bit | 127)) + n.to_bytes(8, "big")
    return head + (mask or b"") + payload


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536])
@pytest.mark.parametrize("mask", [None, b"\x01\x02\x03\x04"])
def test_a_whole_frame_is_read_to_its_end(size, mask):
    data = bytearray(b"xx" + frame(b"a" * size, mask=mask) + b"next")
    head1, head2, at, stop = frame_head(data, 2, len(data))
    assert (head1, bool(head2 & 0x80)) == (0x81, mask is not None)
    assert stop - at == size and data[stop:] == b"next"
    if mask is not None:
        assert data[at - 4:at] == mask


@pytest.mark.parametrize("size", [5, 300, 70000])
def test_a_header_cut_short_is_not_read_and_a_payload_cut_short_ends_past_the_data(size):
    whole = frame(b"b" * size, mask=b"\x00\x00\x00\x00")
    header = len(whole) - size
    for cut in range(header - 4):  # without the mask key, the header is still read
        assert frame_head(bytearray(whole[:cut]), 0, cut) is None
    _, _, at, stop = frame_head(bytearray(whole[:header + 1]), 0, header + 1)
    assert (at, stop) == (header, header + size) and stop > header + 1
