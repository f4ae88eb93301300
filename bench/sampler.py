"""What one run of the throughput sampler costs (`services/throughput.sample`, every 5 s on every node).

    python bench/sampler.py [--queues 10000] [--histories 0,30,120] [--moved 100] [--runs 5]

A fresh MariaDB database (`orbit_bench_sampler_<random>` on ORBIT_BENCH_MYSQL_URL, default
mysql://root@127.0.0.1:3306), migrated by the `orbit` on the import path, dropped at the end.
It holds `--queues` usage rows and nothing else the sampler does not read. For each history
length H, the samples table is emptied and refilled with H samples per queue, 5 s apart and
ending one bucket ago (the counters growing with each, the usage rows equal to the latest);
where the schema keeps each queue's latest sample apart (`queue_sample_heads`), those rows are
filled from the same data. H = 0 starts from no samples at all: its first run (not counted
in the table) writes every queue's first sample.

Then, per H, `--runs` runs of each case, every run in a bucket of its own (the script waits
for the database clock to enter a new 5-second bucket, then moves the counters):

- idle: no counter moved since the latest samples;
- moved: `--moved` queues' counters moved;
- all: every queue's counters moved.

Prints the wall time of `throughput.sample(db)` per run (min / median / max, ms), the samples
each run wrote, and the size of `queue_samples` (data + indexes). Compare two versions by
running it with each on the import path, e.g. `PYTHONPATH=/tmp/before/src python bench/sampler.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._db import connect  # noqa: E402
from bench._harness import MYSQL_BASE, mysql  # noqa: E402

_DIGITS = ("(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 "
           "UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)")
_NUMBERS = (f"(SELECT d1.d + 10*d2.d + 100*d3.d + 1000*d4.d + 10000*d5.d AS n FROM {_DIGITS} d1 "
            f"CROSS JOIN {_DIGITS} d2 CROSS JOIN {_DIGITS} d3 CROSS JOIN {_DIGITS} d4 CROSS JOIN {_DIGITS} d5) nums")
INTERVAL = timedelta(seconds=5)


async def execute(conn, sql: str, params: tuple = ()) -> list[tuple]:
    async with conn.cursor() as c:
        await c.execute(sql, params)
        return list(await c.fetchall()) if c.description else []


async def has_heads(conn) -> bool:
    return bool(await execute(conn, "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() "
                                    "AND table_name = 'queue_sample_heads'"))


async def load(conn, queues: int, history: int) -> None:
    """`queues` usage rows whose counters equal the latest of `history` samples each (ending one
    bucket before the database clock's)."""
    heads = await has_heads(conn)
    await execute(conn, "TRUNCATE TABLE queue_samples")
    if heads:
        await execute(conn, "TRUNCATE TABLE queue_sample_heads")
    await execute(conn, "DELETE FROM queue_usage")
    await execute(conn, "INSERT INTO queue_usage (queue_id, unfinished, permits_in_use, rate_window_start, "
                        "rate_window_used, rate_reserved, priority_levels, started_total, succeeded_total, "
                        "failed_total) SELECT LPAD(LOWER(HEX(nums.n)), 32, '0'), 0, 0, NULL, 0, 0, 0, %s, %s, %s "
                        f"FROM {_NUMBERS} WHERE nums.n < %s", (3 * history, 2 * history, history // 10, queues))
    (now,), = await execute(conn, "SELECT NOW(6)")
    current = now - (now - now.replace(second=0, microsecond=0)) % INTERVAL
    for k in range(1, history + 1):  # oldest first, as the sampler writes them
        at = current - INTERVAL * (history - k + 1)
        await execute(conn, "INSERT INTO queue_samples (queue_id, at, started_total, succeeded_total, failed_total) "
                            "SELECT queue_id, %s, %s, %s, %s FROM queue_usage", (at, 3 * k, 2 * k, k // 10))
    if heads and history:
        await execute(conn, "INSERT INTO queue_sample_heads (queue_id, at, started_total, succeeded_total, "
                            "failed_total) SELECT queue_id, at, started_total, succeeded_total, failed_total "
                            "FROM queue_samples WHERE at = %s", (current - INTERVAL,))
    await execute(conn, "ANALYZE TABLE queue_samples")


async def samples_size_mb(conn) -> float:
    (size,), = await execute(conn, "SELECT data_length + index_length FROM information_schema.tables "
                                   "WHERE table_schema = DATABASE() AND table_name = 'queue_samples'")
    return int(size) / 1e6


async def next_bucket(conn, after: float = 0.3) -> None:
    """Sleep until the database clock is `after` seconds into a bucket not seen yet."""
    (now,), = await execute(conn, "SELECT NOW(6)")
    into = (now.second % 5) + now.microsecond / 1e6
    await asyncio.sleep(5 - into + after)


async def bench(url: str, args: argparse.Namespace) -> None:
    from orbit.server.services import throughput
    from orbit.server.store import migrate
    from orbit.server.store.db import Database

    await migrate.upgrade(url)
    conn = await connect(url)
    db = Database(url)
    print(f"orbit from {Path(throughput.__file__).parents[2]}, schema {migrate.head_revision()}, "
          f"heads table: {await has_heads(conn)}, {args.queues} queues, {args.runs} runs per case")
    rows = []
    try:
        ids = [f"{n:032x}" for n in range(0, args.queues, max(1, args.queues // args.moved))][: args.moved]
        for history in args.histories:
            t0 = time.perf_counter()
            await load(conn, args.queues, history)
            loaded = time.perf_counter() - t0
            if history == 0:
                await next_bucket(conn)
                first = await throughput.sample(db)
                assert first == args.queues, first
            size = await samples_size_mb(conn)
            print(f"history {history}: loaded in {loaded:.1f} s, queue_samples {size:.0f} MB")
            for case, moved in (("idle", []), (f"{args.moved} moved", ids), ("all moved", None)):
                times, written = [], []
                for _ in range(args.runs):
                    await next_bucket(conn)
                    if moved is None:
                        await execute(conn, "UPDATE queue_usage SET started_total = started_total + 1")
                    elif moved:
                        await execute(conn, "UPDATE queue_usage SET started_total = started_total + 1, "
                                            f"succeeded_total = succeeded_total + 1 WHERE queue_id IN "
                                            f"({', '.join(['%s'] * len(moved))})", tuple(moved))
                    t = time.perf_counter()
                    written.append(await throughput.sample(db))
                    times.append((time.perf_counter() - t) * 1000)
                expect = {"idle": 0, "all moved": args.queues}.get(case, len(ids))
                assert all(w == expect for w in written), (case, written)
                rows.append((history, case, min(times), statistics.median(times), max(times), expect))
                print(f"  {case:>10}: {' '.join(f'{t:.1f}' for t in times)} ms ({expect} samples a run)", flush=True)
    finally:
        conn.close()
        await db.close()
    print()
    print(f"{'samples/queue':>13} {'case':>10} {'min ms':>8} {'median':>8} {'max ms':>8} {'written':>8}")
    for history, case, lo, mid, hi, expect in rows:
        print(f"{history:>13} {case:>10} {lo:>8.1f} {mid:>8.1f} {hi:>8.1f} {expect:>8}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--histories", default="0,30,120", help="samples per queue before the runs, comma-separated")
    ap.add_argument("--moved", type=int, default=100, help="queues whose counters move in the 'moved' case")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    args.histories = [int(h) for h in args.histories.split(",")]
    if not 0 < args.moved <= args.queues <= 100_000:
        raise SystemExit("need 0 < --moved <= --queues <= 100000")
    name = f"orbit_bench_sampler_{uuid.uuid4().hex[:8]}"
    mysql(f"CREATE DATABASE {name} CHARACTER SET utf8mb4", timeout=30)
    try:
        asyncio.run(bench(f"{MYSQL_BASE.rstrip('/')}/{name}", args))
    finally:
        mysql(f"DROP DATABASE IF EXISTS {name}", timeout=300)


if __name__ == "__main__":
    main()
