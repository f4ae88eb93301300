"""End-to-end dispatch: tasks/s from submit to SUCCEEDED with a no-op handler, and submit->Start latency.

    python bench/dispatch.py --tasks 20000 --sessions 8 --nodes 1

Starts a fresh MariaDB database and `orbit server` nodes (see bench/_harness.py),
pre-loads the tasks with batch submits, then drains them with raw-protocol
worker sessions spread over the nodes (in separate worker processes). The
latency figure is measured from the stored history (`leases.started_at -
tasks.created_at`) in a steady phase where tasks are submitted at a fixed rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._db import wait_unfinished  # noqa: E402
from bench._harness import environment, percentile  # noqa: E402
from bench._worker import Stats, run_loop, run_sdk_process, run_sdk_worker, run_session  # noqa: E402


def _worker_process(urls, token, queue_id, sessions, seconds, result_q, sdk: bool = False,
                    concurrency: int = 50, sync: bool = False) -> None:
    """Worker sessions in a process of their own: the bench's lean sessions, or (`sdk`) one
    `orbit.Worker` each (`concurrency`; `sync`: a threaded handler); a single one runs as a
    user's worker process does, in `Worker.run()`."""
    if sdk and sessions == 1:
        run_sdk_process(urls[0], token, queue_id, "bench-w0", concurrency, 60000, sync, seconds=seconds)
        result_q.put(0)
        return
    async def main():
        stop = asyncio.Event()
        counter = [0]
        if sdk:
            stats = Stats()
            coros = [run_sdk_worker(urls[i % len(urls)], token, queue_id, f"bench-w{i}", stop, stats, concurrency,
                                    60000, sync)
                     for i in range(sessions)]
        else:
            coros = [run_session(urls[i % len(urls)], token, queue_id, f"bench-w{i}", stop, counter=counter)
                     for i in range(sessions)]
        tasks = [asyncio.create_task(c) for c in coros]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.wait(tasks, timeout=5)
        result_q.put(counter[0])

    run_loop(main())


async def preload(url: str, token: str, queue_id: str, total: int, payload_bytes: int = 0) -> float:
    """Submit `total` tasks in batches of 500 (each payload padded by `payload_bytes`); seconds taken."""
    pad = {"pad": "x" * payload_bytes} if payload_bytes else {}
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c:
        sem = asyncio.Semaphore(4)

        async def one(b: int) -> None:
            async with sem:
                items = [{"idempotency_key": f"p-{b}-{i}", "payload": {"i": i, **pad}} for i in range(500)]
                r = await c.post(f"/v1/queues/{queue_id}/tasks:batch", json={"tasks": items},
                                 headers={"Idempotency-Key": f"pb-{b}"})
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(b) for b in range(total // 500)))
        return time.perf_counter() - t0


def count_state(db_url: str, queue_id: str, state: str) -> int:
    name = db_url.rsplit("/", 1)[1]
    out = subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-N", name, "-e",
                          f"SELECT COUNT(*) FROM tasks WHERE queue_id='{queue_id}' AND state='{state}'"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def latencies_ms(db_url: str, queue_id: str, since_id: str) -> list[float]:
    name = db_url.rsplit("/", 1)[1]
    out = subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-N", name, "-e",
                          "SELECT TIMESTAMPDIFF(MICROSECOND, t.created_at, l.started_at) FROM tasks t JOIN leases l "
                          f"ON l.task_id=t.id WHERE t.queue_id='{queue_id}' AND l.started_at IS NOT NULL "
                          f"AND t.id > '{since_id}'"],
                         capture_output=True, text=True, check=True)
    return [int(x) / 1000 for x in out.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--steady-rate", type=int, default=200, help="submits/s in the latency phase")
    ap.add_argument("--steady-seconds", type=int, default=10)
    ap.add_argument("--database-url")
    args = ap.parse_args()
    results = []
    with environment(args.database_url, args.nodes) as (urls, creds):
        token = creds["token"]
        c = httpx.Client(base_url=urls[0], headers={"Authorization": f"Bearer {token}"})
        q = c.post("/v1/queues", json={"name": f"dispatch-{uuid.uuid4().hex[:6]}", "max_concurrency": 100000,
                                       "rate_per_second": 1000000, "max_unfinished_tasks": 1000000},
                   headers={"Idempotency-Key": uuid.uuid4().hex}).json()["data"]["queue"]["id"]
        load_s = asyncio.run(preload(urls[0], token, q, args.tasks))
        results.append({"scenario": "preload_batch_submit", "tasks": args.tasks,
                        "tasks_per_s": round(args.tasks / load_s, 1)})
        ctx = mp.get_context("spawn")
        rq = ctx.Queue()
        per = max(1, args.sessions // args.processes)
        t0 = time.perf_counter()
        procs = [ctx.Process(target=_worker_process, args=(urls, token, q, per, 3600, rq)) for _ in range(args.processes)]
        for p in procs:
            p.start()
        asyncio.run(wait_unfinished(creds["_database_url"], q, 600, 0.5))
        drain_s = time.perf_counter() - t0
        done = count_state(creds["_database_url"], q, "SUCCEEDED")
        results.append({"scenario": "drain", "tasks": done, "nodes": args.nodes, "sessions": per * args.processes,
                        "seconds": round(drain_s, 2), "tasks_per_s": round(done / drain_s, 1)})
        # Steady phase: submit at a fixed rate while the workers keep running.
        marker = c.post(f"/v1/queues/{q}/tasks", json={"payload": 0},
                        headers={"Idempotency-Key": uuid.uuid4().hex}).json()["data"]["task"]["id"]
        interval = 1.0 / args.steady_rate
        t_end = time.perf_counter() + args.steady_seconds
        nxt = time.perf_counter()
        n = 0
        while time.perf_counter() < t_end:
            c.post(f"/v1/queues/{q}/tasks", json={"payload": n}, headers={"Idempotency-Key": uuid.uuid4().hex})
            n += 1
            nxt += interval
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        # Wait (bounded) until every task of the phase has started: sampling earlier would leave out
        # exactly the slow ones.
        wait_end = time.perf_counter() + 30
        lat = latencies_ms(creds["_database_url"], q, marker)
        while len(lat) < n and time.perf_counter() < wait_end:
            time.sleep(0.5)
            lat = latencies_ms(creds["_database_url"], q, marker)
        results.append({"scenario": "submit_to_start_latency", "rate_per_s": args.steady_rate, "samples": len(lat),
                        "p50_ms": round(percentile(lat, 50), 2), "p99_ms": round(percentile(lat, 99), 2)})
        for p in procs:
            p.kill()
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
