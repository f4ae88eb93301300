"""A client that offers one node far more concurrent submits than it can serve (shared by
tests/cluster/test_overload.py and bench/overload.py).

Each of `clients` coroutines holds one keep-alive HTTP/1.1 connection and submits in a closed loop
for `seconds`: single submits, and every `batch_every`-th request a batch submit of `batch_size`
tasks, each with a fresh `Idempotency-Key`. A refusal is not waited out (unless
`honor_retry_after`): the next request goes at once, as from a client that ignores the hint. Every
request is kept as a `Sent`: its latency, status, code, `Retry-After`, and the answer's data.
The connection is a few lines of asyncio, not httpx: httpx spends milliseconds of CPU per request,
and the client would then measure itself rather than the node.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson


class Conn:
    """One keep-alive HTTP/1.1 connection (Content-Length bodies only, what the server sends)."""

    def __init__(self, base_url: str, token: str) -> None:
        u = urlsplit(base_url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.auth = f"Authorization: Bearer {token}\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.replaced = 0  # kept-alive connections found closed by the server and opened again

    async def _send(self, message: bytes) -> bytes:
        """Write a request and return its status line."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(message)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("closed by the server")
        return status_line

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: object | None = None,
                      headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body). A kept-alive connection the server has
        closed meanwhile (it drops idle ones after 5 s) is replaced once, as HTTP clients do
        (Orbit's writes carry their idempotency keys)."""
        data = orjson.dumps(body) if body is not None else b""
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n".encode()
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n".encode()
        message = head + self.auth + extra + b"\r\n" + data
        reused = self.writer is not None
        try:
            status_line = await self._send(message)
        except (ConnectionError, asyncio.IncompleteReadError):
            await self.close()
            if not reused:
                raise
            self.replaced += 1
            status_line = await self._send(message)
        assert self.reader is not None
        status = int(status_line.split(b" ", 2)[1])
        found: dict[str, str] = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            found[name.strip().lower().decode()] = value.strip().decode()
        length = int(found.get("content-length", "0"))
        payload = await self.reader.readexactly(length) if length else b""
        if found.get("connection", "").lower() == "close":
            await self.close()
        return status, found, payload


@dataclass
class Sent:
    """One request and what came back (`status` None: no answer, `error` says why)."""

    kind: str  # "single" | "batch"
    path: str
    key: str
    body: dict[str, Any]
    started: float
    seconds: float = 0.0
    status: int | None = None
    code: str | None = None
    retry_after: str | None = None
    error: str | None = None
    data: dict[str, Any] | None = None
    reconnected: bool = False  # sent again on a new connection: the server had closed the old one

    @property
    def task_ids(self) -> list[str]:
        """The tasks an accepted submit answered with."""
        if self.data is None:
            return []
        if self.kind == "single":
            return [self.data["task"]["id"]]
        return [r["task"]["id"] for r in self.data["results"] if "task" in r]


def _answer(sent: Sent, status: int, headers: dict[str, str], payload: bytes) -> None:
    sent.status = status
    sent.retry_after = headers.get("retry-after")
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        sent.code = "not an envelope"
        return
    if status >= 400:
        sent.code = (body.get("error") or {}).get("code")
    else:
        sent.data = body.get("data")


async def offer(base_url: str, token: str, queue_id: str, *, clients: int, seconds: float, batch_every: int = 0,
                batch_size: int = 20, timeout: float = 60.0, honor_retry_after: bool = False) -> list[Sent]:
    """Run the closed loops; every request sent is returned, answered or not."""
    sent: list[Sent] = []
    stop_at = time.monotonic() + seconds

    async def client(i: int) -> None:
        conn = Conn(base_url, token)
        n = 0
        try:
            while time.monotonic() < stop_at:
                n += 1
                key = f"o-{i}-{n}-{uuid.uuid4().hex[:12]}"
                if batch_every and (n + i) % batch_every == 0:
                    s = Sent("batch", f"/v1/queues/{queue_id}/tasks:batch", key,
                             {"tasks": [{"idempotency_key": f"{key}-{j}", "payload": {"j": j}}
                                        for j in range(batch_size)]}, time.monotonic())
                else:
                    s = Sent("single", f"/v1/queues/{queue_id}/tasks", key, {"payload": {"i": i, "n": n}},
                             time.monotonic())
                sent.append(s)
                replaced = conn.replaced
                try:
                    answer = await asyncio.wait_for(
                        conn.request("POST", s.path, s.body, {"Idempotency-Key": key}), timeout)
                except (asyncio.TimeoutError, OSError, ConnectionError, asyncio.IncompleteReadError) as exc:
                    s.seconds = time.monotonic() - s.started
                    s.error = type(exc).__name__
                    await conn.close()
                    continue
                s.seconds = time.monotonic() - s.started
                s.reconnected = conn.replaced > replaced
                _answer(s, *answer)
                if s.status == 503 and honor_retry_after:
                    await asyncio.sleep(int(s.retry_after or "1"))
        finally:
            await conn.close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    return sent


async def resend(base_url: str, token: str, sent: Sent) -> Sent:
    """The same request again (same key, same body), on a connection of its own."""
    again = Sent(sent.kind, sent.path, sent.key, sent.body, time.monotonic())
    conn = Conn(base_url, token)
    try:
        _answer(again, *await conn.request("POST", sent.path, sent.body, {"Idempotency-Key": sent.key}))
    finally:
        await conn.close()
    again.seconds = time.monotonic() - again.started
    return again


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * (len(ordered) - 1)))))]
