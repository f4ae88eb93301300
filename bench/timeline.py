"""Submit->Start under an offered load, from stored history: how the tasks were grouped into
transactions, how long each stage took, and where the CPU went.

    python bench/timeline.py [--rate 3000] [--seconds 8] [--tick 20] [--pre N] [--before RATE] [--py-spy FILE]

One node and the suite's worker processes (2 x 8 lean sessions) on a fresh database; the
suite's open loop offers `--rate` tasks/s, what is due submitted every `--tick` ms (one
request: a batch when more than one task is due). `--pre N` first drains N pre-loaded tasks
in the same queue (the suite measures latency after its drain). Tasks that went through the
same transaction share its database time, so `created_at`, `leased_at`, `started_at` and
`ended_at` group them by submit, claim, Start and complete. Prints:

  - p50/p99 of created_at -> started_at, and of each stage;
  - the group sizes of each stage;
  - the CPU of the server, MariaDB, the worker processes and this client, per task and as
    a share of one core over the load window;
  - the largest latency of the tasks created in each 100 ms (where the tail comes from).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _proc, suite
from bench._db import Conn
from bench._harness import cpu_seconds, environment, percentile, pid_of


async def measure(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="orbit-timeline-") as tmp:
        await _measure(args, Path(tmp))


async def _measure(args: argparse.Namespace, log_dir: Path) -> None:
    ctx = suite.Context("quick", suite.QUICK, ["latency"], [], log_dir)
    with environment(None, 1, log_dir) as (urls, creds):
        token = creds["token"]
        db = Conn(creds["_database_url"])
        procs = []
        try:
            async with suite.api(urls[0], token, 8) as client:
                qid = await suite.create_queue(client, "timeline")
                if args.pre:
                    await suite.api_preload(client, qid, args.pre)
                procs = suite.spawn_workers(ctx, urls, token, "timeline", queue_id=qid)
                await asyncio.sleep(2)
                if args.pre:
                    await suite.wait_count(db, suite.DRAINED, (qid,), 1, 600)
                for rate in args.before:
                    await suite.offer_submits(client, qid, rate, args.seconds, args.tick)
                    await suite.wait_count(db, suite.DRAINED, (qid,), 1, 600)
                (t0,), = await db.fetch("SELECT NOW(6)")
                history = await db.fetch("SELECT count FROM information_schema.innodb_metrics "
                                         "WHERE name = 'trx_rseg_history_len'")
                pids = {"server": [pid_of("-f", "orbit server")], "mariadb": [pid_of("-x", "mariadbd")],
                        "workers": [p.pid for p in procs], "client": [os.getpid()]}
                cpu0 = {k: sum(cpu_seconds(x) for x in v) for k, v in pids.items()}
                w0 = time.perf_counter()
                spy = None
                if args.py_spy:
                    spy = subprocess.Popen(["py-spy", "record", "-r", "400", "-d", str(int(args.seconds)), "-f", "raw",
                                            "-o", args.py_spy, "-p", str(pids["server"][0])],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                sent, _ = await suite.offer_submits(client, qid, args.rate, args.seconds, args.tick)
                wall = time.perf_counter() - w0
                cpu1 = {k: sum(cpu_seconds(x) for x in v) for k, v in pids.items()}
                if spy is not None:
                    spy.wait()
                await suite.wait_count(db, "SELECT COUNT(*) FROM leases l JOIN tasks t ON t.id = l.task_id "
                                           "WHERE l.queue_id = %s AND l.ended_at IS NOT NULL AND t.created_at >= %s",
                                       (qid, t0), sent, 60)
                rows = await db.fetch(
                    "SELECT t.created_at, l.leased_at, l.started_at, l.ended_at FROM leases l "
                    "JOIN tasks t ON t.id = l.task_id WHERE l.queue_id = %s AND t.created_at >= %s "
                    "AND l.ended_at IS NOT NULL AND l.attempt = 1", (qid, t0))
        finally:
            _proc.stop_many(procs, grace=5)
            db.close()
    report(args, rows, sent, wall, cpu0, cpu1)
    if history:
        print(f"  undo history not yet purged when the window began: {history[0][0]} transactions")


def report(args, rows, sent, wall, cpu0, cpu1) -> None:
    def ms(a, b) -> float:
        return (b - a).total_seconds() * 1000

    lat = [ms(c, s) for c, _, s, _ in rows]
    print(f"{len(rows)} tasks at {args.rate:.0f}/s, tick {args.tick:g} ms: submit->Start p50 "
          f"{percentile(lat, 50):.2f} ms, p99 {percentile(lat, 99):.2f} ms")
    share = {k: round((cpu1[k] - cpu0[k]) / wall, 2) for k in cpu0}
    per_task = {k: round((cpu1[k] - cpu0[k]) / max(1, sent) * 1e6) for k in cpu0}
    print(f"  CPU, share of one core: {share}")
    print(f"  CPU, us per task:       {per_task}")
    for name, i in (("submit", 0), ("claim", 1), ("start", 2), ("complete", 3)):
        sizes = list(Counter(r[i] for r in rows).values())
        print(f"  {name:9s} transactions {len(sizes):6d}, tasks each: mean {statistics.mean(sizes):6.1f}, "
              f"p50 {percentile(sizes, 50):4.0f}, max {max(sizes)}")
    for a, b, name in ((0, 1, "created -> leased"), (1, 2, "leased -> started"), (2, 3, "started -> ended")):
        d = [ms(r[a], r[b]) for r in rows]
        print(f"  {name:18s} p50 {percentile(d, 50):6.2f}  p90 {percentile(d, 90):6.2f}  p99 {percentile(d, 99):6.2f} ms")
    first = min(r[0] for r in rows)
    windows: dict[int, list[float]] = defaultdict(list)
    for c, _, s, _ in rows:
        windows[int((c - first).total_seconds() * 10)].append(ms(c, s))
    print("  largest per 100 ms:", " ".join(f"{max(windows[k]):.0f}" for k in sorted(windows)))
    slowest = Counter((c, le, s) for c, le, s, _ in sorted(rows, key=lambda r: ms(r[0], r[2]),
                                                            reverse=True)[:max(3, len(rows) // 100)])
    print("  slowest 1% (created at +s: created->leased, leased->started ms; tasks among them; tasks of their Start):")
    starts = Counter(r[2] for r in rows)
    for (c, le, s), n in slowest.items():
        print(f"    +{(c - first).total_seconds():7.3f}: {ms(c, le):6.2f} {ms(le, s):6.2f}  x{n} of {starts[s]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=3000)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--tick", type=float, default=20, help="ms between submissions (the suite: 20)")
    ap.add_argument("--pre", type=int, default=0, help="drain this many pre-loaded tasks first")
    ap.add_argument("--before", type=float, action="append", default=[], metavar="RATE",
                    help="offer this rate for as long and wait for the queue to drain, before measuring "
                         "(repeatable; the suite's light point follows 50%% of max and the sustained runs)")
    ap.add_argument("--py-spy", metavar="FILE", help="raw py-spy profile of the server over the load window")
    asyncio.run(measure(ap.parse_args()))


if __name__ == "__main__":
    main()
