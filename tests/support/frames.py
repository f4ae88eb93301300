"""Reading back what a WebSocket client wrote, with the `websockets` library's own frame codec."""

from __future__ import annotations

from websockets.frames import Frame
from websockets.streams import StreamReader


def parse_client_frame(data: bytes) -> Frame:
    """The one masked frame in `data`, as a server would parse it."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=True)
    try:
        next(parser)
    except StopIteration as done:
        return done.value
    raise AssertionError("incomplete frame")


def parse_client_frames(data: bytes) -> list[Frame]:
    """Every masked frame in `data`, in order."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    frames = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=True)
        try:
            next(parser)
        except StopIteration as done:
            frames.append(done.value)
        else:
            raise AssertionError("incomplete frame")
    return frames
