"""What a submit taken in one round trip would save at light load: the bound, on MariaDB itself.

    python bench/one_trip_submit.py [--rate 50] [--seconds 4] [--rounds 300] [--gap-ms 20]

At light load a submit serves a waiting claim in its own transaction, in three round trips: its
reads (the first statement reads the clock that becomes the task's `created_at`), then, after the
node's planning, its writes, then its COMMIT. A submit planned before its first round trip (its
reads turned into guards on its writes) would take one, or two with the COMMIT apart.

This runs `bench/latency_probe.py`'s load against one node traced by `bench/_light_trace.py`
(with the text of every round trip), takes the last submit that answered a claim in exactly those
three round trips, and replays its statements on the same database, interleaved, each after an
idle gap of `--gap-ms` as at light load, with fresh ids and a later clock every time:

  as today          reads | writes | COMMIT            (add the traced planning: it sits between)
  one trip          reads + writes | COMMIT
  one trip, COMMIT  reads + writes + COMMIT

Only MariaDB's side of the time is replayed (plus the driver); the traced planning's p50 is
printed beside it. A replay writes rows of its own and rolls the usage counters back after each
round so that the guards keep holding.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import create_mysql_database, drop_mysql_database, environment, mysql_params
from bench._worker import run_loop
from bench.latency_probe import probe

_TS = re.compile(r"'(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})'")
# The values a replay must not repeat: (table, index of the VALUES item) of the submit's writes.
_FRESH = (("tasks", 0), ("leases", 0), ("event_batches", 0), ("idempotency_records", 2), ("worker_claims", 1))
MODES = ("as today", "one trip", "one trip, COMMIT")


def captured_submit(records: list[list]) -> tuple[str, str, float] | None:
    """(reads, writes) of the last submit that answered a claim in three round trips (reads,
    writes, COMMIT), with the p50 in ms of the planning between reads and writes over all such
    submits; None without one."""
    trips: dict[int, list[list]] = {}
    for r in records:
        if r[0] == "rt" and len(r) > 7:
            trips.setdefault(r[1], []).append(r)
    found, planning = None, []
    for r in records:
        if r[0] != "answer":
            continue
        rts = sorted(trips.get(r[1], []), key=lambda t: t[2])
        if len(rts) != 3 or rts[2][7] != "COMMIT" or not rts[1][2] >= rts[0][3]:
            continue
        planning.append((rts[1][2] - rts[0][3]) * 1e3)
        found = (rts[0][7], rts[1][7])
    return None if found is None else (*found, statistics.median(planning))


def _values(text: str, table: str) -> list[str]:
    """The quoted values of the first row that `text` inserts into `table`, in order."""
    m = re.search(rf"INSERT INTO {table} \([^)]*\) VALUES \((.*?)\)(?:;|,\(|\s*ON DUPLICATE|$)", text, re.DOTALL)
    return re.findall(r"'((?:[^'\\]|\\.)*)'", m.group(1)) if m else []


def fresh_ids(writes: str) -> list[str]:
    """The ids and keys the submit's writes created, which a replay must replace."""
    out = []
    for table, index in _FRESH:
        values = _values(writes, table)
        if len(values) > index:
            out.append(values[index])
    return out


def clock_of(writes: str) -> str:
    """The transaction's clock, as its first timestamp literal (the new task's available_at)."""
    m = _TS.search(writes)
    if m is None:
        raise ValueError("no timestamp in the submit's writes")
    return m.group(1)


def replayed(text: str, ids: list[str], clock: str, new_clock: datetime) -> str:
    """`text` with every id of `ids` replaced by a new one of the same length, and the clock
    (SQL and JSON spellings) by `new_clock`."""
    for old in ids:
        new = uuid.uuid4().hex
        text = text.replace(old, (new * 2)[:len(old)])
    sql = new_clock.strftime("%Y-%m-%d %H:%M:%S.%f")
    return text.replace(clock, sql).replace(clock.replace(" ", "T") + "Z", sql.replace(" ", "T") + "Z")


async def replay(url: str, reads: str, writes: str, rounds: int, gap_s: float) -> dict[str, list[float]]:
    """ms per round of each mode, interleaved; each round after `gap_s` idle."""
    import asyncmy
    from asyncmy.constants import CLIENT

    conn = await asyncmy.connect(**mysql_params(url), autocommit=False, client_flag=CLIENT.MULTI_STATEMENTS)
    ids, clock = fresh_ids(writes), clock_of(writes)
    start = datetime.strptime(clock, "%Y-%m-%d %H:%M:%S.%f") + timedelta(days=1)

    async def send(text: str) -> None:
        async with conn.cursor() as cur:
            await cur.execute(text)
            while await cur.nextset():
                pass

    out: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for i in range(rounds):
            for k, mode in enumerate(MODES):
                # Each round a second later: the rate windows the guards read move on as a node's would.
                at = start + timedelta(seconds=i * len(MODES) + k)
                r, w = replayed(reads, ids, clock, at), replayed(writes, ids, clock, at)
                await send("UPDATE queue_usage SET permits_in_use = 0, unfinished = 0;\n"
                           "UPDATE application_usage SET permits_in_use = 0, unfinished = 0;\nCOMMIT")
                await asyncio.sleep(gap_s)
                t0 = time.perf_counter()
                if mode == "as today":
                    await send(r)
                    await send(w)
                    await send("COMMIT")
                elif mode == "one trip":
                    await send(f"{r};\n{w}")
                    await send("COMMIT")
                else:
                    await send(f"{r};\n{w};\nCOMMIT")
                out[mode].append((time.perf_counter() - t0) * 1e3)
    finally:
        conn.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--gap-ms", type=float, default=20)
    a = ap.parse_args()
    url = create_mysql_database()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.jsonl"
            os.environ["ORBIT_BENCH_TRACE"] = str(trace)
            os.environ["ORBIT_BENCH_TRACE_SQL"] = "1"
            tracer = Path(__file__).with_name("_light_trace.py")
            os.environ["ORBIT_BENCH_SERVER_CMD"] = f"{sys.executable} {tracer} orbit"
            with environment(url) as (urls, creds):
                run_loop(probe(urls[0], creds, a.rate, a.seconds, a.sessions))
            records = [orjson.loads(line) for line in trace.read_bytes().splitlines()] if trace.exists() else []
        captured = captured_submit(records)
        if captured is None:
            raise SystemExit("one_trip_submit: no submit answered a claim in three round trips")
        reads, writes, planning = captured
        times = run_loop(replay(url, reads, writes, a.rounds, a.gap_ms / 1000))
    finally:
        drop_mysql_database(url)
    print(f"the submit's transaction as captured: {reads.count(';') + 1} reads, {writes.count(';') + 1} writes "
          f"and its COMMIT; traced planning between them p50 {planning:.2f} ms")
    print(f"replayed, {a.rounds} rounds each, every round after {a.gap_ms:g} ms idle (ms; the first statement "
          "reads the clock):")
    for mode, values in times.items():
        values.sort()
        print(f"  {mode:18s} p50 {statistics.median(values):6.2f}  p90 {values[int(0.9 * len(values))]:6.2f}")
    today = statistics.median(times["as today"]) + planning
    print(f"as today with its planning: {today:.2f} ms; one trip saves "
          f"{today - statistics.median(times['one trip']):.2f} ms, one trip with its COMMIT "
          f"{today - statistics.median(times['one trip, COMMIT']):.2f} ms")


if __name__ == "__main__":
    main()
