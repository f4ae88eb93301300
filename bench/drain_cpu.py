"""Where the CPU goes in an end-to-end drain: tasks/s, and CPU µs per task of the server and of MariaDB.

    python bench/drain_cpu.py [--tasks 20000] [--processes 2] [--sessions 8] [--py-spy FILE]

Starts a fresh MariaDB database and one `orbit server` (bench/_harness.py), pre-loads
the tasks with batch submits, drains them with raw-protocol worker processes, and
reads the server's and mariadbd's CPU time from /proc before and after. CPU per task
is steadier than tasks/s on a shared machine, so it is the figure to compare changes
by. `--py-spy FILE` records a raw py-spy profile of the server for 6 s mid-drain. Every figure counts
from the first lease, so the worker processes' start-up is not in them. `--sdk`
drains with the SDK's `orbit.Worker` runtime instead of the lean raw-protocol sessions; a
user's natural set-up is `--sdk --sessions 1 --concurrency 64` (add `--sync` for a threaded handler).
`--schema-sql "ALTER TABLE …"` changes the fresh database after its migrations, to measure a
schema change (an index dropped, a column's type) against the current one before writing it.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._db import fetch, wait_first_lease, wait_unfinished  # noqa: E402
from bench._harness import DrainCpu, environment, pid_of  # noqa: E402
from bench.dispatch import _worker_process, preload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=8, help="sessions per worker process")
    ap.add_argument("--py-spy", metavar="FILE")
    ap.add_argument("--py-spy-worker", action="store_true", help="profile the first worker process instead of the server")
    ap.add_argument("--sdk", action="store_true", help="drain with the SDK's orbit.Worker (one per session)")
    ap.add_argument("--concurrency", type=int, default=50, help="with --sdk: each worker's concurrency")
    ap.add_argument("--sync", action="store_true", help="with --sdk: a plain (threaded) handler")
    ap.add_argument("--payload-bytes", type=int, default=0, help="pad every task's payload by this many bytes")
    ap.add_argument("--schema-sql", metavar="SQL", help="run these statements after migrating the fresh database")
    ap.add_argument("--database-url", help="use (and keep) this database instead of a fresh MariaDB one")
    ap.add_argument("--nodes", type=int, default=1, help="server nodes; the worker sessions are spread over them")
    args = ap.parse_args()
    n = args.tasks
    with environment(args.database_url, args.nodes, schema_sql=args.schema_sql) as (urls, creds):
        token = creds["token"]
        c = httpx.Client(base_url=urls[0], headers={"Authorization": f"Bearer {token}"})
        q = c.post("/v1/queues", json={"name": f"cpu-{uuid.uuid4().hex[:6]}", "max_concurrency": 100000,
                                       "rate_per_second": 1000000, "max_unfinished_tasks": 1000000},
                   headers={"Idempotency-Key": uuid.uuid4().hex}).json()["data"]["queue"]["id"]
        load_s = asyncio.run(preload(urls[0], token, q, n, args.payload_bytes))
        server = pid_of("-f", "orbit server")
        if server is None or pid_of("-x", "mariadbd") is None:
            raise SystemExit("drain_cpu: the server or mariadbd does not run on this machine")
        ctx = mp.get_context("spawn")
        rq = ctx.Queue()
        procs = [ctx.Process(target=_worker_process, args=(urls, token, q, args.sessions, 3600, rq, args.sdk,
                                                                args.concurrency, args.sync))
                 for _ in range(args.processes)]
        for p in procs:
            p.start()
        # CPU and time count from the first lease: a worker process's start (interpreter,
        # imports, connecting) costs ~0.3 s of CPU, 20-40 us per task of a 15,000-task drain.
        asyncio.run(wait_first_lease(creds["_database_url"], q, 120))
        cpu = DrainCpu([p.pid for p in procs])
        t0 = time.perf_counter()
        spy = None
        if args.py_spy:
            time.sleep(2)
            target = procs[0].pid if args.py_spy_worker else server
            spy = subprocess.Popen(["py-spy", "record", "-p", str(target), "-d", "6", "-r", "250", "-f", "raw",
                                    "-o", args.py_spy], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        asyncio.run(wait_unfinished(creds["_database_url"], q, 600, 0.02))
        wall = time.perf_counter() - t0
        groups = asyncio.run(_group_sizes(creds["_database_url"], q))
        us = cpu.per_task(n)
        if spy is not None:
            spy.wait()
        for p in procs:
            p.kill()
    print(f"preload {n / load_s:.0f} tasks/s; drain {n / wall:.0f} tasks/s; "
          f"server {us['server_cpu_us_per_task']} us CPU/task; "
          f"mariadb {us['mariadb_cpu_us_per_task']} us CPU/task; "
          f"worker processes {us['workers_cpu_us_per_task']} us CPU/task; tasks per transaction: {groups}")
    print("in the kernel (share of CPU), context switches per task: " + "; ".join(
        f"{who} {us[who + '_system_share']:.0%}, {us[who + '_switches_per_task']:.2f}"
        for who in ("server", "mariadb", "workers")))


async def _group_sizes(url: str, queue_id: str) -> str:
    """Tasks that went through one transaction share its database time: the mean group size
    of the claims (leased_at), Starts (started_at) and reports (ended_at)."""
    out = []
    for stage in ("leased_at", "started_at", "ended_at"):
        (total, distinct), = await fetch(
            url, f"SELECT COUNT(*), COUNT(DISTINCT {stage}) FROM leases WHERE queue_id = %s AND outcome = 'SUCCEEDED'",
            (queue_id,))
        out.append(f"{stage.split('_')[0]} {total / max(1, distinct):.1f}")
    (span_us, done), = await fetch(url, "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(leased_at), MAX(ended_at)), COUNT(*) "
                                 "FROM leases WHERE queue_id = %s AND outcome = 'SUCCEEDED'", (queue_id,))
    out.append(f"first lease->last end {done / max(1e-6, (span_us or 0) / 1e6):.0f} tasks/s")
    rows = await fetch(url, "SELECT TIMESTAMPDIFF(MICROSECOND, leased_at, started_at), "
                       "TIMESTAMPDIFF(MICROSECOND, started_at, ended_at) FROM leases "
                       "WHERE queue_id = %s AND outcome = 'SUCCEEDED'", (queue_id,))
    for i, stage in enumerate(("lease->Start", "Start->end")):
        ms = sorted(r[i] / 1000 for r in rows)
        if ms:
            out.append(f"{stage} p50 {ms[len(ms) // 2]:.1f} ms p90 {ms[len(ms) * 9 // 10]:.1f} ms")
    return ", ".join(out)


if __name__ == "__main__":
    main()
