"""Celery 5 + Redis: the drain and steady-state latency scenarios, as Orbit's.

Drain: N no-op tasks are published before any worker runs; then the worker
processes start and the queue is polled (`LLEN` of the queue plus the
`unacked` hash of the Redis transport) until nothing is left. The rate is N
over the time from the first acknowledgement seen to the last.

Latency: a `stamp` task carries its send time; its body pushes
`start - sent` to a Redis list. Offered at 50% of the measured drain rate.

Note: Redis on this machine keeps nothing on disk (no AOF, no RDB), so this
peer does no durable write per task; Orbit and Procrastinate commit to disk.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid

from bench import _proc
from bench._harness import percentile

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
WORKERS = int(os.environ.get("BENCH_CELERY_WORKERS", "2"))
CONCURRENCY = int(os.environ.get("BENCH_CELERY_CONCURRENCY", "1"))
POOL = os.environ.get("BENCH_CELERY_POOL", "solo")
PREFETCH = os.environ.get("BENCH_CELERY_PREFETCH", "4")  # the best of bench/peer_search.py


def _unavailable(ctx, drain: bool, latency: bool, why: str) -> None:
    if drain:
        ctx.add("drain", "celery+redis", "-", status="unavailable", note=why)
    if latency:
        ctx.add("latency", "celery+redis", "-", status="unavailable", note=why)


def _remaining(r, queue: str) -> int:
    n = 0
    for key in r.scan_iter(match=f"{queue}*", count=100):
        if r.type(key) == b"list":
            n += r.llen(key)
    return n + r.hlen("unacked")


async def run(ctx, *, drain: bool, latency: bool) -> None:
    from bench.suite import REPO, open_loop, r1, r2

    try:
        import celery  # noqa: F401
        import redis
    except ImportError as exc:
        _unavailable(ctx, drain, latency, f"not installed (pip install -e '.[bench]'): {exc}")
        return
    r = redis.Redis.from_url(REDIS_URL, socket_timeout=10, socket_connect_timeout=3)
    try:
        r.ping()
    except Exception as exc:  # noqa: BLE001
        _unavailable(ctx, drain, latency, f"Redis at {REDIS_URL} unreachable: {exc}")
        return
    if r.hlen("unacked"):
        _unavailable(ctx, drain, latency, f"Redis {REDIS_URL} has foreign unacked messages; set BENCH_REDIS_URL")
        return
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    lat_key = f"bench:latency:{queue}"

    def cleanup() -> None:
        keys = list(r.scan_iter(match=f"{queue}*")) + list(r.scan_iter(match=f"*{queue}*"))
        keys += [lat_key]
        if keys:
            r.delete(*set(keys))
        if not r.hlen("unacked"):
            r.delete("unacked", "unacked_index", "unacked_mutex")

    undo = _proc.on_cleanup(f"redis keys of {queue}", cleanup)
    env = {**os.environ, "BENCH_REDIS_URL": REDIS_URL, "BENCH_CELERY_QUEUE": queue, "BENCH_CELERY_PREFETCH": PREFETCH,
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # The app module reads its queue name at import: import it with this run's environment.
    os.environ["BENCH_REDIS_URL"], os.environ["BENCH_CELERY_QUEUE"] = REDIS_URL, queue
    sys.modules.pop("bench.peers.celery_app", None)
    from bench.peers import celery_app as capp

    procs = []
    n = ctx.sizes.peer_drain_tasks
    case = f"{WORKERS}x {POOL} -c{CONCURRENCY}, prefetch {PREFETCH}"
    try:
        t0 = time.perf_counter()
        await asyncio.to_thread(_publish_noops, capp, queue, n)
        publish_s = time.perf_counter() - t0
        t_launch = time.perf_counter()
        for i in range(WORKERS):
            procs.append(_proc.spawn(
                [sys.executable, "-m", "celery", "-A", "bench.peers.celery_app", "worker", "-Q", queue,
                 "-c", str(CONCURRENCY), "-P", POOL, "-n", f"bench{i}-{queue}@%h", "--without-gossip",
                 "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
                env=env, log_path=str(ctx.log_dir / f"celery-{i}.log"), cwd=str(REPO)))
        t_first = t_done = None
        deadline = time.perf_counter() + ctx.sizes.drain_timeout
        left = n
        while time.perf_counter() < deadline:
            left = await asyncio.to_thread(_remaining, r, queue)
            now = time.perf_counter()
            if t_first is None and left < n:
                t_first = now
            if left == 0:
                t_done = now
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a celery worker exited; see its log in the run's log directory")
            await asyncio.sleep(0.05)
        done = n - left
        active = (t_done or time.perf_counter()) - (t_first or t_launch)
        rate = done / max(active, 1e-3)
        ctx.facts["celery_drain_per_s"] = rate
        if drain:
            ctx.add("drain", "celery+redis", case, tasks=done, tasks_per_s=r1(rate),
                    wall_tasks_per_s=r1(done / ((t_done or time.perf_counter()) - t_launch)),
                    preload_tasks_per_s=r1(n / publish_s), status="ok" if t_done else "partial",
                    note="broker not durable (Redis without AOF/RDB)")
        if latency and t_done:
            points = [(max(1.0, 0.5 * rate), "50% of max")]
            if ctx.sizes.latency_fixed_rate:
                points.append((ctx.sizes.latency_fixed_rate, "fixed"))
            for target, label in points:
                r.delete(lat_key)
                sent, _ = await open_loop(target, ctx.sizes.latency_seconds,
                                          lambda k, tag: asyncio.to_thread(_publish_stamps, capp, queue, k))
                end = time.perf_counter() + 60
                while time.perf_counter() < end and r.llen(lat_key) < sent:
                    await asyncio.sleep(0.1)
                lat = [float(x) for x in r.lrange(lat_key, 0, -1)]
                ctx.add("latency", "celery+redis", f"{target:.0f}/s ({label})", rate_per_s=r1(target),
                        achieved_per_s=r1(sent / ctx.sizes.latency_seconds), samples=len(lat),
                        p50_ms=r2(percentile(lat, 50)), p99_ms=r2(percentile(lat, 99)),
                        status="ok" if len(lat) >= sent else "partial",
                        note="from time.time() in the task body")
    finally:
        _proc.stop_many(procs, grace=10)
        undo()


def _publish_noops(capp, queue: str, n: int) -> None:
    with capp.app.producer_or_acquire() as producer:
        for _ in range(n):
            capp.noop.apply_async(queue=queue, producer=producer)


def _publish_stamps(capp, queue: str, k: int) -> int:
    with capp.app.producer_or_acquire() as producer:
        for _ in range(k):
            capp.stamp.apply_async((time.time(),), queue=queue, producer=producer)
    return k
