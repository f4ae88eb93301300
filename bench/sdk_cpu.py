"""The SDK worker's own CPU per task, without a database or an Orbit server: one `orbit.Worker`
(a user's natural set-up: `run()`, one process, an async no-op handler) against a stand-in
server that answers every command at once.

    python bench/sdk_cpu.py [--tasks 30000] [--concurrency 64] [--sync] [--repeat 3]

On the shared two-core machine the worker's CPU is taken from the server and MariaDB, so the
SDK's drain moves with it; `bench/drain_cpu.py --sdk` measures it end to end, with the noise
of the whole system. Here the stand-in costs the worker nothing it would not pay against a
real server (the same frames, leases shaped as the protocol's), and the figure is steady
enough to compare two versions of the SDK by. CPU counts from the first claim to the last
report, read from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import sys
import time
import uuid
from pathlib import Path

import orjson
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._harness import cpu_seconds  # noqa: E402


def _worker_main(url: str, concurrency: int, sync: bool) -> None:
    import orbit

    if (os.cpu_count() or 1) >= 2:  # a core of its own: the stand-in's scheduling does not move its figure
        os.sched_setaffinity(0, {1})

    worker = orbit.Worker(url=url, token="bench", queues=["q-bench"], concurrency=concurrency, node_id="sdk-cpu",
                          lease_ms=60000, claim_wait_ms=500)
    if sync:
        @worker.handler
        def handle_sync(task: orbit.TaskContext) -> None:
            return None
    else:
        @worker.handler
        async def handle(task: orbit.TaskContext) -> None:
            return None
    profile = os.environ.get("ORBIT_BENCH_CPROFILE")
    if not profile:
        worker.run()
        return
    import cProfile

    cProfile.runctx("worker.run()", globals(), {"worker": worker}, f"{profile}.{os.getpid()}")


class StandIn:
    """Answers hello, claim, start, renew, complete and release as a server would, at once."""

    def __init__(self, tasks: int) -> None:
        self.left = tasks
        self.reported = 0
        self.tasks = tasks
        self.first_claim = asyncio.Event()
        self.done = asyncio.Event()

    async def serve(self, ws) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            await self._serve(ws)

    async def _serve(self, ws) -> None:
        out: list[str] = []

        def answer(reply: dict) -> None:
            # Replies leave together, as a server's group commit answers them, not one by one.
            out.append(orjson.dumps(reply).decode())
            if len(out) == 1:
                asyncio.get_running_loop().call_later(0.002, lambda: asyncio.ensure_future(_flush()))

        async def _flush() -> None:
            batch = out[:]
            del out[:]
            with contextlib.suppress(websockets.ConnectionClosed):
                for m in batch:
                    await ws.send(m)

        async for raw in ws:
            msg = orjson.loads(raw)
            kind, msg_id = msg["type"], msg["id"]
            reply: dict = {"reply_to": msg_id, "ok": True}
            if kind == "hello":
                reply.update(session_id=uuid.uuid4().hex, default_lease_ms=30000, max_lease_ms=600000,
                             heartbeat_ms=10000)
            elif kind == "claim":
                self.first_claim.set()
                n = min(msg["max_tasks"], self.left)
                self.left -= n
                reply["tasks"] = [_lease() for _ in range(n)]
                if not n:  # a long poll that finds nothing: answered after its wait, the other frames meanwhile
                    asyncio.get_running_loop().call_later(msg.get("wait_ms", 0) / 1000, answer, reply)
                    continue
            elif kind == "start":
                reply.update(attempt=1, started_at="2026-12-04T12:00:00.000000Z",
                             start_receipt_id=uuid.uuid4().hex, deadline_at=None)
            elif kind == "renew":
                reply.update(lease_expires_at="2026-12-04T12:01:00.000000Z", cancel_requested=False)
            elif kind == "complete":
                reply["task_state"] = "SUCCEEDED"
                self.reported += 1
                if self.reported >= self.tasks:
                    self.done.set()
            answer(reply)


def _lease() -> dict:
    task_id = uuid.uuid4().hex
    return {"lease_id": uuid.uuid4().hex, "task_id": task_id, "queue_id": "q-bench", "attempt": 1,
            "payload": {"n": task_id[:8]}, "priority": 0, "lease_expires_at": "2026-12-04T12:01:00.000000Z",
            "start_deadline_at": None, "deadline_at": None, "resource_keys": [],
            "created_at": "2026-12-04T12:00:00.000000Z"}


async def one_run(tasks: int, concurrency: int, sync: bool) -> tuple[float, float]:
    """(worker CPU µs per task, tasks/s) of one worker process draining `tasks`."""
    stand_in = StandIn(tasks)
    async with websockets.serve(stand_in.serve, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        proc = mp.get_context("spawn").Process(target=_worker_main, args=(f"http://127.0.0.1:{port}", concurrency,
                                                                          sync))
        proc.start()
        try:
            await asyncio.wait_for(stand_in.first_claim.wait(), 60)
            cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
            await asyncio.wait_for(stand_in.done.wait(), 600)
            cpu1, t1 = cpu_seconds(proc.pid), time.perf_counter()
            proc.terminate()  # a drain, answered here
            await asyncio.to_thread(proc.join, 30)
        finally:
            proc.kill()
            proc.join(10)
    return (cpu1 - cpu0) / tasks * 1e6, tasks / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=30000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--sync", action="store_true", help="a plain (threaded) handler")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {0})
    for _ in range(args.repeat):
        us, rate = asyncio.run(one_run(args.tasks, args.concurrency, args.sync))
        print(f"worker {us:.1f} us CPU/task; {rate:.0f} tasks/s (handler: {'sync' if args.sync else 'async'}, "
              f"concurrency {args.concurrency}, pid {os.getpid()})", flush=True)


if __name__ == "__main__":
    main()
