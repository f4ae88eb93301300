"""Procrastinate + PostgreSQL: the drain and steady-state latency scenarios, as Orbit's.

A dedicated database per run (dropped at the end) gets procrastinate's schema.
Drain: N no-op jobs deferred in bulk (`batch_defer_async`, 5,000 per
statement) before any worker runs; worker processes then run until every job
is `succeeded`. The rate is N over first `started` event to last `succeeded`
event (database clock). Latency: `stamp` jobs deferred at 50% of the measured
drain rate; submit->start is `started.at - deferred.at` from
`procrastinate_events`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

from bench import _proc
from bench._harness import percentile

PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
WORKERS = int(os.environ.get("BENCH_PROCRASTINATE_WORKERS", "4"))  # the best of bench/peer_search.py
CONCURRENCY = int(os.environ.get("BENCH_PROCRASTINATE_CONCURRENCY", "8"))


def _unavailable(ctx, drain: bool, latency: bool, why: str) -> None:
    if drain:
        ctx.add("drain", "procrastinate", "-", status="unavailable", note=why)
    if latency:
        ctx.add("latency", "procrastinate", "-", status="unavailable", note=why)


def _dsn_for(db: str) -> str:
    base, _, _ = PG_URL.rpartition("/")
    return f"{base}/{db}"


async def run(ctx, *, drain: bool, latency: bool) -> None:
    from bench.suite import REPO, open_loop, r1, r2

    try:
        import procrastinate
        import psycopg
    except ImportError as exc:
        _unavailable(ctx, drain, latency, f"not installed (pip install -e '.[bench]'): {exc}")
        return
    try:
        admin = await asyncio.wait_for(psycopg.AsyncConnection.connect(PG_URL, autocommit=True), 10)
    except Exception as exc:  # noqa: BLE001
        _unavailable(ctx, drain, latency, f"PostgreSQL at {PG_URL} unreachable: {exc}")
        return
    name = f"bench_procrastinate_{uuid.uuid4().hex[:8]}"
    try:
        await admin.execute(f"CREATE DATABASE {name}")
    finally:
        await admin.close()

    def drop() -> None:
        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=10) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    undo = _proc.on_cleanup(f"drop postgres database {name}", drop)
    dsn = _dsn_for(name)
    queue = "bench"
    env = {**os.environ, "BENCH_PG_DSN": dsn,
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # A bare app on this run's database for deferring by task name; the workers import bench.peers.procrastinate_app.
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=4))
    procs = []
    n = ctx.sizes.peer_drain_tasks
    case = f"{WORKERS} procs x -c{CONCURRENCY}"
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            noop = app.configure_task("bench.noop", queue=queue)
            t0 = time.perf_counter()
            for i in range(0, n, 5000):
                await noop.batch_defer_async(*({} for _ in range(min(5000, n - i))))
            defer_s = time.perf_counter() - t0
            t_launch = time.perf_counter()
            for i in range(WORKERS):
                procs.append(_proc.spawn(
                    [sys.executable, "-m", "procrastinate", "--app=bench.peers.procrastinate_app.app", "--log-level",
                     "warning", "worker",
                     "-q", queue, "-c", str(CONCURRENCY)],
                    env=env, log_path=str(ctx.log_dir / f"procrastinate-{i}.log"), cwd=str(REPO)))
            deadline = time.perf_counter() + ctx.sizes.drain_timeout
            done = 0
            while time.perf_counter() < deadline:
                cur = await conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
                done = (await cur.fetchone())[0]
                if done >= n:
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a procrastinate worker exited; see its log in the run's log directory")
                await asyncio.sleep(0.25)
            wall = time.perf_counter() - t_launch
            cur = await conn.execute(
                "SELECT EXTRACT(EPOCH FROM (max(at) FILTER (WHERE type = 'succeeded') - "
                "min(at) FILTER (WHERE type = 'started'))) FROM procrastinate_events")
            span = float((await cur.fetchone())[0] or 1e-3)
            rate = done / max(span, 1e-3)
            ctx.facts["procrastinate_drain_per_s"] = rate
            if drain:
                ctx.add("drain", "procrastinate", case, tasks=done, tasks_per_s=r1(rate), wall_tasks_per_s=r1(done / wall),
                        preload_tasks_per_s=r1(n / defer_s), status="ok" if done >= n else "partial",
                        note="" if done >= n else f"timed out after {wall:.0f}s")
            if latency and done >= n:
                stamp = app.configure_task("bench.stamp", queue=queue)

                async def send(k: int, tag: str) -> int:
                    await stamp.batch_defer_async(*({} for _ in range(k)))
                    return k

                points = [(max(1.0, 0.5 * rate), "50% of max")]
                if ctx.sizes.latency_fixed_rate:
                    points.append((ctx.sizes.latency_fixed_rate, "fixed"))
                for target, label in points:
                    cur = await conn.execute("SELECT coalesce(max(id), 0) FROM procrastinate_jobs")
                    first_id = (await cur.fetchone())[0]
                    sent, _ = await open_loop(target, ctx.sizes.latency_seconds, send)
                    end = time.perf_counter() + 60
                    got = 0
                    while time.perf_counter() < end:
                        cur = await conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE id > %s "
                                                 "AND status = 'succeeded'", (first_id,))
                        got = (await cur.fetchone())[0]
                        if got >= sent:
                            break
                        await asyncio.sleep(0.2)
                    cur = await conn.execute(
                        "SELECT EXTRACT(EPOCH FROM (s.at - d.at)) * 1000 FROM procrastinate_events d "
                        "JOIN procrastinate_events s ON s.job_id = d.job_id AND s.type = 'started' "
                        "WHERE d.type = 'deferred' AND d.job_id > %s", (first_id,))
                    lat = [float(x[0]) for x in await cur.fetchall()]
                    ctx.add("latency", "procrastinate", f"{target:.0f}/s ({label})", rate_per_s=r1(target),
                            achieved_per_s=r1(sent / ctx.sizes.latency_seconds), samples=len(lat),
                            p50_ms=r2(percentile(lat, 50)), p99_ms=r2(percentile(lat, 99)),
                            status="ok" if got >= sent else "partial", note="from procrastinate_events")
    finally:
        _proc.stop_many(procs, grace=10)
        await conn.close()
        undo()
