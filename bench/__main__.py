"""Orbit benchmark suite: one command, everything on loopback, bounded in time.

    python -m bench                 # = --quick: small sizes, a few minutes
    python -m bench --full          # the targets' sizes (100,000-task drains, 1,000,000-task backlog, 10,000 queues)
    python -m bench --only drain --only latency --peers celery
    python -m bench --list

Needs MariaDB on 127.0.0.1:3306 (root, no password; ORBIT_BENCH_MYSQL_URL to change), and for the
peers Redis on 127.0.0.1:6379 (BENCH_REDIS_URL, default db 7) and PostgreSQL on 127.0.0.1:5432
(BENCH_PG_URL, default postgresql://postgres@127.0.0.1:5432/test), plus `pip install -e '.[bench]'`.
A peer that cannot run is reported as unavailable and the suite goes on.

Prints a table and writes bench/results-<timestamp>.json. Every scenario creates its own databases
and processes and removes them at the end, also on failure, timeout or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

if __package__ in (None, ""):  # `python bench/__main__.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _proc, report, suite

# Upper bounds per scenario, seconds (quick, full). The scenario is cancelled past it, and cleaned up.
TIMEOUTS = {
    "db-ceiling": (120, 300),
    "submit": (300, 1200),
    "drain": (900, 5400),
    "latency": (300, 900),
    "backlog": (600, 5400),
    "many-queues": (300, 2400),
    "limits": (240, 600),
    "controls": (360, 1800),
    "schedules": (300, 1200),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes, a few minutes (the default)")
    size.add_argument("--full", action="store_true", help="the targets' sizes")
    ap.add_argument("--only", action="append", default=[], metavar="SCENARIO",
                    help=f"run only these (repeat or comma-separate): {', '.join(suite.SCENARIOS)}")
    ap.add_argument("--peers", default="celery,procrastinate",
                    help="peers for the drain and latency scenarios: comma list of celery, procrastinate, or none")
    ap.add_argument("--set", action="append", default=[], metavar="SIZE=VALUE",
                    help="override one size of the chosen mode, e.g. --set drain_tasks=20000 --set backlogs=0,50000 "
                         "(names: see Sizes in bench/suite.py)")
    ap.add_argument("--output", type=Path, help="JSON file (default bench/results-<timestamp>.json)")
    ap.add_argument("--log-dir", type=Path, help="keep server/worker logs here (default: a temporary directory)")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    return ap.parse_args(argv)


async def _bounded(coro, seconds: float):
    return await asyncio.wait_for(coro, seconds)


def run_scenario(ctx: suite.Context, name: str, fn, seconds: float) -> None:
    t0 = time.perf_counter()
    print(f"[bench] --- {name} (bound {seconds:.0f}s)", flush=True)
    try:
        asyncio.run(_bounded(fn(ctx), seconds))
    except TimeoutError:
        ctx.add(name, "-", "-", status="error", note=f"scenario timed out after {seconds:.0f}s")
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - one failing scenario must not stop the others
        traceback.print_exc()
        ctx.add(name, "-", "-", status="error", note=f"{type(exc).__name__}: {exc}"[:300])
    finally:
        _proc.stop_all()  # nothing of this scenario outlives it
    print(f"[bench] --- {name} done in {time.perf_counter() - t0:.0f}s", flush=True)


async def drain_and_latency(ctx: suite.Context) -> None:
    """Orbit 1 node (+ latency at half its drain rate), Orbit 2 nodes, Orbit 1 node with SDK workers
    (async and sync handlers), Orbit 1 node again, then each peer the same way."""
    from bench.peers import celery_runner, procrastinate_runner

    drain, latency = ctx.wants("drain"), ctx.wants("latency")

    async def guarded(scenario: str, system: str, coro) -> None:
        try:
            await coro
        except Exception as exc:  # noqa: BLE001 - one failing case is reported, the others still run
            traceback.print_exc()
            ctx.add(scenario, system, "-", status="error", note=f"{type(exc).__name__}: {exc}"[:300])
        finally:
            _proc.stop_all()

    await guarded("drain" if drain else "latency", "orbit",
                  suite.orbit_drain(ctx, 1, with_latency=latency, report_drain=drain))
    if drain:
        await guarded("drain", "orbit", suite.orbit_drain(ctx, 2, with_latency=False))
        await guarded("drain", "orbit", suite.orbit_drain(ctx, 1, with_latency=False, sdk="async"))
        await guarded("drain", "orbit", suite.orbit_drain(ctx, 1, with_latency=False, sdk="sync"))
        await guarded("drain", "orbit", suite.orbit_drain(ctx, 1, with_latency=False, sdk_in_flight=True))
        # The lean drain again: the SDK rows are compared with the mean of the lean drains before
        # and after them, so that the machine's drift over those minutes weighs on both sides.
        await guarded("drain", "orbit", suite.orbit_drain(ctx, 1, with_latency=False, again=True))
    runners = {"celery": celery_runner, "procrastinate": procrastinate_runner}
    for peer in ctx.peers:
        system = "celery+redis" if peer == "celery" else peer
        await guarded("drain" if drain else "latency", system, runners[peer].run(ctx, drain=drain, latency=latency))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name in suite.SCENARIOS:
            print(name)
        return 0
    selected = [s.strip() for item in args.only for s in item.split(",") if s.strip()] or list(suite.SCENARIOS)
    unknown = [s for s in selected if s not in suite.SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; choose from {', '.join(suite.SCENARIOS)}", file=sys.stderr)
        return 2
    peers = [] if args.peers.strip() in ("", "none") else [p.strip() for p in args.peers.split(",")]
    if any(p not in ("celery", "procrastinate") for p in peers):
        print("--peers: choose from celery, procrastinate, none", file=sys.stderr)
        return 2
    mode = "full" if args.full else "quick"
    sizes = suite.FULL if args.full else suite.QUICK
    try:
        sizes = suite.override(sizes, args.set)
    except ValueError as exc:
        print(f"--set: {exc}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    output = args.output or Path(__file__).resolve().parent / f"results-{stamp}.json"
    tmp = None
    if args.log_dir:
        log_dir = args.log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="orbit-bench-")
        log_dir = Path(tmp.name)
    os.chmod(log_dir, 0o700)
    ctx = suite.Context(mode, sizes, [s for s in suite.SCENARIOS if s in selected], peers, log_dir)
    _proc.install_handlers()
    idx = 1 if args.full else 0
    plan = [
        ("db-ceiling", suite.db_ceiling, TIMEOUTS["db-ceiling"][idx]),
        ("submit", suite.submit, TIMEOUTS["submit"][idx]),
        ("drain", drain_and_latency, TIMEOUTS["drain"][idx] + TIMEOUTS["latency"][idx]),
        ("backlog", suite.backlog, TIMEOUTS["backlog"][idx]),
        ("many-queues", suite.many_queues, TIMEOUTS["many-queues"][idx]),
        ("limits", suite.limits, TIMEOUTS["limits"][idx]),
        ("controls", suite.controls, TIMEOUTS["controls"][idx]),
        ("schedules", suite.schedules, TIMEOUTS["schedules"][idx]),
    ]
    interrupted = False
    try:
        for name, fn, bound in plan:
            if name == "drain" and not (ctx.wants("drain") or ctx.wants("latency")):
                continue
            if name != "drain" and not ctx.wants(name):
                continue
            run_scenario(ctx, name, fn, bound)
    except KeyboardInterrupt:
        interrupted = True
        print("[bench] interrupted: stopping children, dropping databases", file=sys.stderr)
    finally:
        _proc.stop_all()
        data = ctx.to_json()
        data["interrupted"] = interrupted
        output.write_text(json.dumps(data, indent=2, default=str))
        print()
        print(report.render(data, suite.SCENARIOS))
        print(f"\nresults: {output}")
        if args.log_dir:
            print(f"logs: {log_dir}")
        if tmp is not None:
            tmp.cleanup()
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
