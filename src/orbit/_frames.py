"""What the server's and the SDK's WebSocket connections share to cut frames themselves.

Both hand the library (websockets) every frame but the hot one, a final text frame, which they
take straight from the bytes they receive. That is only sound while the library's parser rests
between two frames: it then always starts at a frame's first byte.
"""

from __future__ import annotations

from typing import Any

__all__ = ["at_frame_boundary", "frame_head"]


def at_frame_boundary(protocol: Any) -> bool:
    """Whether websockets' parser holds no byte and waits for a frame's first one. It is known
    from where the parser's generator rests: in the stream's end-of-data check between frames
    (`StreamReader.at_eof`). Should the library be built otherwise, the answer is no."""
    if protocol.reader.buffer:
        return False
    g = getattr(protocol, "parser", None)
    while g is not None and getattr(g, "gi_yieldfrom", None) is not None:
        g = g.gi_yieldfrom
    return g is not None and getattr(getattr(g, "gi_code", None), "co_name", "") == "at_eof"


def frame_head(buf: bytearray, pos: int, end: int) -> tuple[int, int, int, int] | None:
    """The header of the frame that begins at `pos` of `buf` (RFC 6455, 5.2): its first two
    bytes, where its payload begins (after the mask key, if any) and where the frame ends, which
    may lie past `end`; None while the header itself is not whole."""
    if end - pos < 2:
        return None
    head1, head2 = buf[pos], buf[pos + 1]
    size, at = head2 & 0x7F, pos + 2
    if size == 126:
        if end - at < 2:
            return None
        size, at = int.from_bytes(buf[at:at + 2], "big"), at + 2
    elif size == 127:
        if end - at < 8:
            return None
        size, at = int.from_bytes(buf[at:at + 8], "big"), at + 8
    if head2 & 0x80:
        at += 4
    return head1, head2, at, at + size
