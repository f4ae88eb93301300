"""The Orbit scenarios of the benchmark suite (peers live in bench/peers/).

Each scenario starts what it needs (a fresh MariaDB database, `orbit server`
nodes, worker processes), is bounded in time, records result rows in the
`Context`, and leaves nothing running: servers and workers are stopped and the
database dropped even when it fails or times out.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import _proc
from bench._db import Conn, preload_waiting, wait_first_lease
from bench._http import RawPool
from bench._harness import (
    DrainCpu,
    cpu_seconds,
    create_mysql_database,
    drop_mysql_database,
    environment,
    mysql,
    percentile,
    pid_of,
)
from orbit.server.store.queries.leases import STARTED_AT
from tests.support.history import max_overlap
from tests.support.history import rate_windows as windows

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ sizes


@dataclass
class Sizes:
    single_submits: int
    single_concurrency: int
    batches: int
    batch_size: int
    batch_concurrency: int
    drain_tasks: int
    worker_processes: int
    sessions_per_process: int
    claim_max_tasks: int
    latency_seconds: float
    latency_fixed_rate: float  # a second latency point at the same offered rate for every system (0: skip)
    latency_tick_ms: float  # the open loop offers what is due every tick (smaller: smoother arrivals)
    backlogs: list[int]
    backlog_samples: int
    backlog_sample_seconds: float
    queues: int
    limits_concurrency: int
    limits_rate: int
    limits_seconds: float
    limits_handler_ms: float
    ceiling_seconds: float
    ceiling_processes: int
    ceiling_connections: int
    drain_timeout: float
    peer_drain_tasks: int
    # controls: application quotas and resource keys near saturation
    controls_tasks: int
    controls_queues: int
    controls_keys: int
    controls_key_concurrency: int  # M: every key's max_concurrency
    controls_hot_keys: int  # the first keys, named by a share of the tasks' key slots
    controls_hot_share: float
    controls_concurrency: int  # N: the application's max_concurrency, below what the sessions would take
    controls_rate: int  # R: the application's Starts/s, well above what the machine reaches
    controls_claim_max_tasks: int
    controls_handler_ms: float
    controls_drain_timeout: float
    # schedules: N interval schedules firing every second on 2 nodes, no workers
    schedules: int
    schedules_queues: int  # the schedules spread over these, so that no queue's backlog nears its limit
    schedules_create_concurrency: int  # concurrent POST /v1/schedules, over both nodes
    schedules_warmup_seconds: float
    schedules_window_seconds: float


QUICK = Sizes(
    single_submits=1000, single_concurrency=32, batches=60, batch_size=500, batch_concurrency=4,
    drain_tasks=20_000, worker_processes=2, sessions_per_process=8, claim_max_tasks=50, latency_seconds=10, latency_fixed_rate=50, latency_tick_ms=20,
    backlogs=[0, 10_000, 100_000], backlog_samples=100, backlog_sample_seconds=15,
    queues=300, limits_concurrency=8, limits_rate=50, limits_seconds=10, limits_handler_ms=50,
    ceiling_seconds=5, ceiling_processes=2, ceiling_connections=16, drain_timeout=240, peer_drain_tasks=5000,
    controls_tasks=5000, controls_queues=3, controls_keys=1000, controls_key_concurrency=3, controls_hot_keys=10,
    controls_hot_share=0.3, controls_concurrency=120, controls_rate=100_000, controls_claim_max_tasks=8,
    controls_handler_ms=0, controls_drain_timeout=200,
    schedules=1000, schedules_queues=10, schedules_create_concurrency=8, schedules_warmup_seconds=5,
    schedules_window_seconds=10,
)
FULL = Sizes(
    single_submits=10_000, single_concurrency=32, batches=200, batch_size=500, batch_concurrency=4,
    drain_tasks=100_000, worker_processes=2, sessions_per_process=8, claim_max_tasks=50, latency_seconds=30, latency_fixed_rate=50, latency_tick_ms=20,
    backlogs=[0, 100_000, 1_000_000], backlog_samples=500, backlog_sample_seconds=60,
    queues=10_000, limits_concurrency=32, limits_rate=200, limits_seconds=30, limits_handler_ms=50,
    ceiling_seconds=15, ceiling_processes=2, ceiling_connections=16, drain_timeout=1800, peer_drain_tasks=100_000,
    controls_tasks=50_000, controls_queues=3, controls_keys=1000, controls_key_concurrency=3, controls_hot_keys=10,
    controls_hot_share=0.3, controls_concurrency=120, controls_rate=100_000, controls_claim_max_tasks=8,
    controls_handler_ms=0, controls_drain_timeout=1500,
    schedules=10_000, schedules_queues=10, schedules_create_concurrency=8, schedules_warmup_seconds=10,
    schedules_window_seconds=30,
)

def override(sizes: Sizes, items: list[str]) -> Sizes:
    """`name=value` overrides of a Sizes (lists comma-separated)."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(Sizes)}
    changes: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in fields:
            raise ValueError(f"{item!r}: expected NAME=VALUE with NAME one of {', '.join(fields)}")
        current = getattr(sizes, name)
        try:
            if isinstance(current, list):
                changes[name] = [int(x.replace("_", "")) for x in value.split(",") if x.strip()]
            else:
                changes[name] = type(current)(value.replace("_", ""))
        except ValueError:
            raise ValueError(f"{item!r}: not a valid {type(current).__name__}") from None
    return dataclasses.replace(sizes, **changes)


# Run order; `latency` runs inside the drain scenario (it needs the measured drain rate and running workers).
SCENARIOS = ["db-ceiling", "submit", "drain", "latency", "backlog", "many-queues", "limits", "controls",
             "schedules"]


@dataclass
class Row:
    scenario: str
    system: str
    case: str
    metrics: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"  # ok | error | unavailable | partial
    note: str = ""


class Context:
    def __init__(self, mode: str, sizes: Sizes, selected: list[str], peers: list[str], log_dir: Path) -> None:
        self.mode = mode
        self.sizes = sizes
        self.selected = selected
        self.peers = peers
        self.log_dir = log_dir
        self.rows: list[Row] = []
        self.facts: dict[str, Any] = {}
        self.started = time.time()

    def add(self, scenario: str, system: str, case: str, status: str = "ok", note: str = "", **metrics: Any) -> Row:
        note = " ".join(str(note).split())
        row = Row(scenario, system, case, metrics, status, note)
        self.rows.append(row)
        shown = ", ".join(f"{k}={v}" for k, v in metrics.items())
        print(f"[bench] {scenario:<12} {system:<14} {case:<24} {status:<8} {shown} {note}".rstrip(), flush=True)
        return row

    def wants(self, name: str) -> bool:
        return name in self.selected

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.started)),
            "seconds": round(time.time() - self.started, 1),
            "machine": machine_facts(),
            "sizes": asdict(self.sizes),
            "scenarios": self.selected,
            "peers": self.peers,
            "results": [asdict(r) for r in self.rows],
            "facts": self.facts,
        }


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {"host": socket.gethostname(), "cpus": os.cpu_count(), "python": platform.python_version(),
                             "platform": platform.platform()}
    try:
        facts["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    try:
        out = mysql("SELECT VERSION(), @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@log_bin, "
                    "@@innodb_buffer_pool_size", timeout=10).split("\t")
        facts["mariadb"] = {"version": out[0], "innodb_flush_log_at_trx_commit": out[1], "sync_binlog": out[2],
                            "log_bin": out[3], "innodb_buffer_pool_size": out[4].strip()}
    except Exception as exc:  # noqa: BLE001
        facts["mariadb"] = f"unavailable: {exc}"
    return facts


# ------------------------------------------------------------------ helpers


def api(url: str, token: str, concurrency: int = 32, timeout: float = 60) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout,
                             limits=limits)


async def create_queue(client: httpx.AsyncClient, name: str, max_concurrency: int = 100_000,
                       rate_per_second: int = 1_000_000, max_unfinished_tasks: int = 1_000_000) -> str:
    r = await client.post("/v1/queues", json={"name": name, "max_concurrency": max_concurrency,
                                              "rate_per_second": rate_per_second,
                                              "max_unfinished_tasks": max_unfinished_tasks},
                          headers={"Idempotency-Key": uuid.uuid4().hex})
    r.raise_for_status()
    return r.json()["data"]["queue"]["id"]


async def api_preload(client: httpx.AsyncClient, queue_id: str, total: int, size: int = 500,
                      concurrency: int = 4) -> float:
    """Pre-load with batch submits (each item its own identity); returns seconds."""
    sem = asyncio.Semaphore(concurrency)
    tag = uuid.uuid4().hex[:8]

    async def one(b: int, n: int) -> None:
        async with sem:
            items = [{"idempotency_key": f"p-{tag}-{b}-{i}", "payload": {"i": i}} for i in range(n)]
            r = await client.post(f"/v1/queues/{queue_id}/tasks:batch", json={"tasks": items},
                                  headers={"Idempotency-Key": f"pb-{tag}-{b}"})
            r.raise_for_status()
            bad = [x for x in r.json()["data"]["results"] if "error" in x]
            if bad:
                raise RuntimeError(f"pre-load refused {len(bad)} items: {bad[0]['error']}")

    t0 = time.perf_counter()
    sizes = [size] * (total // size) + ([total % size] if total % size else [])
    await asyncio.gather(*(one(b, n) for b, n in enumerate(sizes)))
    return time.perf_counter() - t0


def spawn_workers(ctx: Context, urls: list[str], token: str, name: str, *, queue_id: str | None = None,
                  queues_file: str | None = None, processes: int | None = None, sessions: int | None = None,
                  extra: list[str] | None = None, max_tasks: int | None = None) -> list:
    """Worker processes (bench/_worker.py) with raw-protocol sessions spread over the nodes."""
    processes = processes or ctx.sizes.worker_processes
    sessions = sessions or ctx.sizes.sessions_per_process
    env = {**os.environ, "ORBIT_BENCH_TOKEN": token,
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    procs = []
    for i in range(processes):
        args = [sys.executable, "-m", "bench._worker", "--urls", ",".join(urls[i % len(urls):] + urls[:i % len(urls)]),
                "--sessions", str(sessions), "--node-prefix", f"{name}-p{i}", "--max-tasks",
                str(max_tasks or ctx.sizes.claim_max_tasks), "--seconds", "7200"]
        if queue_id:
            args += ["--queue", queue_id]
        if queues_file:
            args += ["--queues-file", queues_file, "--shard", str(i), "--shards", str(processes)]
        args += extra or []
        procs.append(_proc.spawn(args, env=env, log_path=str(ctx.log_dir / f"{name}-worker-{i}.log"), cwd=str(REPO)))
    return procs


def worker_outcomes(ctx: Context, name: str, count: int) -> dict[str, int]:
    total = {"completed": 0, "rate_limited": 0, "errors": 0}
    for i in range(count):
        path = ctx.log_dir / f"{name}-worker-{i}.log"
        try:
            lines = [x for x in path.read_text().splitlines() if x.startswith("{")]
            for k, v in json.loads(lines[-1]).items():
                total[k] = total.get(k, 0) + v
        except (OSError, IndexError, ValueError):
            total["errors"] += 0
    return total


# 1 once a queue has no unfinished task: a drain's progress from one row, where counting its
# finished tasks would scan an index range growing with the drain, on the database being measured.
DRAINED = "SELECT unfinished = 0 FROM queue_usage WHERE queue_id = %s"
async def wait_count(db: Conn, sql: str, params: tuple, target: int, timeout: float,
                     interval: float = 0.25) -> tuple[int, float]:
    """Poll `sql` (a COUNT) until it reaches `target` or `timeout`; returns (count, seconds)."""
    t0 = time.perf_counter()
    n = 0
    while True:
        n = int(await db.scalar(sql, params) or 0)
        if n >= target or time.perf_counter() - t0 > timeout:
            return n, time.perf_counter() - t0
        await asyncio.sleep(interval)


def r1(x: float) -> float:
    return round(x, 1)


def r2(x: float) -> float:
    return round(x, 2)


# ------------------------------------------------------------------ database ceiling


async def db_ceiling(ctx: Context) -> None:
    s = ctx.sizes
    url = create_mysql_database("orbit_bench_ceiling")
    try:
        from bench._ceiling import TABLE_DDL

        mysql(TABLE_DDL, database=url.rsplit("/", 1)[1], timeout=30)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        for mode in ("single", "batch"):
            conns = s.ceiling_connections if mode == "single" else 2
            procs = []
            for i in range(s.ceiling_processes):
                procs.append(_proc.spawn(
                    [sys.executable, "-m", "bench._ceiling", "--database-url", url, "--mode", mode,
                     "--connections", str(conns), "--seconds", str(s.ceiling_seconds)],
                    env=env, log_path=str(ctx.log_dir / f"ceiling-{mode}-{i}.log"), cwd=str(REPO)))
            deadline = time.monotonic() + s.ceiling_seconds + 90
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            _proc.stop_many(procs, grace=1)
            rows = commits = 0
            secs = 0.0
            for i in range(s.ceiling_processes):
                lines = [x for x in (ctx.log_dir / f"ceiling-{mode}-{i}.log").read_text().splitlines()
                         if x.startswith("{")]
                if not lines:
                    raise RuntimeError(f"ceiling process {mode}-{i} printed no result")
                d = json.loads(lines[-1])
                rows += d["rows"]
                commits += d["commits"]
                secs = max(secs, d["seconds"])
            total_conns = conns * s.ceiling_processes
            if mode == "single":
                rate = commits / secs
                _best(ctx, "ceiling_single_commits_per_s", rate)
                ctx.add("db-ceiling", "mariadb", f"1-row commits, asyncmy x{total_conns}", commits_per_s=r1(rate))
            else:
                rate = rows / secs
                _best(ctx, "ceiling_batch_rows_per_s", rate)
                ctx.add("db-ceiling", "mariadb", f"500-row INSERTs, asyncmy x{total_conns}", rows_per_s=r1(rate),
                        commits_per_s=r1(commits / secs))
        await _slap(ctx, url)
    finally:
        drop_mysql_database(url)


def _best(ctx: Context, key: str, value: float) -> None:
    ctx.facts[key] = max(value, ctx.facts.get(key, 0.0))


async def _slap(ctx: Context, url: str) -> None:
    """The same inserts from MariaDB's C load client, when installed: the database's limit, not Python's."""
    from bench._ceiling import INSERT, ROW_SQL
    from bench._harness import mysql_params

    exe = shutil.which("mariadb-slap") or shutil.which("mysqlslap")
    if not exe:
        ctx.add("db-ceiling", "mariadb", "mariadb-slap", status="unavailable", note="mariadb-slap not installed")
        return
    p = mysql_params(url)
    base = [exe, f"-u{p['user']}", f"-h{p['host']}", f"-P{p['port']}", f"--create-schema={p['db']}"]
    if p["password"]:
        base.append(f"-p{p['password']}")
    s = ctx.sizes
    # Sized from the asyncmy figures so that each run lasts about ceiling_seconds.
    single_q = int(max(5000, 2.5 * ctx.facts.get("ceiling_single_commits_per_s", 4000) * s.ceiling_seconds))
    batch_q = int(max(100, 1.5 * ctx.facts.get("ceiling_batch_rows_per_s", 40000) * s.ceiling_seconds / 500))
    for label, conc, queries, sql, rows_per in (
        ("1-row commits, mariadb-slap x32", 32, single_q, INSERT + ROW_SQL, 1),
        ("500-row INSERTs, mariadb-slap x4", 4, batch_q, INSERT + ", ".join([ROW_SQL] * 500), 500),
    ):
        proc = await asyncio.create_subprocess_exec(
            *base, f"--concurrency={conc}", f"--number-of-queries={queries}", f"--query={sql}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), s.ceiling_seconds * 6 + 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            ctx.add("db-ceiling", "mariadb", label, status="error", note="mariadb-slap timed out")
            continue
        secs = None
        for line in out.decode(errors="replace").splitlines():
            if "Average number of seconds to run all queries" in line:
                secs = float(line.rsplit(":", 1)[1].split()[0])
        if proc.returncode != 0 or not secs:
            ctx.add("db-ceiling", "mariadb", label, status="error", note=out.decode(errors="replace")[-200:])
            continue
        if rows_per == 1:
            _best(ctx, "ceiling_single_commits_per_s", queries / secs)
            ctx.add("db-ceiling", "mariadb", label, commits_per_s=r1(queries / secs))
        else:
            _best(ctx, "ceiling_batch_rows_per_s", queries * rows_per / secs)
            ctx.add("db-ceiling", "mariadb", label, rows_per_s=r1(queries * rows_per / secs),
                    commits_per_s=r1(queries / secs))


# ------------------------------------------------------------------ submit


async def submit(ctx: Context) -> None:
    from bench.submit import batch, make_queue, single

    s = ctx.sizes
    with environment(None, 1, ctx.log_dir) as (urls, creds):
        async with api(urls[0], creds["token"], max(s.single_concurrency, s.batch_concurrency)) as client:
            qid = await make_queue(client)
            await single(client, qid, min(200, s.single_submits), 8)  # warm-up
            r = await single(client, qid, s.single_submits, s.single_concurrency)
            ctx.facts["single_submit_per_s"] = r["tasks_per_s"]
            ctx.add("submit", "orbit", f"single x{s.single_concurrency} clients", tasks_per_s=r["tasks_per_s"],
                    p50_ms=r["p50_ms"], p99_ms=r["p99_ms"], errors=r["errors"],
                    status="ok" if not r["errors"] else "partial")
            b = await batch(client, qid, s.batches, s.batch_size, s.batch_concurrency)
            ctx.facts["batch_submit_per_s"] = b["tasks_per_s"]
            ctx.add("submit", "orbit", f"batch {s.batch_size}/req x{s.batch_concurrency}", tasks_per_s=b["tasks_per_s"],
                    p50_ms_per_batch=b["p50_ms_per_batch"], p99_ms_per_batch=b["p99_ms_per_batch"],
                    errors=b["errors"], status="ok" if not b["errors"] else "partial")


# ------------------------------------------------------------------ drain (+ steady-state latency)


# A user's natural set-up: per worker process, one `orbit.Worker` of this concurrency.
SDK_CONCURRENCY = 64


async def orbit_drain(ctx: Context, nodes: int, *, with_latency: bool, report_drain: bool = True,
                      sdk: str | None = None, again: bool = False, sdk_in_flight: bool = False) -> None:
    """Drain pre-loaded tasks with worker processes: the bench's lean raw-protocol sessions, or
    (`sdk`: "async" or "sync") the SDK's runtime as a user runs it, one `orbit.Worker` per
    process with a no-op handler (`async def`, or a plain function run in its threads).
    `again`: the lean drain once more, after the SDK rows (its case says so). `sdk_in_flight`:
    lean sessions holding as many tasks as the SDK rows (one session of `SDK_CONCURRENCY` per
    process), which tells the SDK's own cost from that of its smaller transactions."""
    s = ctx.sizes
    n = s.drain_tasks
    name = (f"drain{nodes}{'-sdk-' + sdk if sdk else ''}{'-again' if again else ''}"
            f"{'-sdk-in-flight' if sdk_in_flight else ''}")
    with environment(None, nodes, ctx.log_dir) as (urls, creds):
        token, db_url = creds["token"], creds["_database_url"]
        db = Conn(db_url)
        procs = []
        try:
            async with api(urls[0], token, 8, timeout=120) as client:
                qid = await create_queue(client, f"drain-{uuid.uuid4().hex[:6]}")
                load_s = await api_preload(client, qid, n)
                t_launch = time.perf_counter()
                if sdk:
                    procs = spawn_workers(ctx, urls, token, name, queue_id=qid, sessions=1,
                                          max_tasks=SDK_CONCURRENCY, extra=["--sdk", *(["--sync"] if sdk == "sync" else [])])
                elif sdk_in_flight:
                    procs = spawn_workers(ctx, urls, token, name, queue_id=qid, sessions=1, max_tasks=SDK_CONCURRENCY)
                else:
                    procs = spawn_workers(ctx, urls, token, name, queue_id=qid)
                # CPU from the first lease on: the worker processes' start-up is not the drain's.
                await wait_first_lease(db_url, qid, 120)
                cpu = DrainCpu([p.pid for p in procs])
                # Progress from the queue's usage row; the finished tasks are counted once, at the end.
                await wait_count(db, DRAINED, (qid,), 1, s.drain_timeout)
                cpu_us = cpu.us_per_task(n)
                done = int(await db.scalar(
                    "SELECT COUNT(*) FROM tasks WHERE queue_id = %s AND state = 'SUCCEEDED'", (qid,)) or 0)
                wall = time.perf_counter() - t_launch
                (span_us,), = await db.fetch(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(leased_at), MAX(ended_at)) FROM leases "
                    "WHERE queue_id = %s AND outcome = 'SUCCEEDED'", (qid,))
                active = (span_us or 1) / 1e6
                rate = done / active
                if nodes == 1 and not sdk and not again and not sdk_in_flight:
                    ctx.facts["orbit_drain_1node_per_s"] = rate
                workers = (f"SDK {sdk}, {len(procs)}x Worker({SDK_CONCURRENCY})" if sdk
                           else f"{len(procs)}x1 sessions of {SDK_CONCURRENCY} tasks (the SDK's in flight)"
                           if sdk_in_flight else f"{len(procs)}x{s.sessions_per_process} sessions")
                if sdk:
                    ctx.facts[f"orbit_drain_sdk_{sdk}_per_s"] = rate
                if report_drain:
                    case = f"{nodes} node{'s' if nodes > 1 else ''}, {workers}{', again' if again else ''}"
                    ctx.add("drain", "orbit", case, tasks=done, tasks_per_s=r1(rate),
                            wall_tasks_per_s=r1(done / wall), preload_tasks_per_s=r1(n / load_s), **cpu_us,
                            status="ok" if done >= n else "partial",
                            note="" if done >= n else f"timed out after {wall:.0f}s")
                else:
                    ctx.add("latency", "orbit", "calibration drain", tasks=done, tasks_per_s=r1(rate))
                if with_latency and done >= n:
                    await orbit_latency(ctx, client, db, qid, max(1.0, 0.5 * rate), "50% of max")
                    # The drain rate above excludes submission; the same machine also has to accept
                    # the tasks. Half of what it sustains doing both is a second, fairer "half load".
                    sustained = await orbit_sustained(ctx, client, db, qid, offer=rate)
                    if sustained:
                        await orbit_latency(ctx, client, db, qid, max(1.0, 0.5 * sustained),
                                            "50% of sustained")
                    if s.latency_fixed_rate:
                        await orbit_latency(ctx, client, db, qid, s.latency_fixed_rate, "fixed")
        finally:
            _proc.stop_many(procs, grace=5)
            db.close()


async def orbit_latency(ctx: Context, client: httpx.AsyncClient, db: Conn, qid: str, target: float,
                        label: str) -> None:
    """Offer `target` tasks/s while the workers run; submit->Start from stored history."""
    s = ctx.sizes
    (t_start,), = await db.fetch("SELECT NOW(6)")
    sent, refused = await offer_submits(client, qid, target, s.latency_seconds, s.latency_tick_ms)
    got, _ = await wait_count(db, "SELECT COUNT(*) FROM leases l JOIN tasks t ON t.id = l.task_id "
                                  "WHERE l.queue_id = %s AND l.started_at IS NOT NULL AND t.created_at >= %s",
                              (qid, t_start), sent, 60)
    rows = await db.fetch(
        "SELECT TIMESTAMPDIFF(MICROSECOND, t.created_at, l.started_at), "
        "TIMESTAMPDIFF(MICROSECOND, t.created_at, l.leased_at) FROM leases l JOIN tasks t ON t.id = l.task_id "
        "WHERE l.queue_id = %s AND l.started_at IS NOT NULL AND l.attempt = 1 AND t.created_at >= %s", (qid, t_start))
    lat = [r[0] / 1000 for r in rows]
    to_lease = [r[1] / 1000 for r in rows]
    ctx.add("latency", "orbit", f"{target:.0f}/s ({label})", rate_per_s=r1(target),
            achieved_per_s=r1(sent / s.latency_seconds), samples=len(lat), p50_ms=r2(percentile(lat, 50)),
            p99_ms=r2(percentile(lat, 99)), submit_to_lease_p50_ms=r2(percentile(to_lease, 50)),
            lease_to_start_p50_ms=r2(percentile([a - b for a, b in zip(lat, to_lease)], 50)),
            status="ok" if got >= sent and not refused else "partial",
            note="" if got >= sent else f"{sent - got} never started")


async def orbit_sustained(ctx: Context, client: httpx.AsyncClient, db: Conn, qid: str, offer: float) -> float:
    """Tasks/s completed while tasks are offered at the drain rate (submit and drain at once);
    waits for the backlog it left to drain before returning."""
    s = ctx.sizes
    count = "SELECT COUNT(*) FROM tasks WHERE queue_id = %s AND state = 'SUCCEEDED'"
    before = int(await db.scalar(count, (qid,)) or 0)
    t0 = time.perf_counter()
    sent, _ = await offer_submits(client, qid, offer, s.latency_seconds, s.latency_tick_ms)
    window = time.perf_counter() - t0
    during = int(await db.scalar(count, (qid,)) or 0) - before
    await wait_count(db, DRAINED, (qid,), 1, 120)
    rate = during / window
    ctx.add("latency", "orbit", "sustained submit+drain", offered_per_s=r1(offer), accepted=sent,
            tasks_per_s=r1(rate))
    return rate


async def offer_submits(client: httpx.AsyncClient, qid: str, rate: float, seconds: float,
                        tick_ms: float) -> tuple[int, int]:
    """Offer `rate` tasks/s to queue `qid` for `seconds` (open loop, what is due every `tick_ms`)
    through a light HTTP pool like `client`; returns (accepted, refused)."""
    pool = RawPool.like(client)
    try:
        return await open_loop(rate, seconds, tick=tick_ms / 1000, send=lambda k, tag: _submit_some(pool, qid, k, tag))
    finally:
        await pool.close()


async def _submit_some(pool: RawPool, qid: str, k: int, tag: str) -> int:
    """Submit k tasks (one request; a batch when k > 1) through the light HTTP client, whose CPU
    cost would otherwise be taken from the server and MariaDB on this shared machine."""
    if k == 1:
        status, _ = await pool.post(f"/v1/queues/{qid}/tasks", {"payload": {"t": tag}}, {"Idempotency-Key": f"l-{tag}"})
        return 1 if status == 201 else 0
    items = [{"idempotency_key": f"l-{tag}-{i}", "payload": {"i": i}} for i in range(k)]
    status, body = await pool.post(f"/v1/queues/{qid}/tasks:batch", {"tasks": items}, {"Idempotency-Key": f"lb-{tag}"})
    if status != 200:
        return 0
    return sum(1 for x in orjson.loads(body)["data"]["results"] if "task" in x)


async def open_loop(rate: float, seconds: float, send, tick: float = 0.02, max_in_flight: int = 16) -> tuple[int, int]:
    """Offer `rate` items/s for `seconds`, in small groups every `tick`, whatever the answers' pace.

    `send(k, tag)` submits k items and returns how many were accepted. Returns (accepted, refused)."""
    sem = asyncio.Semaphore(max_in_flight)
    accepted = refused = 0
    pending: set[asyncio.Task] = set()
    tag = uuid.uuid4().hex[:8]
    offered = 0
    t0 = time.perf_counter()

    async def one(k: int, i: int) -> None:
        nonlocal accepted, refused
        async with sem:
            try:
                ok = await send(k, f"{tag}-{i}")
            except Exception:  # noqa: BLE001
                ok = 0
            accepted += ok
            refused += k - ok

    i = 0
    while True:
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
        due = int(elapsed * rate) + 1 - offered
        if due > 0:
            t = asyncio.create_task(one(due, i))
            pending.add(t)
            t.add_done_callback(pending.discard)
            offered += due
            i += 1
        await asyncio.sleep(tick)
    if pending:
        await asyncio.wait(pending, timeout=60)
    return accepted, refused


# ------------------------------------------------------------------ backlog scaling


async def backlog(ctx: Context) -> None:
    from bench._worker import RawSession

    s = ctx.sizes
    with environment(None, 1, ctx.log_dir) as (urls, creds):
        token, db_url = creds["token"], creds["_database_url"]
        db = Conn(db_url)
        try:
            async with api(urls[0], token, 4) as client:
                qid = await create_queue(client, f"backlog-{uuid.uuid4().hex[:6]}")
                # The template task lives in a queue of its own that nobody claims; pre-loaded copies go to `qid`.
                tq = await create_queue(client, f"backlog-template-{uuid.uuid4().hex[:6]}")
                top = max(s.backlogs)
                raised = top + 10 * s.backlog_samples > 1_000_000
                if raised:
                    # The API caps max_unfinished_tasks at 1,000,000; the samples need room above the backlog.
                    await db.fetch("UPDATE queues SET max_unfinished_tasks = %s WHERE id = %s",
                                   (top + 10 * s.backlog_samples + 1000, qid))
                r = await client.post(f"/v1/queues/{tq}/tasks", json={"payload": {"template": True}},
                                      headers={"Idempotency-Key": "backlog-template"})
                r.raise_for_status()
                template = r.json()["data"]["task"]["id"]
                # A control queue holding only the samples' own tasks, sampled alternately with the
                # backlogged queue: the ratios compare the two at the same moment, so background work
                # (InnoDB purge and flushing after a million-row preload) weighs on both alike.
                control = await create_queue(client, f"backlog-control-{uuid.uuid4().hex[:6]}")
                session = await RawSession.connect(urls[0], token, [qid, control], "backlog-w")
                preloaded = 0
                try:
                    for size in sorted(s.backlogs):
                        waiting = int(await db.scalar(
                            "SELECT COUNT(*) FROM tasks WHERE queue_id = %s AND state = 'WAITING'", (qid,)))
                        need = max(0, size - waiting)
                        load_s = 0.0
                        if need:
                            load_s = await preload_waiting(db_url, template, qid, need, first=preloaded,
                                                           deadline=time.monotonic() + 1800)
                            preloaded += need
                        waiting = int(await db.scalar(
                            "SELECT COUNT(*) FROM tasks WHERE queue_id = %s AND state = 'WAITING'", (qid,)))
                        sub, sub_empty = await _sample_submits(client, [qid, control], s.backlog_samples,
                                                               s.backlog_sample_seconds)
                        clm, clm_empty = await _sample_claims(session, [qid, control], s.backlog_samples,
                                                              s.backlog_sample_seconds)
                        ctx.facts.setdefault("backlog", {})[size] = {
                            "claim_p50_ms": percentile(clm, 50), "submit_p50_ms": percentile(sub, 50),
                            "empty_claim_p50_ms": percentile(clm_empty, 50),
                            "empty_submit_p50_ms": percentile(sub_empty, 50)}
                        ctx.add("backlog", "orbit", f"{size:,} waiting", waiting=waiting,
                                claim_p50_ms=r2(percentile(clm, 50)), claim_p99_ms=r2(percentile(clm, 99)),
                                empty_claim_p50_ms=r2(percentile(clm_empty, 50)),
                                claim_x_empty=r2(percentile(clm, 50) / percentile(clm_empty, 50)),
                                submit_p50_ms=r2(percentile(sub, 50)), submit_p99_ms=r2(percentile(sub, 99)),
                                submit_x_empty=r2(percentile(sub, 50) / percentile(sub_empty, 50)),
                                samples=f"{len(clm)}/{len(sub)}",
                                preload_rows_per_s=r1(need / load_s) if need else None,
                                status="ok" if len(clm) >= s.backlog_samples and len(sub) >= s.backlog_samples
                                else "partial",
                                note=("" if len(clm) >= s.backlog_samples else "claim samples cut by time bound; ")
                                + ("queue limit raised in the database above the API's 1,000,000 cap" if raised
                                   else ""))
                finally:
                    await session.close()
        finally:
            db.close()


async def _sample_submits(client: httpx.AsyncClient, queues: list[str], count: int,
                          seconds: float) -> list[list[float]]:
    """Timed single submits, `count` per queue, the queues taking turns; latencies per queue."""
    lat: list[list[float]] = [[] for _ in queues]
    end = time.perf_counter() + seconds
    tag = uuid.uuid4().hex[:8]
    for i in range(count):
        if time.perf_counter() > end:
            break
        for q, qid in enumerate(queues):
            t0 = time.perf_counter()
            r = await client.post(f"/v1/queues/{qid}/tasks", json={"payload": {"i": i}},
                                  headers={"Idempotency-Key": f"bs-{tag}-{q}-{i}"})
            if r.status_code != 201:
                raise RuntimeError(f"submit answered {r.status_code}: {r.text[:200]}")
            lat[q].append((time.perf_counter() - t0) * 1000)
    return lat


async def _sample_claims(session, queues: list[str], count: int, seconds: float) -> list[list[float]]:
    """claim(max_tasks=1) timed, then start + complete, one at a time, the queues taking turns."""
    lat: list[list[float]] = [[] for _ in queues]
    end = time.perf_counter() + seconds
    for _ in range(count):
        if time.perf_counter() > end:
            break
        for q, qid in enumerate(queues):
            t0 = time.perf_counter()
            r = await session.call({"type": "claim", "queue_id": qid, "max_tasks": 1, "wait_ms": 0,
                                    "lease_ms": 60000})
            lat[q].append((time.perf_counter() - t0) * 1000)
            if not r["ok"] or not r["tasks"]:
                raise RuntimeError(f"claim returned no task: {r}")
            lease = r["tasks"][0]["lease_id"]
            st = await session.call({"type": "start", "lease_id": lease})
            if st["ok"]:
                await session.call({"type": "complete", "lease_id": lease, "outcome": "succeeded", "result": None})
            else:
                await session.call({"type": "release", "lease_id": lease})
    return lat


# ------------------------------------------------------------------ many queues


async def many_queues(ctx: Context) -> None:
    s = ctx.sizes
    nq = s.queues
    with environment(None, 1, ctx.log_dir) as (urls, creds):
        token, db_url = creds["token"], creds["_database_url"]
        db = Conn(db_url)
        procs = []
        try:
            async with api(urls[0], token, 32, timeout=120) as client:
                tag = uuid.uuid4().hex[:6]
                sem = asyncio.Semaphore(16)
                ids: list[str] = [""] * nq
                # The light keep-alive client: httpx would spend more CPU than the server on these requests.
                pool = RawPool.like(client)

                async def make(i: int) -> None:
                    async with sem:
                        status, body = await pool.post(
                            "/v1/queues", {"name": f"mq-{tag}-{i}", "max_concurrency": 10, "rate_per_second": 100,
                                           "max_unfinished_tasks": 100}, {"Idempotency-Key": f"mqc-{tag}-{i}"})
                        if status != 201:
                            raise RuntimeError(f"queue create answered {status}: {body[:200]!r}")
                        ids[i] = orjson.loads(body)["data"]["queue"]["id"]

                async def put(i: int) -> None:
                    async with sem:
                        status, body = await pool.post(f"/v1/queues/{ids[i]}/tasks", {"payload": {"q": i}},
                                                       {"Idempotency-Key": f"mq-{tag}-{i}"})
                        if status != 201:
                            raise RuntimeError(f"submit answered {status}: {body[:200]!r}")

                try:
                    t0 = time.perf_counter()
                    await asyncio.gather(*(make(i) for i in range(nq)))
                    create_s = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    await asyncio.gather(*(put(i) for i in range(nq)))
                    submit_s = time.perf_counter() - t0
                finally:
                    await pool.close()
                qfile = ctx.log_dir / "many-queues.txt"
                qfile.write_text("\n".join(ids) + "\n")
                t_launch = time.perf_counter()
                procs = spawn_workers(ctx, urls, token, "manyq", queues_file=str(qfile))
                done, _ = await wait_count(db, "SELECT COUNT(*) FROM tasks WHERE state = 'SUCCEEDED'", (), nq,
                                           s.drain_timeout)
                wall = time.perf_counter() - t_launch
                (span_us,), = await db.fetch(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(leased_at), MAX(ended_at)) FROM leases "
                    "WHERE outcome = 'SUCCEEDED'")
                ctx.add("many-queues", "orbit", f"{nq:,} queues x 1 task", queues_per_s=r1(nq / create_s),
                        submit_per_s=r1(nq / submit_s), drained=done, drain_tasks_per_s=r1(done / ((span_us or 1) / 1e6)),
                        wall_tasks_per_s=r1(done / wall), status="ok" if done >= nq else "partial",
                        note="" if done >= nq else f"timed out after {wall:.0f}s")
        finally:
            _proc.stop_many(procs, grace=5)
            db.close()


# ------------------------------------------------------------------ limits under load


async def limits(ctx: Context) -> None:
    s = ctx.sizes
    C, R = s.limits_concurrency, s.limits_rate
    with environment(None, 2, ctx.log_dir) as (urls, creds):
        token, db_url = creds["token"], creds["_database_url"]
        db = Conn(db_url)
        procs = []
        try:
            async with api(urls[0], token, 8) as client:
                qid = await create_queue(client, f"limits-{uuid.uuid4().hex[:6]}", max_concurrency=C,
                                         rate_per_second=R)
                total = int(R * s.limits_seconds * 1.5) + 10 * C
                await api_preload(client, qid, total)
            sessions = max(4, C)  # more sessions than permits: saturated
            procs = spawn_workers(ctx, urls, token, "limits", queue_id=qid, sessions=sessions,
                                  extra=["--max-tasks", "4", "--handler-ms", str(s.limits_handler_ms),
                                         "--retry-rate-limited", "--lease-ms", "30000"])
            samples = []
            t_end = time.perf_counter() + s.limits_seconds
            while time.perf_counter() < t_end:
                samples.append(int(await db.scalar(
                    "SELECT COUNT(*) FROM tasks WHERE queue_id = %s AND state IN ('LEASED', 'RUNNING')", (qid,))))
                await asyncio.sleep(0.1)
            _proc.stop_many(procs, grace=10)
            outcome = worker_outcomes(ctx, "limits", len(procs))
            procs = []
            (now,), = await db.fetch("SELECT NOW(6)")
            # Attempts still running when the workers stopped count with their Starts too.
            leases = await db.fetch(f"SELECT l.leased_at, {STARTED_AT}, l.ended_at FROM leases l "
                                    "JOIN tasks t ON t.id = l.task_id WHERE l.queue_id = %s", (qid,))
            starts = [l[1] for l in leases if l[1] is not None]
            overlap = max_overlap([(l[0], l[2] or now) for l in leases])
            wins = windows(starts)
            full = wins[1:-1] or wins  # first and last windows are partial
            span = (max(starts) - min(starts)).total_seconds() if len(starts) > 1 else 0
            ok = overlap <= C and (max(wins) if wins else 0) <= R
            ctx.add("limits", "orbit", f"C={C} R={R}/s, 2 nodes, {sessions * s.worker_processes} sessions",
                    max_concurrent=overlap, limit_concurrency=C, max_live_sample=max(samples or [0]),
                    max_starts_in_window=max(wins) if wins else 0, limit_rate=R,
                    mean_starts_per_window=r1(sum(full) / len(full)) if full else 0,
                    starts_per_s=r1(len(starts) / span) if span else 0, rate_limited_replies=outcome["rate_limited"],
                    status="ok" if ok else "error", note="limits held" if ok else "LIMIT EXCEEDED")
        finally:
            _proc.stop_many(procs, grace=5)
            db.close()


# ------------------------------------------------------------------ application quotas and resource keys


def pick_keys(rng, keys: int, hot: int, hot_share: float) -> list[int]:
    """0-4 distinct key numbers for one task; each slot is one of the `hot` first keys with
    probability `hot_share`, else any key (so a few keys are popular and saturate)."""
    want = rng.randint(0, 4)
    chosen: list[int] = []
    while len(chosen) < want:
        k = rng.randrange(hot) if hot and rng.random() < hot_share else rng.randrange(keys)
        if k not in chosen:
            chosen.append(k)
    return chosen


def key_overlaps(rows: list[tuple], now) -> dict[str, int]:
    """Per resource key id, the largest number of leases open at once among the tasks naming it;
    `rows` are (leased_at, ended_at or None, resource_key_ids JSON or None)."""
    per_key: dict[str, list[tuple]] = {}
    for leased_at, ended_at, ids in rows:
        for k in orjson.loads(ids) if ids else ():
            per_key.setdefault(k, []).append((leased_at, ended_at or now))
    return {k: max_overlap(iv) for k, iv in per_key.items()}


async def controls(ctx: Context) -> None:
    """The application's quotas near saturation (max_concurrency N below what the sessions would
    take, a Start rate R well above reach) and resource keys with few permits, some of them
    popular, over several queues: drain rate and CPU per task, then the limits checked from the
    stored lease history and the usage rows."""
    import random

    s = ctx.sizes
    n, nq, nk, M = s.controls_tasks, s.controls_queues, s.controls_keys, s.controls_key_concurrency
    N, R = s.controls_concurrency, s.controls_rate
    with environment(None, 1, ctx.log_dir, permissions=("applications:manage",)) as (urls, creds):
        token, db_url, app_id = creds["token"], creds["_database_url"], creds["application_id"]
        db = Conn(db_url)
        procs: list = []
        try:
            async with api(urls[0], token, 8, timeout=120) as client:
                tag = uuid.uuid4().hex[:6]
                # The application's quotas: read the revision, replace every quota at once.
                r = await client.get(f"/v1/applications/{app_id}")
                if r.status_code != 200:
                    raise RuntimeError(f"GET /v1/applications/{app_id} answered {r.status_code}: {r.text[:300]}")
                body = {"expected_revision": r.json()["data"]["revision"], "reason": "bench", "paused": False,
                        "max_concurrency": N, "rate_per_second": R, "max_unfinished_tasks": 100_000_000}
                r = await client.post(f"/v1/applications/{app_id}:configure", json=body,
                                      headers={"Idempotency-Key": f"ctl-app-{tag}"})
                if r.status_code != 200:
                    raise RuntimeError(f"POST /v1/applications/{app_id}:configure {body} answered "
                                       f"{r.status_code}: {r.text[:300]}")
                app = r.json()["data"]["application"]
                if (app["max_concurrency"], app["rate_per_second"]) != (N, R):
                    raise RuntimeError(f"configure answered other quotas than it was given: {app}")
                qids = [await create_queue(client, f"controls-{tag}-{i}") for i in range(nq)]

                pool = RawPool.like(client)  # the light client: httpx would take CPU from the server
                try:
                    sem = asyncio.Semaphore(8)
                    names = [f"rk-{i:04d}" for i in range(nk)]
                    key_ids: dict[str, str] = {}

                    async def make_key(name: str) -> None:
                        async with sem:
                            req = {"name": name, "max_concurrency": M}
                            status, raw = await pool.post("/v1/resource-keys", req,
                                                          {"Idempotency-Key": f"ctl-{tag}-{name}"})
                            if status != 201:
                                raise RuntimeError(f"POST /v1/resource-keys {req} answered {status}: {raw[:300]!r}")
                            key_ids[name] = orjson.loads(raw)["data"]["resource_key"]["id"]

                    t0 = time.perf_counter()
                    await asyncio.gather(*(make_key(x) for x in names))
                    keys_s = time.perf_counter() - t0

                    rng = random.Random(20240611)
                    per_queue: list[list[dict]] = [[] for _ in qids]
                    for i in range(n):
                        chosen = [names[k] for k in pick_keys(rng, nk, s.controls_hot_keys, s.controls_hot_share)]
                        per_queue[i % nq].append({"idempotency_key": f"ctl-{tag}-{i}", "payload": {"i": i},
                                                  "resource_keys": chosen})
                    submitted: dict[str, list[str]] = {}  # task id -> the key names it was given
                    sem = asyncio.Semaphore(4)

                    async def put(qid: str, b: int, items: list[dict]) -> None:
                        async with sem:
                            status, raw = await pool.post(f"/v1/queues/{qid}/tasks:batch", {"tasks": items},
                                                          {"Idempotency-Key": f"ctlb-{tag}-{qid}-{b}"})
                            if status != 200:
                                raise RuntimeError(f"POST /v1/queues/{qid}/tasks:batch answered {status}: "
                                                   f"{raw[:300]!r}")
                            for item, res in zip(items, orjson.loads(raw)["data"]["results"], strict=True):
                                if "task" not in res:
                                    raise RuntimeError(f"batch item {item} refused: {res}")
                                submitted[res["task"]["id"]] = item["resource_keys"]

                    t0 = time.perf_counter()
                    await asyncio.gather(*(put(qid, b, items[j:j + 500]) for qid, items in zip(qids, per_queue)
                                           for b, j in enumerate(range(0, len(items), 500))))
                    submit_s = time.perf_counter() - t0
                finally:
                    await pool.close()

            # Sessions: a multiple of the queues per process, each queue as many; together they
            # would take more than N leases at once, so the application's concurrency binds.
            per_proc = nq * max(1, -(-s.sessions_per_process // nq))
            port = urls[0].rsplit(":", 1)[1]
            server, mariadb = pid_of("-f", f"server.*--port {port}"), pid_of("-x", "mariadbd")
            before = (cpu_seconds(server) if server else 0.0, cpu_seconds(mariadb) if mariadb else 0.0)
            t_launch = time.perf_counter()
            procs = spawn_workers(ctx, urls, token, "controls", queue_id=",".join(qids), sessions=per_proc,
                                  extra=["--max-tasks", str(s.controls_claim_max_tasks), "--handler-ms",
                                         str(s.controls_handler_ms)])
            # Progress from the application's usage row (one row for all the queues).
            finished, _ = await wait_count(db, "SELECT unfinished = 0 FROM application_usage WHERE application_id = %s",
                                       (app_id,), 1, s.controls_drain_timeout)
            wall = time.perf_counter() - t_launch
            after = (cpu_seconds(server) if server else 0.0, cpu_seconds(mariadb) if mariadb else 0.0)
            worker_cpu = sum(cpu_seconds(p.pid) for p in procs if p.poll() is None)
            drained = bool(finished)
            _proc.stop_many(procs, grace=10)
            outcome = worker_outcomes(ctx, "controls", len(procs))
            procs = []

            # ---- invariants, from what the database stored
            problems: list[str] = []
            marks = ", ".join(["%s"] * nq)
            states = dict(await db.fetch(f"SELECT state, COUNT(*) FROM tasks WHERE queue_id IN ({marks}) "
                                         "GROUP BY state", qids))
            done = int(states.get("SUCCEEDED", 0))
            if done != n or len(states) != 1:
                problems.append(f"task states {states} (expected {n:,} SUCCEEDED)")
            (now,), = await db.fetch("SELECT NOW(6)")
            leases = await db.fetch(
                "SELECT l.leased_at, l.ended_at, t.resource_key_ids FROM leases l JOIN tasks t ON t.id = l.task_id "
                "WHERE l.application_id = %s", (app_id,))
            app_overlap = max_overlap([(a, b or now) for a, b, _ in leases])
            if app_overlap > N:
                problems.append(f"application lease overlap {app_overlap} > max_concurrency {N}")
            limits = dict(await db.fetch("SELECT id, max_concurrency FROM resource_keys"))
            overlaps = key_overlaps(leases, now)
            over = {k: v for k, v in overlaps.items() if v > limits.get(k, 0)}
            if over:
                worst = sorted(over.items(), key=lambda kv: -kv[1])[:5]
                problems.append(f"{len(over)} resource keys over their max_concurrency, e.g. "
                                + ", ".join(f"{k}: {v} > {limits.get(k)}" for k, v in worst))
            # What each task names, as stored, against what it was submitted with.
            mismatched = 0
            for tid, names_json, ids_json in await db.fetch(
                    f"SELECT id, resource_keys, resource_key_ids FROM tasks WHERE queue_id IN ({marks})", qids):
                want = sorted(submitted.get(tid, ()))
                got_ids = sorted(orjson.loads(ids_json)) if ids_json else []
                if sorted(orjson.loads(names_json)) != want or got_ids != sorted(key_ids[x] for x in want):
                    mismatched += 1
            if mismatched or len(submitted) != n:
                problems.append(f"{mismatched} tasks whose stored keys differ from those submitted "
                                f"({len(submitted):,} accepted)")
            (rows, busy, unfinished), = await db.fetch(
                "SELECT COUNT(*), COALESCE(SUM(permits_in_use <> 0), 0), COALESCE(SUM(unfinished <> 0), 0) "
                "FROM resource_key_usage")
            if int(busy) or int(unfinished):
                problems.append(f"resource_key_usage at the end: {int(busy)} keys with permits_in_use > 0, "
                                f"{int(unfinished)} with unfinished > 0")
            if int(rows) != nk:
                problems.append(f"resource_key_usage has {int(rows)} rows for {nk} keys")
            (app_permits, app_unfinished), = await db.fetch(
                "SELECT permits_in_use, unfinished FROM application_usage WHERE application_id = %s", (app_id,))
            if int(app_permits) or int(app_unfinished):
                problems.append(f"application_usage at the end: permits_in_use {app_permits}, "
                                f"unfinished {app_unfinished}")
            if outcome["errors"]:
                problems.append(f"{outcome['errors']} worker errors")

            (span_us,), = await db.fetch(
                "SELECT TIMESTAMPDIFF(MICROSECOND, MIN(leased_at), MAX(ended_at)) FROM leases "
                "WHERE application_id = %s AND outcome = 'SUCCEEDED'", (app_id,))
            saturated = sum(1 for k, v in overlaps.items() if v >= limits.get(k, 0))
            # The drain's tail: how long its last 10% took, and how many of those name a hot key
            # (a slow tail of hot-key tasks is parking and unparking at work).
            hot = {key_ids[names[k]] for k in range(min(s.controls_hot_keys, nk))}
            ended = sorted((b, bool(hot.intersection(orjson.loads(ids) if ids else ())))
                           for _, b, ids in leases if b is not None)
            last = ended[-max(1, len(ended) // 10):]
            tail_s = (last[-1][0] - last[0][0]).total_seconds() if ended else 0.0
            keyed = sum(1 for v in submitted.values() if v)
            note = "limits held, all tasks succeeded, usage rows back to 0" if not problems else "; ".join(problems)
            if not drained:
                note = f"drain not finished after {wall:.0f}s; " + note
            ctx.add("controls", "orbit", f"{n:,} tasks, {nq} queues, {nk:,} keys",
                    tasks=done, tasks_per_s=r1(done / ((span_us or 1) / 1e6)), wall_tasks_per_s=r1(done / wall),
                    server_cpu_us_per_task=round((after[0] - before[0]) / n * 1e6) if server else None,
                    mariadb_cpu_us_per_task=round((after[1] - before[1]) / n * 1e6) if mariadb else None,
                    worker_cpu_us_per_task=round(worker_cpu / n * 1e6),
                    app_max_concurrent=app_overlap, app_limit=N, key_limit=M,
                    key_max_concurrent=max(overlaps.values(), default=0), keys_saturated=saturated,
                    tasks_with_keys=keyed, leases_per_task=r2(len(leases) / max(1, done)),
                    span_s=r2((span_us or 0) / 1e6), tail_10pct_s=r2(tail_s),
                    tail_hot_key_pct=r1(100 * sum(h for _, h in last) / len(last)) if ended else None,
                    submit_tasks_per_s=r1(n / submit_s), keys_per_s=r1(nk / keys_s),
                    status="ok" if not problems and drained else "error", note=note)
        finally:
            _proc.stop_many(procs, grace=5)
            db.close()


# ------------------------------------------------------------------ schedules


def _log_offsets(paths: list[Path]) -> list[int]:
    return [p.stat().st_size if p.exists() else 0 for p in paths]


def _log_lines_since(paths: list[Path], offsets: list[int]) -> list[str]:
    """What the server logs gained since `offsets` (they are appended to by every scenario)."""
    lines: list[str] = []
    for p, off in zip(paths, offsets):
        if p.exists():
            with p.open("rb") as f:
                f.seek(off)
                lines += [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    return lines


async def _lock_counters(db: Conn) -> dict[str, int]:
    """MariaDB's server-wide row-lock and deadlock counters (other databases on it count too)."""
    rows = await db.fetch("SHOW GLOBAL STATUS WHERE Variable_name IN "
                          "('Innodb_row_lock_waits', 'Innodb_row_lock_time', 'Innodb_deadlocks')")
    return {str(k).lower(): int(v) for k, v in rows}


async def schedules(ctx: Context) -> None:
    """N interval schedules (every second; misfire catch_up within 60 s) over a few queues, generated
    by the scheduler loops of 2 nodes. No workers: the tasks pile up as WAITING, so what the
    servers and MariaDB spend is the scheduler's (plus the nodes' idle loops, measured first).
    Over a window after a warm-up: points handled and tasks generated per second, the lag from a
    trigger point to its task's created_at, CPU per point; then, with the nodes stopped, the run
    records checked against the schedules, the tasks and the usage counters."""
    s = ctx.sizes
    n, nq = s.schedules, s.schedules_queues
    cores = os.cpu_count() or 1
    logs = [ctx.log_dir / f"server-{i}.log" for i in range(2)]
    offsets = _log_offsets(logs)
    url = create_mysql_database("orbit_bench_sched")
    db = Conn(url)
    try:
        with environment(url, 2, ctx.log_dir) as (urls, creds):
            token = creds["token"]
            servers = [pid_of("-f", f"server.*--port {u.rsplit(':', 1)[1]}") for u in urls]
            mariadb = pid_of("-x", "mariadbd")

            def cpu() -> tuple[float, float, float]:
                return (sum(cpu_seconds(p) for p in servers if p), cpu_seconds(mariadb) if mariadb else 0.0,
                        time.perf_counter())

            # The nodes' own loops with nothing to do: the floor under the scheduler's figures.
            a = cpu()
            await asyncio.sleep(3)
            b = cpu()
            idle_server_pct = 100 * (b[0] - a[0]) / (b[2] - a[2]) / cores

            async with api(urls[0], token, 4, timeout=120) as client:
                tag = uuid.uuid4().hex[:6]
                qids = [await create_queue(client, f"sched-{tag}-{i}") for i in range(nq)]
                pools = [RawPool(u, client.headers["Authorization"]) for u in urls]
                sem = asyncio.Semaphore(s.schedules_create_concurrency)

                async def make(i: int) -> None:
                    body = {"name": f"sch-{tag}-{i}", "queue_id": qids[i % nq], "interval_seconds": 1,
                            "misfire": {"policy": "catch_up", "catch_up_window_seconds": 60},
                            "task": {"payload": {"n": 1}}}
                    async with sem:
                        status, raw = await pools[i % len(pools)].post(
                            "/v1/schedules", body, {"Idempotency-Key": f"sch-{tag}-{i}"})
                    if status != 201:
                        raise RuntimeError(f"POST /v1/schedules {body} answered {status}: {raw[:300]!r}")

                try:
                    t0 = time.perf_counter()
                    await asyncio.gather(*(make(i) for i in range(n)))
                    create_s = time.perf_counter() - t0
                finally:
                    for pool in pools:
                        await pool.close()

            await asyncio.sleep(s.schedules_warmup_seconds)
            # The window, on the database clock (the scheduler stamps created_at with it, in UTC).
            locks0 = await _lock_counters(db)
            (w0,), = await db.fetch("SELECT UTC_TIMESTAMP(6)")
            c0 = cpu()
            await asyncio.sleep(s.schedules_window_seconds)
            c1 = cpu()
            (w1,), = await db.fetch("SELECT UTC_TIMESTAMP(6)")
            locks1 = await _lock_counters(db)
            # Schedules whose cursor is more than a second behind the clock, and the oldest cursor.
            (behind, oldest_s), = await db.fetch(
                "SELECT COUNT(*), COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, due_at, UTC_TIMESTAMP(6))), 0) / 1e6 "
                "FROM schedules WHERE due_at <= UTC_TIMESTAMP(6) - INTERVAL 1 SECOND")
            alive = all(p is None or Path(f"/proc/{p}").exists() for p in servers)
        # The nodes are stopped: what follows reads a still database.

        window_s = (w1 - w0).total_seconds()
        # A batch stamps its records with its transaction's clock: distinct created_at ~ batches.
        (points, skipped_w, batches), = await db.fetch(
            "SELECT COUNT(*), COALESCE(SUM(outcome = 'SKIPPED'), 0), COUNT(DISTINCT created_at) FROM schedule_runs "
            "WHERE created_at >= %s AND created_at < %s", (w0, w1))
        lags = [r[0] / 1000 for r in await db.fetch(
            "SELECT TIMESTAMPDIFF(MICROSECOND, trigger_at, created_at) FROM tasks "
            "WHERE schedule_id IS NOT NULL AND created_at >= %s AND created_at < %s", (w0, w1))]
        points, skipped_w = int(points), int(skipped_w)
        server_cpu, mariadb_cpu, wall = c1[0] - c0[0], c1[1] - c0[1], c1[2] - c0[2]

        # ---- invariants, from what the database stored
        problems: list[str] = []
        (runs_total, submitted_total, skipped_total), = await db.fetch(
            "SELECT COUNT(*), COALESCE(SUM(outcome = 'SUBMITTED'), 0), COALESCE(SUM(outcome = 'SKIPPED'), 0) "
            "FROM schedule_runs")
        reasons = dict(await db.fetch("SELECT COALESCE(reason, '-'), COUNT(*) FROM schedule_runs "
                                      "WHERE outcome = 'SKIPPED' GROUP BY reason"))
        (with_runs, dups, gaps), = await db.fetch(
            "SELECT COUNT(*), COALESCE(SUM(k <> d), 0), COALESCE(SUM(span_us <> (k - 1) * 1000000), 0) FROM ("
            " SELECT schedule_id, COUNT(*) k, COUNT(DISTINCT trigger_at) d,"
            " TIMESTAMPDIFF(MICROSECOND, MIN(trigger_at), MAX(trigger_at)) span_us"
            " FROM schedule_runs GROUP BY schedule_id) x")
        if int(dups):
            problems.append(f"{int(dups)} schedules with a trigger point recorded twice")
        if int(gaps):
            problems.append(f"{int(gaps)} schedules whose points are not consecutive 1-second steps")
        if int(with_runs) != n:
            problems.append(f"{n - int(with_runs)} of {n:,} schedules have no run record")
        # The first point is one interval after creation (anchor_at); the cursor is one past the last point.
        (bad_first, bad_cursor), = await db.fetch(
            "SELECT COALESCE(SUM(r.f <> s.anchor_at + INTERVAL 1 SECOND), 0),"
            " COALESCE(SUM(s.last_trigger_at <> r.m OR s.next_trigger_at <> r.m + INTERVAL 1 SECOND), 0)"
            " FROM schedules s JOIN (SELECT schedule_id, MIN(trigger_at) f, MAX(trigger_at) m FROM schedule_runs"
            " GROUP BY schedule_id) r ON r.schedule_id = s.id")
        if int(bad_first):
            problems.append(f"{int(bad_first)} schedules whose first point is not anchor_at + 1 s")
        if int(bad_cursor):
            problems.append(f"{int(bad_cursor)} schedules whose cursor is not one step past their last run record")
        (orphan_runs,), = await db.fetch(
            "SELECT COUNT(*) FROM schedule_runs r LEFT JOIN tasks t ON t.id = r.task_id WHERE r.outcome = 'SUBMITTED'"
            " AND (t.id IS NULL OR t.schedule_id <> r.schedule_id OR t.trigger_at <> r.trigger_at)")
        if int(orphan_runs):
            problems.append(f"{int(orphan_runs)} SUBMITTED run records without their task")
        (tasks_total, orphan_tasks), = await db.fetch(
            "SELECT COUNT(*), COALESCE(SUM(r.schedule_id IS NULL OR r.task_id <> t.id), 0) FROM tasks t"
            " LEFT JOIN schedule_runs r ON r.schedule_id = t.schedule_id AND r.trigger_at = t.trigger_at"
            " WHERE t.schedule_id IS NOT NULL")
        if int(orphan_tasks):
            problems.append(f"{int(orphan_tasks)} generated tasks without their SUBMITTED run record")
        if int(tasks_total) != int(submitted_total):
            problems.append(f"{int(tasks_total):,} generated tasks for {int(submitted_total):,} SUBMITTED records")
        marks = ", ".join(["%s"] * nq)
        (unfinished,), = await db.fetch(
            f"SELECT COALESCE(SUM(unfinished), 0) FROM queue_usage WHERE queue_id IN ({marks})", qids)
        (waiting,), = await db.fetch(
            f"SELECT COUNT(*) FROM tasks WHERE queue_id IN ({marks}) AND state = 'WAITING'", qids)
        if int(unfinished) != int(waiting) or int(waiting) != int(tasks_total):
            problems.append(f"queue_usage.unfinished {int(unfinished):,}, WAITING tasks {int(waiting):,}, "
                            f"generated tasks {int(tasks_total):,} (expected all equal)")
        log = _log_lines_since(logs, offsets)
        flagged = [x for x in log if any(w in x for w in ("Traceback", "ERROR", "Error", "WARNING", "deadlock"))]

        expected = n  # points/s when every schedule fires every second
        keeping_up = points >= 0.95 * expected * window_s and not skipped_w and int(behind) == 0
        notes = [f"no workers: tasks pile up WAITING, the cost is the scheduler's; {cores} cores shared"]
        if not keeping_up:
            notes.append(f"FALLING BEHIND: {int(behind):,} schedules' cursors > 1 s late at the window's end, "
                         f"oldest {float(oldest_s):.1f} s")
        if not alive:
            notes.append("a server process exited during the window")
        if flagged:
            notes.append(f"{len(flagged)} server log lines flagged, first: {flagged[0][:200]}")
        ctx.add("schedules", "orbit", f"{n:,} x 1 s, 2 nodes, {nq} queues",
                points_per_s=r1(points / window_s), tasks_per_s=r1(len(lags) / window_s), expected_per_s=expected,
                skipped=skipped_w, batches_per_s=r1(int(batches) / window_s),
                points_per_batch=r1(points / int(batches)) if int(batches) else None,
                lag_p50_ms=r1(percentile(lags, 50)), lag_p99_ms=r1(percentile(lags, 99)),
                lag_max_ms=r1(max(lags, default=float("nan"))),
                server_cpu_us_per_point=round(server_cpu / points * 1e6) if points and any(servers) else None,
                mariadb_cpu_us_per_point=round(mariadb_cpu / points * 1e6) if points and mariadb else None,
                server_cpu_pct=r1(100 * server_cpu / wall / cores),
                mariadb_cpu_pct=r1(100 * mariadb_cpu / wall / cores),
                idle_server_cpu_pct=r1(idle_server_pct), behind_at_end=int(behind),
                row_lock_waits=locks1["innodb_row_lock_waits"] - locks0["innodb_row_lock_waits"],
                row_lock_ms=locks1["innodb_row_lock_time"] - locks0["innodb_row_lock_time"],
                deadlocks=locks1["innodb_deadlocks"] - locks0["innodb_deadlocks"],
                creates_per_s=r1(n / create_s), window_s=r2(window_s),
                status="ok" if keeping_up and alive else "partial", note="; ".join(notes))
        ctx.add("schedules", "orbit", "invariants (stored history)", schedules=int(with_runs),
                run_records=int(runs_total), submitted=int(submitted_total), skipped=int(skipped_total),
                skip_reasons=", ".join(f"{k} {v}" for k, v in reasons.items()) or "-", tasks=int(tasks_total),
                status="ok" if not problems else "error",
                note="per schedule: consecutive 1-s points from anchor_at + 1 s, none twice, cursor one past the "
                     "last, every SUBMITTED record has its task and every task its record, usage = WAITING"
                     if not problems else "; ".join(problems))
    finally:
        db.close()
        drop_mysql_database(url)
