"""A lean worker session for the drain: the same claim/start/complete protocol as
`_worker.RawSession`, on a WebSocket client written for it over an asyncio protocol.

The benchmark's worker processes share the machine's two cores with the server and
MariaDB, so every microsecond a worker spends per frame is taken from the system
being measured. A general client (the `websockets` library: a future, a timeout and
a send context per call, a task per lease) cost ~80 µs of worker CPU per task
(`python bench/drain_cpu.py`). Here a session is a state machine driven by the
frames it receives: no task or future per message, frames written by one
`transport.write` per loop iteration. It speaks only what a worker needs: the
upgrade, masked text frames out, unmasked text/ping/close frames in (RFC 6455).
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
from typing import Any
from urllib.parse import urlsplit

import orjson


def _mask(payload: bytes, key: bytes) -> bytes:
    """XOR `payload` with the 4-byte `key` repeated (one big-int operation, not a byte loop)."""
    n = len(payload)
    if not n:
        return payload
    pad = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(pad, "little")).to_bytes(n, "little")


def encode_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """One final client frame: masked, as every client-to-server frame must be."""
    n = len(payload)
    key = random.getrandbits(32).to_bytes(4, "little")
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    return head + key + _mask(payload, key)


class _Frames:
    """Incremental parser of server frames (never masked); yields (opcode, payload) of whole messages."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._parts: list[bytes] = []
        self._opcode = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        out = []
        pos = 0
        end = len(buf)
        while end - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            n = b1 & 0x7F
            head = 2
            if n == 126:
                if end - pos < 4:
                    break
                n = int.from_bytes(buf[pos + 2:pos + 4], "big")
                head = 4
            elif n == 127:
                if end - pos < 10:
                    break
                n = int.from_bytes(buf[pos + 2:pos + 10], "big")
                head = 10
            if b1 & 0x80:
                raise ConnectionError("the server sent a masked frame")
            if end - pos < head + n:
                break
            payload = bytes(buf[pos + head:pos + head + n])
            pos += head + n
            opcode = b0 & 0x0F
            if opcode >= 0x8:  # control frames are never fragmented
                out.append((opcode, payload))
                continue
            if opcode:
                self._opcode = opcode
            self._parts.append(payload)
            if b0 & 0x80:
                out.append((self._opcode, b"".join(self._parts)))
                self._parts.clear()
        del buf[:pos]
        return out


class LeanProtocol(asyncio.Protocol):
    """The upgrade, then frames: every whole text message goes to `on_message(dict)`."""

    def __init__(self, on_message, on_closed) -> None:
        self.transport: asyncio.Transport | None = None
        self.upgraded: asyncio.Future = asyncio.get_running_loop().create_future()
        self._head = bytearray()
        self._frames = _Frames()
        self._out: list[bytes] = []
        self._on_message = on_message
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.upgraded.done():
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(self._head[:end]).split(b"\r\n", 1)[0]
            rest = bytes(self._head[end + 4:])
            if b" 101 " not in status + b" ":
                self.upgraded.set_exception(ConnectionError(f"upgrade refused: {status.decode(errors='replace')}"))
                return
            self.upgraded.set_result(None)
            if not rest:
                return
            data = rest
        for opcode, payload in self._frames.feed(data):
            if opcode == 0x1:
                self._on_message(orjson.loads(payload))
            elif opcode == 0x9:
                self._queue(encode_frame(payload, 0xA))
            elif opcode == 0x8:
                self._queue(encode_frame(payload[:2], 0x8))
                self._flush()
                if self.transport is not None:
                    self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(ConnectionError("connection closed during the upgrade"))
        self._on_closed()

    def send(self, message: dict[str, Any]) -> None:
        """Queue a text frame; all frames queued in one loop iteration leave in one write."""
        self._queue(encode_frame(orjson.dumps(message)))

    def _queue(self, frame: bytes) -> None:
        if not self._out:
            self._loop.call_soon(self._flush)
        self._out.append(frame)

    def _flush(self) -> None:
        if self._out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._queue(encode_frame((1000).to_bytes(2, "big"), 0x8))
            self._flush()
            self.transport.close()


async def connect(url: str, token: str, on_message, on_closed) -> LeanProtocol:
    parts = urlsplit(url)
    loop = asyncio.get_running_loop()
    _, proto = await loop.create_connection(lambda: LeanProtocol(on_message, on_closed),
                                            parts.hostname, parts.port or 80)
    key = base64.b64encode(os.urandom(16)).decode()
    proto.transport.write(
        (f"GET /v1/workers/connect HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
         f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
         f"Authorization: Bearer {token}\r\n\r\n").encode())
    await asyncio.wait_for(proto.upgraded, 30)
    return proto


class LeanWorker:
    """One session's claim -> start every lease -> complete each -> claim again cycle, driven by
    the replies as they arrive. Counts into `stats` (and `counter[0]`) like `_worker.run_session`."""

    def __init__(self, queue_id: str, node_id: str, stop: asyncio.Event, stats: Any, counter: list[int] | None, *,
                 max_tasks: int, lease_ms: int, wait_ms: int, handler_ms: float, retry_rate_limited: bool) -> None:
        self.queue_id = queue_id
        self.stop = stop
        self.stats = stats
        self.counter = counter
        self.max_tasks = max_tasks
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.handler_ms = handler_ms
        self.retry_rate_limited = retry_rate_limited
        self.proto: LeanProtocol | None = None
        self.hello: asyncio.Future = asyncio.get_running_loop().create_future()
        self.idle = asyncio.Event()  # set while no claim or lease is in flight (the session may stop)
        self._prefix = f"{os.getpid()}.{node_id}.{random.getrandbits(32):08x}"
        self._claims = 0
        self._outstanding = 0
        self._loop = asyncio.get_running_loop()

    def closed(self) -> None:
        if not self.hello.done():
            self.hello.set_exception(ConnectionError("worker session closed"))
        self.idle.set()

    def on_message(self, msg: dict[str, Any]) -> None:
        reply_to = msg.get("reply_to") or ""
        kind, _, lease_id = reply_to.partition(":")
        if kind == "s":
            self._started(lease_id, msg)
        elif kind == "d":
            self._done(msg)
        elif kind == "c":
            self._claimed(msg)
        elif kind == "r":
            self._finished()
        elif kind == "h" and not self.hello.done():
            self.hello.set_result(msg)

    def send(self, message: dict[str, Any]) -> None:
        assert self.proto is not None
        self.proto.send(message)

    def claim(self) -> None:
        if self.stop.is_set():
            self.idle.set()
            return
        self.idle.clear()
        self._claims += 1
        self.send({"type": "claim", "id": f"c:{self._prefix}.{self._claims}", "queue_id": self.queue_id,
                   "max_tasks": self.max_tasks, "wait_ms": self.wait_ms, "lease_ms": self.lease_ms})

    def _claimed(self, msg: dict[str, Any]) -> None:
        if not msg.get("ok"):
            self.stats.errors += 1
            self._loop.call_later(0.05, self.claim)
            return
        leases = msg["tasks"]
        if not leases:
            self.claim()
            return
        self._outstanding = len(leases)
        for lease in leases:
            self._start(lease["lease_id"])

    def _start(self, lease_id: str) -> None:
        self.send({"type": "start", "id": f"s:{lease_id}", "lease_id": lease_id})

    def _started(self, lease_id: str, msg: dict[str, Any]) -> None:
        if msg.get("ok"):
            if self.handler_ms:
                self._loop.call_later(self.handler_ms / 1000, self._complete, lease_id)
            else:
                self._complete(lease_id)
            return
        error = msg.get("error") or {}
        code = error.get("code")
        if self.retry_rate_limited and code == "RATE_LIMITED" and not self.stop.is_set():
            self.stats.rate_limited += 1
            self._loop.call_later(max(1, error.get("retry_after_ms", 10)) / 1000, self._start, lease_id)
            return
        if code not in ("RATE_LIMITED", "QUEUE_PAUSED"):
            self.stats.errors += 1
        self.send({"type": "release", "id": f"r:{lease_id}", "lease_id": lease_id})

    def _complete(self, lease_id: str) -> None:
        self.send({"type": "complete", "id": f"d:{lease_id}", "lease_id": lease_id, "outcome": "succeeded",
                   "result": None})

    def _done(self, msg: dict[str, Any]) -> None:
        if msg.get("ok"):
            self.stats.completed += 1
            if self.counter is not None:
                self.counter[0] += 1
        else:
            self.stats.errors += 1
        self._finished()

    def _finished(self) -> None:
        self._outstanding -= 1
        if self._outstanding == 0:
            self.claim()


async def run_lean_session(url: str, token: str, queue_id: str, node_id: str, stop: asyncio.Event, stats: Any,
                           counter: list[int] | None = None, *, max_tasks: int = 50, lease_ms: int = 60000,
                           wait_ms: int = 500, handler_ms: float = 0, retry_rate_limited: bool = False) -> None:
    w = LeanWorker(queue_id, node_id, stop, stats, counter, max_tasks=max_tasks, lease_ms=lease_ms,
                   wait_ms=wait_ms, handler_ms=handler_ms, retry_rate_limited=retry_rate_limited)
    w.proto = await connect(url, token, w.on_message, w.closed)
    try:
        w.send({"type": "hello", "id": f"h:{w._prefix}", "node_id": node_id, "queues": [queue_id], "sdk": "bench"})
        r = await asyncio.wait_for(w.hello, 30)
        if not r.get("ok"):
            raise RuntimeError(f"hello refused: {r}")
        w.claim()
        await stop.wait()
        # Finish what is in flight (the claim in its long poll returns within wait_ms).
        await w.idle.wait()
    finally:
        w.proto.close()
