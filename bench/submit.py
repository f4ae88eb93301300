"""Submit throughput: single submits (concurrent clients) and batch submits (500 per request).

    python bench/submit.py                       # fresh MariaDB database + one orbit server node
    python bench/submit.py --url URL --credentials FILE   # against a running server

Prints tasks/s and per-request latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._http import like  # noqa: E402
from bench._harness import cpu_seconds, environment, percentile, pid_of  # noqa: E402


async def make_queue(client: httpx.AsyncClient) -> str:
    r = await client.post(
        "/v1/queues",
        json={"name": f"bench-{uuid.uuid4().hex[:8]}", "max_concurrency": 100, "rate_per_second": 1000,
              "max_unfinished_tasks": 1_000_000},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    r.raise_for_status()
    return r.json()["data"]["queue"]["id"]


async def single(client: httpx.AsyncClient, queue_id: str, total: int, concurrency: int) -> dict:
    latencies: list[float] = []
    counter = iter(range(total))
    errors = 0

    async def worker() -> None:
        nonlocal errors
        conn = like(client)
        try:
            for i in counter:
                t0 = time.perf_counter()
                status, _ = await conn.post(f"/v1/queues/{queue_id}/tasks", {"payload": {"i": i}},
                                            {"Idempotency-Key": f"s-{uuid.uuid4().hex}"})
                latencies.append((time.perf_counter() - t0) * 1000)
                if status != 201:
                    errors += 1
        finally:
            await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {"scenario": "single_submit", "tasks": total, "concurrency": concurrency, "seconds": round(elapsed, 3),
            "tasks_per_s": round(total / elapsed, 1), "p50_ms": round(percentile(latencies, 50), 2),
            "p99_ms": round(percentile(latencies, 99), 2), "errors": errors}


async def batch(client: httpx.AsyncClient, queue_id: str, batches: int, size: int, concurrency: int) -> dict:
    latencies: list[float] = []
    counter = iter(range(batches))
    errors = 0

    async def worker() -> None:
        nonlocal errors
        conn = like(client)
        try:
            for b in counter:
                items = [{"idempotency_key": f"b-{uuid.uuid4().hex}", "payload": {"b": b, "i": i}} for i in range(size)]
                t0 = time.perf_counter()
                status, body = await conn.post(f"/v1/queues/{queue_id}/tasks:batch", {"tasks": items},
                                               {"Idempotency-Key": uuid.uuid4().hex})
                latencies.append((time.perf_counter() - t0) * 1000)
                if status != 200 or b'{"error":' in body:
                    errors += 1
        finally:
            await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    total = batches * size
    return {"scenario": "batch_submit", "tasks": total, "batch_size": size, "concurrency": concurrency,
            "seconds": round(elapsed, 3), "tasks_per_s": round(total / elapsed, 1),
            "p50_ms_per_batch": round(percentile(latencies, 50), 2),
            "p99_ms_per_batch": round(percentile(latencies, 99), 2), "errors": errors}


async def run(urls: list[str], token: str, args) -> list[dict]:
    limits = httpx.Limits(max_connections=args.concurrency * 2, max_keepalive_connections=args.concurrency * 2)
    async with httpx.AsyncClient(base_url=urls[0], headers={"Authorization": f"Bearer {token}"},
                                 timeout=60, limits=limits) as client:
        queue_id = await make_queue(client)
        await single(client, queue_id, min(200, args.single), 8)  # warm-up
        with server_cpu(args.py_spy_single) as cpu:
            results = [await single(client, queue_id, args.single, args.concurrency)]
        results[-1].update({k: round(v * 1e6 / results[-1]["tasks"], 1) for k, v in cpu.items()})
        with server_cpu(args.py_spy) as cpu:
            results.append(await batch(client, queue_id, args.batches, args.batch_size, args.batch_concurrency))
        results[-1].update({k: round(v * 1e6 / results[-1]["tasks"], 1) for k, v in cpu.items()})
    return results


@contextlib.contextmanager
def server_cpu(py_spy: str | None):
    """CPU seconds the local server and MariaDB spend inside the block (keys *_cpu_us_per_task once
    divided), and optionally a raw py-spy profile of the server for its first 6 s."""
    pids = {"server_cpu_us_per_task": pid_of("-f", "orbit server"), "mariadb_cpu_us_per_task": pid_of("-x", "mariadbd")}
    pids = {k: v for k, v in pids.items() if v}
    spy = None
    if py_spy and pids.get("server_cpu_us_per_task"):
        spy = subprocess.Popen(["py-spy", "record", "-p", str(pids["server_cpu_us_per_task"]), "-d", "6", "-r", "250",
                                "-f", "raw", "-o", py_spy], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = {k: cpu_seconds(v) for k, v in pids.items()}
    out: dict[str, float] = {}
    yield out
    out.update({k: cpu_seconds(v) - before[k] for k, v in pids.items()})
    if spy:
        spy.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--credentials", type=Path)
    ap.add_argument("--database-url", help="use this database instead of a fresh MariaDB one")
    ap.add_argument("--single", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--batch-concurrency", type=int, default=4)
    ap.add_argument("--py-spy", metavar="FILE", help="record a raw py-spy profile of the server during batch submits")
    ap.add_argument("--py-spy-single", metavar="FILE", help="the same during single submits")
    ap.add_argument("--schema-sql", metavar="SQL", help="run these statements after migrating the fresh database "
                    "(to measure a schema change before writing its migration)")
    args = ap.parse_args()
    if args.url:
        token = json.loads(args.credentials.read_text())["token"]
        results = asyncio.run(run([args.url], token, args))
    else:
        with environment(args.database_url, schema_sql=args.schema_sql) as (urls, creds):
            results = asyncio.run(run(urls, creds["token"], args))
    for r in results:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
