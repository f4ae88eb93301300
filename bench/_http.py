"""A minimal HTTP/1.1 keep-alive client for load generation.

httpx spends ~3 ms of CPU per request here, so a single-submit benchmark driven
by it measures the load generator (one core at 100 %) rather than the server.
This client spends a few tens of microseconds: one connection per caller, no
pipelining, `Content-Length` bodies only (what the Orbit server sends).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import orjson


class RawConnection:
    """One keep-alive connection; use it from one coroutine at a time."""

    def __init__(self, base_url: str, authorization: str) -> None:
        u = urlsplit(base_url)
        self._host, self._port = u.hostname or "127.0.0.1", u.port or 80
        self._auth = f"Authorization: {authorization}\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _send(self, request: bytes) -> bytes:
        """Write the request and return the response's status line."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        assert self._reader is not None
        self._writer.write(request)
        status_line = await self._reader.readline()
        if not status_line:
            raise ConnectionError("server closed the connection")
        return status_line

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._reader = self._writer = None

    async def post(self, path: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """POST JSON; a kept-alive connection the server closed meanwhile (uvicorn drops idle
        ones after 5 s) is replaced once, as HTTP clients do (Orbit's writes carry keys)."""
        data = orjson.dumps(body)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n").encode()
        request = head + self._auth + extra + b"\r\n" + data
        reused = self._writer is not None
        try:
            status_line = await self._send(request)
        except (ConnectionError, asyncio.IncompleteReadError):
            await self.close()
            if not reused:
                raise
            status_line = await self._send(request)
        assert self._reader is not None
        status = int(status_line.split(b" ", 2)[1])
        length, close = 0, False
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        payload = await self._reader.readexactly(length) if length else b""
        if close:
            await self.close()
        return status, payload


def like(client) -> RawConnection:
    """A raw connection to the same server with the same credentials as an httpx client."""
    return RawConnection(str(client.base_url), client.headers["Authorization"])


class RawPool:
    """Keep-alive connections shared by concurrent callers, one request per connection at a time."""

    def __init__(self, base_url: str, authorization: str) -> None:
        self._base_url, self._authorization = base_url, authorization
        self._idle: list[RawConnection] = []

    @classmethod
    def like(cls, client) -> RawPool:
        return cls(str(client.base_url), client.headers["Authorization"])

    async def post(self, path: str, body: object, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        conn = self._idle.pop() if self._idle else RawConnection(self._base_url, self._authorization)
        try:
            result = await conn.post(path, body, headers)
        except BaseException:
            await conn.close()
            raise
        self._idle.append(conn)
        return result

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().close()
