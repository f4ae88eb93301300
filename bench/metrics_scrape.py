"""What a `GET /metrics` scrape costs with many queues: the per-queue gauges' database read, their
rendering, and the whole scrape, fresh and from the node's cache.

    python bench/metrics_scrape.py [--queues 10000] [--namespaces 10] [--busy 1000] [--waiting 20]
                                   [--finished 200000] [--backend mariadb|sqlite] [--repeat 7]

Builds a scratch database (MariaDB from ORBIT_BENCH_MYSQL_URL, dropped at the end; or a SQLite
file): `--queues` queues over `--namespaces` namespaces, `--waiting` waiting tasks (a quarter of
them delayed) in each of the first `--busy` queues through the submit API, and `--finished`
SUCCEEDED tasks copied from one of them, which the read must not touch. Then, in-process, the
median of `--repeat` runs of each piece; on MariaDB the plan of the state-count statement too.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from bench._harness import create_mysql_database, drop_mysql_database  # noqa: E402
from orbit.server.app import create_app  # noqa: E402
from orbit.server.config import Settings  # noqa: E402
from orbit.server.core.permissions import ALL_PERMISSIONS, ALL_QUEUES  # noqa: E402
from orbit.server.services import metrics, tenancy  # noqa: E402
from orbit.server.store import migrate  # noqa: E402
from orbit.server.store.db import Database  # noqa: E402
from orbit.server.store.queries import usage as usage_q  # noqa: E402
from orbit.server.store.tx import Stmt  # noqa: E402

QUEUES_PER_TX = 500


async def _timed(fn, repeat: int) -> tuple[float, object]:
    """Median seconds of `repeat` awaits of `fn()`, and its last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = await fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def _timed_sync(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


async def build(db: Database, http: httpx.AsyncClient, args) -> list[tuple[str, str]]:
    """The namespaces' credentials and every queue; returns (token, queue id) of the busy queues."""
    suffix = uuid.uuid4().hex[:6]

    async def tenants(tx):
        app = await tenancy.ensure_application(tx, f"metrics-{suffix}")
        out = []
        for i in range(args.namespaces):
            ns = await tenancy.ensure_namespace(tx, app["id"], f"ns-{i}", "development")
            cred = await tenancy.issue_credential(tx, application=app, namespace=ns, permissions=list(ALL_PERMISSIONS),
                                                  queue_scope=ALL_QUEUES)
            out.append((ns["id"], cred.token))
        return out

    spaces = await db.transaction(tenants)
    t0 = time.perf_counter()
    queues: list[tuple[str, str]] = []
    for first in range(0, args.queues, QUEUES_PER_TX):
        async def chunk(tx, first=first):
            made = []
            for i in range(first, min(first + QUEUES_PER_TX, args.queues)):
                ns_id, token = spaces[i % len(spaces)]
                made.append((token, (await tenancy.ensure_queue(tx, ns_id, f"q-{i:06d}"))["id"]))
            return made

        queues += await db.transaction(chunk)
    print(f"created {len(queues)} queues in {len(spaces)} namespaces in {time.perf_counter() - t0:.1f} s")

    t0 = time.perf_counter()
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    busy = queues[:args.busy]
    sem = asyncio.Semaphore(8)

    async def fill(token: str, queue_id: str) -> None:
        items = [{"idempotency_key": uuid.uuid4().hex, "payload": {"i": i},
                  **({"available_at": later} if i % 4 == 3 else {})} for i in range(args.waiting)]
        async with sem:
            r = await http.post(f"/v1/queues/{queue_id}/tasks:batch", json={"tasks": items},
                                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex})
        r.raise_for_status()

    await asyncio.gather(*(fill(t, q) for t, q in busy))
    print(f"submitted {args.busy * args.waiting} waiting tasks to {args.busy} queues "
          f"in {time.perf_counter() - t0:.1f} s")
    if args.finished and busy:
        t0 = time.perf_counter()
        await db.transaction(lambda tx: copy_finished(tx, busy[0][1], args.finished))
        print(f"copied {args.finished} SUCCEEDED tasks in {time.perf_counter() - t0:.1f} s")
    return busy


async def copy_finished(tx, queue_id: str, n: int) -> None:
    """`n` SUCCEEDED copies of one of the queue's tasks (new ids): history the read must skip."""
    cols = [r["name"] for r in await tx.rows(Stmt(
        "SELECT column_name AS name FROM information_schema.columns WHERE table_schema = DATABASE() "
        "AND table_name = 'tasks' ORDER BY ordinal_position",
        sqlite="SELECT name FROM pragma_table_info('tasks') ORDER BY cid"))]

    def copy(new_id: str) -> str:
        over = {"id": new_id, "state": "'SUCCEEDED'", "finished_at": "t.created_at", "sweep_at": "NULL"}
        return (f"INSERT INTO tasks ({', '.join(cols)}) SELECT {', '.join(over.get(c, 't.' + c) for c in cols)} "
                "FROM tasks t, (WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq WHERE n + 1 < ?) "
                "SELECT n FROM seq) nums WHERE t.id = (SELECT MIN(id) FROM tasks WHERE queue_id = ?)")

    await tx.count(Stmt("SET SESSION max_recursive_iterations = 4294967295", sqlite="SELECT 1"))
    await tx.count(Stmt(copy("CONCAT(SUBSTR(t.id, 1, 12), LPAD(LOWER(HEX(nums.n + 1)), 20, '0'))"), (n, queue_id),
                        sqlite=copy("SUBSTR(t.id, 1, 12) || printf('%020x', nums.n + 1)")))


def prometheus_client_renderer(queues, counts):
    """The same families through prometheus_client's collector path, for comparison: returns the
    function to time (families built beforehand, as a collector would hold them)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.parser import text_string_to_metric_families

    families = []
    for family in text_string_to_metric_families(metrics.render_queue_gauges(queues, counts).decode()):
        g = GaugeMetricFamily(family.name, family.documentation, labels=["queue_id", "namespace_id"])
        for sample in family.samples:
            g.add_metric([sample.labels["queue_id"], sample.labels["namespace_id"]], sample.value)
        families.append(g)

    class Replay:
        def collect(self):
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Replay())
    return lambda: generate_latest(registry)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--namespaces", type=int, default=10)
    ap.add_argument("--busy", type=int, default=1_000)
    ap.add_argument("--waiting", type=int, default=20)
    ap.add_argument("--finished", type=int, default=200_000)
    ap.add_argument("--backend", choices=("mariadb", "sqlite"), default="mariadb")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory()
    url = create_mysql_database("orbit_bench_metrics") if args.backend == "mariadb" else \
        f"sqlite:///{tmp.name}/orbit.db"
    try:
        await migrate.upgrade(url)
        db = Database(url, pool_size=5)
        app = create_app(Settings(database_url=url, node_id="bench", background_loops=False, metrics_ttl_seconds=0), db)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://orbit.bench", timeout=120) as http:
            await build(db, http, args)

            async def read():
                return await db.read(lambda tx: tx.rows_multi([usage_q.live_queue_rows(), usage_q.live_state_counts()]))

            read_s, (queues, counts) = await _timed(read, args.repeat)
            render_s, text = _timed_sync(lambda: metrics.render_queue_gauges(queues, counts), args.repeat)
            generic_s, generic = _timed_sync(prometheus_client_renderer(queues, counts), 3)

            async def fresh():
                r = await http.get("/metrics")
                r.raise_for_status()
                return r.content

            scrape_s, body = await _timed(fresh, args.repeat)
            app.state.node.metrics.queues.ttl = 60
            await fresh()
            cached_s, _ = await _timed(fresh, args.repeat)
            if args.backend == "mariadb":
                plan = await db.read(lambda tx: tx.rows(Stmt("EXPLAIN " + usage_q.live_state_counts().sql)))
        await db.close()
    finally:
        if args.backend == "mariadb":
            drop_mysql_database(url)
        tmp.cleanup()

    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(f"\n{args.backend}: {len(queues)} live queues, {len(counts)} (queue, state) count rows, "
          f"{args.busy * args.waiting} unfinished and {args.finished} finished tasks; median of {args.repeat}")
    print(f"  database read (2 statements, all queues): {read_s * 1000:8.1f} ms")
    print(f"  render per-queue families:                {render_s * 1000:8.1f} ms  "
          f"({len(text) / 1e6:.2f} MB; prometheus_client's generic path {generic_s * 1000:.0f} ms, "
          f"{len(generic) / 1e6:.2f} MB)")
    print(f"  whole scrape, gauges read afresh:         {scrape_s * 1000:8.1f} ms  "
          f"({len(body) / 1e6:.2f} MB, {series} samples)")
    print(f"  whole scrape, gauges from the cache:      {cached_s * 1000:8.1f} ms")
    if args.backend == "mariadb":
        print("  plan of the state counts:")
        for row in plan:
            if row["table"] is not None:
                print(f"    {row['table']}: type={row['type']} key={row['key']} key_len={row['key_len']} "
                      f"ref={row['ref']} rows={row['rows']} extra={row['Extra']}")


if __name__ == "__main__":
    asyncio.run(main())
