"""A minimal raw-protocol worker used by the benchmarks: claim, start, complete, pipelined."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import websockets


class RawSession:
    """One WebSocket session; replies are matched to requests by message id."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self._ids = itertools.count()
        self._waiting: dict[str, asyncio.Future] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, token: str, queue_id: str, node_id: str) -> "RawSession":
        ws = await websockets.connect(url.replace("http", "ws", 1) + "/v1/workers/connect",
                                      additional_headers={"Authorization": f"Bearer {token}"}, max_size=None)
        s = cls(ws)
        await s.call({"type": "hello", "node_id": node_id, "queues": [queue_id], "sdk": "bench"})
        return s

    async def _read(self) -> None:
        async for raw in self.ws:
            msg = json.loads(raw)
            fut = self._waiting.pop(msg.get("reply_to"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def call(self, frame: dict[str, Any]) -> dict[str, Any]:
        msg_id = frame.get("id") or f"m{next(self._ids)}-{time.monotonic_ns()}"
        frame = {**frame, "id": msg_id}
        fut = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = fut
        await self.ws.send(json.dumps(frame))
        return await fut

    async def close(self) -> None:
        self._reader.cancel()
        await self.ws.close()


async def run_session(url: str, token: str, queue_id: str, node_id: str, stop: asyncio.Event,
                      max_tasks: int = 50, counter: list[int] | None = None) -> None:
    s = await RawSession.connect(url, token, queue_id, node_id)

    async def run_one(lease: dict[str, Any]) -> None:
        r = await s.call({"type": "start", "lease_id": lease["lease_id"]})
        if not r["ok"]:
            await s.call({"type": "release", "lease_id": lease["lease_id"]})
            return
        await s.call({"type": "complete", "lease_id": lease["lease_id"], "outcome": "succeeded", "result": None})
        if counter is not None:
            counter[0] += 1

    try:
        while not stop.is_set():
            r = await s.call({"type": "claim", "queue_id": queue_id, "max_tasks": max_tasks, "wait_ms": 500,
                              "lease_ms": 60000})
            if r["ok"] and r["tasks"]:
                await asyncio.gather(*(run_one(t) for t in r["tasks"]))
    finally:
        await s.close()
