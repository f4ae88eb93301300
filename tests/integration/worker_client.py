"""A real server on a loopback port inside the test's event loop, and a raw worker client."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import uuid
from typing import Any

import uvicorn
import websockets

from orbit.server.ws.corked import websocket_protocol


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def serve(app, ws: Any = None):
    """Run `app` with uvicorn (lifespan included) on a free port; yield its base URL. `ws`: the
    WebSocket protocol (default: the one `orbit server` uses)."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False, lifespan="on",
                            ws_ping_interval=None, ws=ws or websocket_protocol())
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # uvicorn < 0.29
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 10)


class Worker:
    """Raw protocol: `call` sends a frame and waits for its reply; pushes are collected."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.pushes: list[dict[str, Any]] = []
        self._ids = itertools.count()
        self._prefix = uuid.uuid4().hex[:8]  # message ids name commands per credential: keep them unique
        self._waiting: dict[str, asyncio.Future] = {}
        self._push_event = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, base: str, token: str):
        ws = await websockets.connect(base.replace("http", "ws", 1) + "/v1/workers/connect",
                                      additional_headers={"Authorization": f"Bearer {token}"})
        w = cls(ws)
        try:
            yield w
        finally:
            w._reader.cancel()
            await ws.close()

    async def _read(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for raw in self.ws:
                msg = json.loads(raw)
                fut = self._waiting.pop(msg.get("reply_to"), None)
                if fut is not None:
                    fut.set_result(msg)
                else:
                    self.pushes.append(msg)
                    self._push_event.set()

    async def call(self, type_: str, *, id: str | None = None, **fields: Any) -> dict[str, Any]:
        msg_id = id or f"{type_}-{self._prefix}-{next(self._ids)}"
        fut = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = fut
        await self.ws.send(json.dumps({"type": type_, "id": msg_id, **fields}))
        return await asyncio.wait_for(fut, 20)

    async def hello(self, *queues: str, node_id: str = "worker-host-1") -> dict[str, Any]:
        r = await self.call("hello", node_id=node_id, queues=list(queues), sdk="tests")
        assert r["ok"], r
        return r

    async def wait_push(self, type_: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            for p in self.pushes:
                if p["type"] == type_:
                    self.pushes.remove(p)
                    return p
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise AssertionError(f"no {type_} push within {timeout}s; got {self.pushes}")
            self._push_event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._push_event.wait(), remaining)
