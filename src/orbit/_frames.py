"""What the server's and the SDK's WebSocket connections share to cut frames themselves.

Both hand the library (websockets) every frame but the hot one, a final text frame, which they
take straight from the bytes they receive. That is only sound while the library's parser rests
between two frames: it then always starts at a frame's first byte.
"""

from __future__ import annotations

from typing import Any

__all__ = ["at_frame_boundary"]


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
