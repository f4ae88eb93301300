"""Where a task's submit->Start time goes at light load, step by step inside the server.

    python bench/light_path.py [--rate 50] [--seconds 8] [--sessions 4] [--gap-ms 20]

Runs `bench/latency_probe.py`'s load (single submits at a fixed rate, worker sessions waiting in
their claims, each lease started at once) against one node launched through
`bench/_light_trace.py`, which timestamps every MariaDB round trip, every Start frame's arrival
and every answer a submit gives a waiting claim as its COMMIT goes out. Each submit that served a
claim is then followed to its task's Start, and the p50/p90 of each step is printed with the
server's CPU over it (the thread's, other work of the node in those moments included):

  submit: reads            the submit's first round trip (queue, receipts, credential)
  submit: planning         Python between it and the writes (admission, the claim's plan)
  submit: writes           the round trip of the writes, after which the claim is answered
  answer -> Start frame    the worker's turn-around, WebSocket hops included
  Start frame -> its reads the node, from the frame to the Start's first round trip
  Start: locks             the Start's first round trip (task and lease rows, controls, clock)
  Start: planning          Python between it and the COMMIT's round trip
  Start: COMMIT            the round trip of its writes and COMMIT (the reply follows)
  (submit: COMMIT)         the submit's COMMIT, overlapping the turn-around

A submit is matched to its Start by order (the first Start frame after its answer, the first
lock round trip after that frame): right while one task's path ends before the next submit,
as at tens of tasks per second; at higher rates the steps mix tasks.

Then it times a one-statement round trip to MariaDB back to back and after an idle gap of
`--gap-ms` (as at light load, where each round trip follows one): on a virtual machine whose
cores sleep when idle the second is several times the first, and every round trip of the path
pays it. Peers pay it too, per round trip of their own path.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import environment, mysql_params, percentile
from bench._worker import run_loop
from bench.latency_probe import probe

_LOCK_READS = "| SELECT:tasks SELECT:leases"  # how a Start's (or a report's) first round trip begins


def traced_probe(database_url: str | None, rate: float, seconds: float, sessions: int, *, sql: bool = False,
                 inside: Callable[[dict], Any] | None = None) -> tuple[list[list], Any]:
    """`bench/latency_probe.py`'s load against one node run through `bench/_light_trace.py`
    (with `sql`, the text of every round trip too), on `database_url` or a fresh database; the
    trace's records, and what `inside(creds)` returned while the node still ran."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.jsonl"
        os.environ["ORBIT_BENCH_TRACE"] = str(trace)
        os.environ["ORBIT_BENCH_TRACE_SQL"] = "1" if sql else ""
        os.environ["ORBIT_BENCH_SERVER_CMD"] = f"{sys.executable} {Path(__file__).with_name('_light_trace.py')} orbit"
        with environment(database_url) as (urls, creds):
            run_loop(probe(urls[0], creds, rate, seconds, sessions))
            inner = inside(creds) if inside is not None else None
        # The node writes its trace as it exits, when `environment` has stopped it.
        records = [orjson.loads(line) for line in trace.read_bytes().splitlines()] if trace.exists() else []
    return records, inner


def round_trips(records: list[list]) -> dict[int, list[tuple]]:
    """Each traced transaction's round trips, in the order they were sent: (sent, answered, CPU
    at both, shapes[, text]) each."""
    trips: dict[int, list[tuple]] = {}
    for r in records:
        if r[0] == "rt":
            trips.setdefault(r[1], []).append(tuple(r[2:]))
    for rts in trips.values():
        rts.sort(key=lambda rt: rt[0])
    return trips


def steps(records: list[list]) -> dict[str, list[tuple[float, float]]]:
    """Per step of the path, (wall ms, server CPU ms) of every submit followed to its Start."""
    trips = round_trips(records)
    starts = sorted(r[1] for r in records if r[0] == "start")
    # (sent at, transaction, its index there) of every lock round trip
    lock_trips = sorted((rt[0], tx, i) for tx, rts in trips.items() for i, rt in enumerate(rts)
                        if rt[4].startswith(_LOCK_READS))
    out: dict[str, list[tuple[float, float]]] = {}

    def add(name: str, wall: float, cpu: float = float("nan")) -> None:
        out.setdefault(name, []).append((wall * 1e3, cpu * 1e3))

    for r in records:
        if r[0] != "answer":
            continue
        _, tx, answered = r
        rts = trips.get(tx, [])
        before = [rt for rt in rts if rt[1] <= answered]
        after = [rt for rt in rts if rt[0] >= answered]
        if len(before) < 2 or not after:
            continue
        reads, writes = before[0], before[-1]
        frame = next((t for t in starts if t >= answered), None)
        if frame is None:
            continue
        lock = next((lt for lt in lock_trips if lt[0] >= frame), None)
        if lock is None or lock[2] + 1 >= len(trips[lock[1]]):
            continue
        locks, commit = trips[lock[1]][lock[2]], trips[lock[1]][lock[2] + 1]
        add("submit: reads", reads[1] - reads[0], reads[3] - reads[2])
        add("submit: planning", writes[0] - reads[1], writes[2] - reads[3])
        add("submit: writes", writes[1] - writes[0], writes[3] - writes[2])
        add("answer -> Start frame", frame - answered)
        add("Start frame -> its reads", locks[0] - frame)
        add("Start: locks", locks[1] - locks[0], locks[3] - locks[2])
        add("Start: planning", commit[0] - locks[1], commit[2] - locks[3])
        add("Start: COMMIT", commit[1] - commit[0], commit[3] - commit[2])
        add("(submit: COMMIT)", after[0][1] - after[0][0], after[0][3] - after[0][2])
        add("submit reads sent -> Start COMMIT answered", commit[1] - reads[0])
    return out


async def idle_round_trips(url: str, gap_s: float, n: int = 200) -> tuple[float, float]:
    """p50 ms of `SELECT 1` round trips back to back, and after `gap_s` of idleness each."""
    import asyncmy

    conn = await asyncmy.connect(**mysql_params(url), autocommit=True)
    try:
        out = []
        for gap in (0.0, gap_s):
            times = []
            for _ in range(n):
                if gap:
                    await asyncio.sleep(gap)
                t = time.perf_counter()
                async with conn.cursor() as cur:
                    await cur.execute("SELECT 1")
                    await cur.fetchall()
                times.append((time.perf_counter() - t) * 1e3)
            out.append(statistics.median(times))
        return out[0], out[1]
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--gap-ms", type=float, default=20)
    a = ap.parse_args()
    records, (back_to_back, after_gap) = traced_probe(
        None, a.rate, a.seconds, a.sessions,
        inside=lambda creds: run_loop(idle_round_trips(creds["_database_url"], a.gap_ms / 1000)))
    found = steps(records)
    if not found:
        raise SystemExit("light_path: no submit could be followed to its Start (did the server write its trace?)")
    followed = len(next(iter(found.values())))
    print(f"\nthe path inside the server, {followed} submits followed to their Start (ms; CPU: the server's)")
    for name, values in found.items():
        wall = [w for w, _ in values]
        cpu = [c for _, c in values if not math.isnan(c)]
        cpu_text = f"  CPU p50 {percentile(cpu, 50):6.2f}" if cpu else ""
        print(f"  {name:42s} p50 {percentile(wall, 50):6.2f}  p90 {percentile(wall, 90):6.2f}{cpu_text}")
    print(f"SELECT 1 round trip: p50 {back_to_back:.3f} ms back to back, {after_gap:.3f} ms after "
          f"{a.gap_ms:g} ms idle ({after_gap / back_to_back:.1f}x)")


if __name__ == "__main__":
    main()
