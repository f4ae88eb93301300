"""A minimal raw-protocol worker used by the benchmarks: claim, start, complete, pipelined.

Also runnable as a worker *process* (the suite starts several, so that worker
CPU is not the benchmark process's):

    ORBIT_BENCH_TOKEN=... python -m bench._worker --urls http://127.0.0.1:8080 --queue QID --sessions 4

With `--sdk` each session is an `orbit.Worker` (the SDK's runtime) instead.
It works until SIGTERM/SIGINT or `--seconds`, then prints one JSON line
{"completed": n, "rate_limited": n, "errors": n}. With `--queues-file` each
session walks its share of many queues (one claim per queue per pass) instead.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
import time
from typing import Any

import orjson
import websockets

from bench._lean import run_lean_session
from orbit.server.ws.corked import CorkedTransport


def run_loop(main: Any) -> Any:
    """uvloop when installed (as the server uses it): worker processes share the machine's
    cores with the server and the database, so their per-frame CPU counts."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


class RawSession:
    """One WebSocket session; replies are matched to requests by message id."""

    def __init__(self, ws, call_timeout: float = 60.0) -> None:
        self.ws = ws
        self.call_timeout = call_timeout
        self._ids = itertools.count()
        self._waiting: dict[str, asyncio.Future] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, token: str, queue_id: str | list[str], node_id: str) -> RawSession:
        ws = await asyncio.wait_for(websockets.connect(
            url.replace("http", "ws", 1) + "/v1/workers/connect",
            additional_headers={"Authorization": f"Bearer {token}"}, max_size=None,
            compression=None), 30)
        # The frames a session sends in one loop iteration (a burst of Starts, of reports) leave
        # in one write, as the server's replies do: the load generator shares the machine's cores.
        ws.transport = CorkedTransport(ws.transport, asyncio.get_running_loop())
        s = cls(ws)
        queues = queue_id if isinstance(queue_id, list) else [queue_id]
        r = await s.call({"type": "hello", "node_id": node_id, "queues": queues, "sdk": "bench"})
        if not r.get("ok"):
            await s.close()
            raise RuntimeError(f"hello refused: {r}")
        return s

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                msg = orjson.loads(raw)
                fut = self._waiting.pop(msg.get("reply_to"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except websockets.ConnectionClosed:
            pass
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("worker session closed"))
            self._waiting.clear()

    async def call(self, frame: dict[str, Any]) -> dict[str, Any]:
        msg_id = frame.get("id") or f"m{next(self._ids)}-{time.monotonic_ns()}"
        frame = {**frame, "id": msg_id}
        fut = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = fut
        await self.ws.send(orjson.dumps(frame).decode())
        try:
            async with asyncio.timeout(self.call_timeout):
                return await fut
        finally:
            self._waiting.pop(msg_id, None)

    async def close(self) -> None:
        self._reader.cancel()
        try:
            await asyncio.wait_for(self.ws.close(), 5)
        except (TimeoutError, OSError):
            pass


class Stats:
    def __init__(self) -> None:
        self.completed = 0
        self.rate_limited = 0
        self.errors = 0


async def _run_lease(s: RawSession, lease: dict[str, Any], stop: asyncio.Event, stats: Stats, counter,
                     handler_ms: float, retry_rate_limited: bool) -> None:
    start_id = f"start-{lease['lease_id']}"
    while True:
        r = await s.call({"type": "start", "id": start_id, "lease_id": lease["lease_id"]})
        if r["ok"]:
            break
        code = r["error"]["code"]
        if retry_rate_limited and code == "RATE_LIMITED" and not stop.is_set():
            stats.rate_limited += 1
            await asyncio.sleep(max(1, r["error"].get("retry_after_ms", 10)) / 1000)
            continue
        if code not in ("RATE_LIMITED", "QUEUE_PAUSED"):
            stats.errors += 1
        await s.call({"type": "release", "lease_id": lease["lease_id"]})
        return
    if handler_ms:
        await asyncio.sleep(handler_ms / 1000)
    d = await s.call({"type": "complete", "lease_id": lease["lease_id"], "outcome": "succeeded", "result": None})
    if d.get("ok"):
        stats.completed += 1
        if counter is not None:
            counter[0] += 1
    else:
        stats.errors += 1


async def run_session(url: str, token: str, queue_id: str, node_id: str, stop: asyncio.Event,
                      max_tasks: int = 50, counter: list[int] | None = None, *, handler_ms: float = 0,
                      retry_rate_limited: bool = False, lease_ms: int = 60000, wait_ms: int = 500,
                      stats: Stats | None = None) -> None:
    """Claim up to `max_tasks`, start and complete each (concurrently), repeat until `stop`
    (on the lean client of bench/_lean.py: this is the drain's hot loop)."""
    await run_lean_session(url, token, queue_id, node_id, stop, stats or Stats(), counter, max_tasks=max_tasks,
                           lease_ms=lease_ms, wait_ms=wait_ms, handler_ms=handler_ms,
                           retry_rate_limited=retry_rate_limited)


async def run_queues_session(url: str, token: str, queue_ids: list[str], node_id: str, stop: asyncio.Event,
                             stats: Stats, max_tasks: int = 10, in_flight: int = 8) -> None:
    """Many queues: one claim per queue per pass (up to `in_flight` queues at once on the session);
    a queue whose claim comes back empty is done."""
    hello = queue_ids[:1000]  # hello names at most 1000 queues; claims may name any visible queue
    s = await RawSession.connect(url, token, hello, node_id)
    sem = asyncio.Semaphore(in_flight)
    pending = list(queue_ids)

    async def one(qid: str) -> bool:
        async with sem:
            if stop.is_set():
                return True
            r = await s.call({"type": "claim", "queue_id": qid, "max_tasks": max_tasks, "wait_ms": 0,
                              "lease_ms": 60000})
            if r["ok"] and r["tasks"]:
                await asyncio.gather(*(_run_lease(s, t, stop, stats, None, 0, False) for t in r["tasks"]))
                return True
            if not r["ok"]:
                stats.errors += 1
                return True
            return False

    try:
        while pending and not stop.is_set():
            again = await asyncio.gather(*(one(q) for q in pending))
            pending = [q for q, more in zip(pending, again) if more]
        await stop.wait()
    finally:
        await s.close()


def _sdk_worker(url: str, token: str, queue_id: str, node_id: str, stats: Stats, concurrency: int, lease_ms: int,
                sync: bool) -> Any:
    """An `orbit.Worker` with a no-op handler that counts into `stats`: `async def`, or (`sync`) a
    plain function the SDK runs in its threads."""
    import orbit

    prefetch = os.environ.get("ORBIT_BENCH_PREFETCH")  # unset: the SDK's default
    worker = orbit.Worker(url=url, token=token, queues=[queue_id], concurrency=concurrency, node_id=node_id,
                          lease_ms=lease_ms, claim_wait_ms=500, prefetch=int(prefetch) if prefetch else None)

    if sync:
        @worker.handler
        def handle_sync(task: orbit.TaskContext) -> None:
            stats.completed += 1
    else:
        @worker.handler
        async def handle(task: orbit.TaskContext) -> None:
            stats.completed += 1
    return worker


async def run_sdk_worker(url: str, token: str, queue_id: str, node_id: str, stop: asyncio.Event, stats: Stats,
                         concurrency: int, lease_ms: int, sync: bool = False) -> None:
    """One `orbit.Worker` (the SDK's runtime: its own session, Start, renewals, reports) on this
    loop, for the drain a user's workers would get, until `stop`."""
    worker = _sdk_worker(url, token, queue_id, node_id, stats, concurrency, lease_ms, sync)
    run = asyncio.create_task(worker.arun())
    await asyncio.wait([run, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if not run.done():
        await worker.astop()
    await run


def run_sdk_process(url: str, token: str, queue_id: str, node_id: str, concurrency: int, lease_ms: int,
                    sync: bool = False, seconds: float | None = None) -> Stats:
    """The natural set-up of a user's worker process: one `orbit.Worker` and its blocking `run()`
    (the SDK's own loop and signal handling), until SIGTERM or SIGINT (or `seconds`) has drained it."""
    import threading

    stats = Stats()
    worker = _sdk_worker(url, token, queue_id, node_id, stats, concurrency, lease_ms, sync)
    timer = threading.Timer(seconds, worker.stop) if seconds is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        worker.run()
    finally:
        if timer is not None:
            timer.cancel()
    return stats


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    token = os.environ["ORBIT_BENCH_TOKEN"]
    urls = args.urls.split(",")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stats = Stats()
    if args.queues_file:
        with open(args.queues_file) as f:
            all_ids = [line.strip() for line in f if line.strip()]
        mine = all_ids[args.shard::args.shards]
        coros = [run_queues_session(urls[i % len(urls)], token, mine[i::args.sessions], f"{args.node_prefix}-{i}",
                                    stop, stats, args.max_tasks) for i in range(args.sessions)]
    elif args.sdk:
        coros = [run_sdk_worker(urls[i % len(urls)], token, args.queue, f"{args.node_prefix}-{i}", stop, stats,
                                args.max_tasks, args.lease_ms, sync=args.sync) for i in range(args.sessions)]
    else:
        queues = args.queue.split(",")  # several: the sessions take turns over them
        coros = [run_session(urls[i % len(urls)], token, queues[i % len(queues)], f"{args.node_prefix}-{i}", stop,
                             args.max_tasks, handler_ms=args.handler_ms, retry_rate_limited=args.retry_rate_limited,
                             lease_ms=args.lease_ms, stats=stats) for i in range(args.sessions)]
    tasks = [asyncio.create_task(c) for c in coros]
    done_all = asyncio.create_task(asyncio.wait(tasks))
    await asyncio.wait([done_all, asyncio.create_task(stop.wait())], timeout=args.seconds,
                       return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    _, still = await asyncio.wait(tasks, timeout=args.grace)
    for t in still:
        t.cancel()
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            stats.errors += 1
            print(f"session failed: {t.exception()!r}", file=sys.stderr)
    return {"completed": stats.completed, "rate_limited": stats.rate_limited, "errors": stats.errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urls", required=True, help="comma-separated node base URLs; sessions spread over them")
    ap.add_argument("--queue", help="queue id; comma-separated ids spread the raw sessions over them")
    ap.add_argument("--queues-file", help="one queue id per line: many-queues mode")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--max-tasks", type=int, default=50)
    ap.add_argument("--handler-ms", type=float, default=0)
    ap.add_argument("--sdk", action="store_true", help="run orbit.Worker instances (concurrency = --max-tasks)")
    ap.add_argument("--sync", action="store_true", help="with --sdk: a plain (threaded) handler, not async def")
    ap.add_argument("--retry-rate-limited", action="store_true")
    ap.add_argument("--lease-ms", type=int, default=60000)
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--grace", type=float, default=5)
    ap.add_argument("--node-prefix", default=f"bench-w{os.getpid()}")
    args = ap.parse_args()
    if args.sdk and args.sessions == 1 and not args.queues_file and "," not in args.queue:
        stats = run_sdk_process(args.urls.split(",")[0], os.environ["ORBIT_BENCH_TOKEN"], args.queue,
                                f"{args.node_prefix}-0", args.max_tasks, args.lease_ms, sync=args.sync,
                                seconds=args.seconds)
        result = {"completed": stats.completed, "rate_limited": stats.rate_limited, "errors": stats.errors}
    else:
        result = run_loop(_main(args))
    print(orjson.dumps(result).decode(), flush=True)


if __name__ == "__main__":
    main()
