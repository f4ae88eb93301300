"""The peers at their best on this machine: each in the configurations worth trying, drain and
latency at a fixed 50 tasks/s, best drain first.

    python bench/peer_search.py [--peers celery,procrastinate] [--tasks 5000]

Runs the suite's own peer scenarios (bench/peers/*_runner.py) once per configuration and prints
a table per peer; the suite's defaults (the runners' BENCH_* environment defaults) should be the
best drain found here. Writes bench/peer-search-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _proc, suite  # noqa: E402
from bench.peers import celery_runner, procrastinate_runner  # noqa: E402

# (worker processes, pool, concurrency, prefetch multiplier)
CELERY = [(2, "solo", 1, "16"), (2, "solo", 1, "4"), (2, "solo", 1, "64"), (1, "solo", 1, "16"),
          (2, "threads", 4, "16"), (1, "prefork", 2, "16"), (2, "prefork", 2, "16")]
# (worker processes, concurrency)
PROCRASTINATE = [(2, 8), (2, 1), (2, 4), (2, 32), (1, 16), (4, 8)]


def _row(ctx: suite.Context, scenario: str, system: str, suffix: str = "") -> dict:
    for r in ctx.rows:
        if r.scenario == scenario and r.system == system and r.case.endswith(suffix) and r.status in ("ok", "partial"):
            return r.metrics
    return {}


async def _one(ctx: suite.Context, runner) -> None:
    try:
        await runner.run(ctx, drain=True, latency=True)
    finally:
        _proc.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="celery,procrastinate")
    ap.add_argument("--tasks", type=int, default=5000)
    args = ap.parse_args()
    sizes = replace(suite.QUICK, peer_drain_tasks=args.tasks)
    results = []
    _proc.install_handlers()
    with tempfile.TemporaryDirectory(prefix="orbit-peer-search-") as tmp:
        for peer in args.peers.split(","):
            system = "celery+redis" if peer == "celery" else peer
            configs = CELERY if peer == "celery" else PROCRASTINATE
            for cfg in configs:
                ctx = suite.Context("quick", sizes, ["drain", "latency"], [peer], Path(tmp))
                if peer == "celery":
                    celery_runner.WORKERS, celery_runner.POOL, celery_runner.CONCURRENCY, celery_runner.PREFETCH = cfg
                    runner = celery_runner
                else:
                    procrastinate_runner.WORKERS, procrastinate_runner.CONCURRENCY = cfg
                    runner = procrastinate_runner
                asyncio.run(_one(ctx, runner))
                drain, fixed = _row(ctx, "drain", system), _row(ctx, "latency", system, "(fixed)")
                results.append({"peer": system, "config": list(cfg), "drain_tasks_per_s": drain.get("tasks_per_s"),
                                "p50_ms_at_50": fixed.get("p50_ms"), "p99_ms_at_50": fixed.get("p99_ms")})
    print(f"\n{'peer':<14} {'configuration':<28} {'drain/s':>9} {'p50@50/s':>9} {'p99@50/s':>9}")
    for r in sorted(results, key=lambda r: (r["peer"], -(r["drain_tasks_per_s"] or 0))):
        print(f"{r['peer']:<14} {str(r['config']):<28} {r['drain_tasks_per_s'] or '-':>9} "
              f"{r['p50_ms_at_50'] or '-':>9} {r['p99_ms_at_50'] or '-':>9}")
    out = Path(__file__).resolve().parent / f"peer-search-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
