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
import re
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import create_mysql_database, drop_mysql_database, mysql_params
from bench._worker import run_loop
from bench.light_path import round_trips, traced_probe

_TS = re.compile(r"'(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6})'")
# The values a replay must not repeat: (table, index of the VALUES item) of the submit's writes.
_FRESH = (("tasks", 0), ("leases", 0), ("event_batches", 0), ("idempotency_records", 2), ("worker_claims", 1))
MODES = ("as today", "one trip", "one trip, COMMIT")


def captured_submit(records: list[list]) -> tuple[str, str, float] | None:
    """(reads, writes) of the last submit that answered a claim in three round trips (reads,
    writes, COMMIT), with the p50 in ms of the planning between reads and writes over all such
    submits; None without one."""
    trips = round_trips(records)
    found, planning = None, []
    for r in records:
        if r[0] != "answer":
            continue
        rts = trips.get(r[1], [])
        # (sent, answered, CPU at both, shapes, text): three round trips, traced with their text
        if len(rts) != 3 or any(len(rt) < 6 for rt in rts) or rts[2][5] != "COMMIT" or rts[1][0] < rts[0][1]:
            continue
        planning.append((rts[1][0] - rts[0][1]) * 1e3)
        found = (rts[0][5], rts[1][5])
    return None if found is None else (*found, statistics.median(planning))


def _statements(text: str) -> int:
    """How many statements a round trip's text holds (`Tx._run_mysql` ends each but the last with a
    semicolon and a newline)."""
    return text.count(";\n") + 1


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


def fresh(ids: list[str]) -> dict[str, str]:
    """A new value of the same length for each of `ids`: one round's, for all its statements."""
    return {old: (uuid.uuid4().hex * 2)[:len(old)] for old in ids}


def replayed(text: str, renamed: dict[str, str], clock: str, new_clock: datetime) -> str:
    """`text` with the ids of `renamed` replaced by their new values, and the clock (SQL and
    JSON spellings) by `new_clock`."""
    for old, new in renamed.items():
        text = text.replace(old, new)
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
                renamed = fresh(ids)  # the reads look up the keys the writes then insert, as they did
                r, w = replayed(reads, renamed, clock, at), replayed(writes, renamed, clock, at)
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
    url = create_mysql_database()  # kept past the node's run: the replay needs its rows
    try:
        records, _ = traced_probe(url, a.rate, a.seconds, a.sessions, sql=True)
        captured = captured_submit(records)
        if captured is None:
            raise SystemExit("one_trip_submit: no submit answered a claim in three round trips")
        reads, writes, planning = captured
        times = run_loop(replay(url, reads, writes, a.rounds, a.gap_ms / 1000))
    finally:
        drop_mysql_database(url)
    print(f"the submit's transaction as captured: {_statements(reads)} reads, {_statements(writes)} writes "
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
