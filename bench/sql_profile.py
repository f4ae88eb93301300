"""Where MariaDB's time goes, per statement shape and per task, under a real workload.

    python bench/sql_profile.py [--tasks 20000] [--top 30] [--sdk]  # an end-to-end drain (bench/drain_cpu.py)
    python bench/sql_profile.py --probe [--rate 50 --seconds 6]       # light load (bench/latency_probe.py)
    python bench/sql_profile.py --batches 60                           # batch submits of 500 (bench/submit.py)

Turns MariaDB's slow query log on for every statement (`long_query_time = 0`) while the
workload runs in a process of its own, then restores the server's settings and removes the
log. Statements are grouped by their first words (the table and the columns they start
with); each shape's `Query_time` is summed and divided by the tasks, and its buffer pool pages
accessed (`log_slow_verbosity = innodb`) are averaged per statement. `Query_time` is the
server's wall time for the statement, waits included: compare shapes within one run, and
runs with each other by their shares, not by absolute microseconds on a shared machine.
Needs the benchmark MariaDB on this machine (its log file is read from the data directory).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._harness import mysql  # noqa: E402

_ENTRY = re.compile(r"\n(?=# (?:Time|User@Host):)")
_TIMES = re.compile(r"Query_time: ([\d.]+)\s+Lock_time: [\d.]+\s+Rows_sent: (\d+)\s+Rows_examined: (\d+)")
_PAGES = re.compile(r"Pages_accessed: (\d+)")


def shape(statement: str, words: int = 5) -> str:
    """A statement's first words: enough to tell the queries of the store apart (a SELECT also
    by its table and its locking: a claim's scan and a lock read start alike)."""
    head = " ".join(statement.split()[:words])[:72]
    if statement.lstrip().upper().startswith("SELECT"):
        table = re.search(r"\bFROM\s+(\w+)", statement)
        lock = " SKIP LOCKED" if "SKIP LOCKED" in statement else " FOR UPDATE" if "FOR UPDATE" in statement else ""
        head += f" [{table.group(1) if table else '?'}{lock}]"
    return head


def aggregate(log: str) -> dict[str, list[float]]:
    """Per shape: [statements, seconds, rows examined, buffer pool pages accessed]."""
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0, 0])
    for entry in _ENTRY.split(log):
        m = _TIMES.search(entry)
        if not m:
            continue
        text = [line for line in entry.split("\n")
                if line and not line.startswith(("#", "SET timestamp", "use "))]
        if not text:
            continue
        row = out[shape(text[0])]
        row[0] += 1
        row[1] += float(m.group(1))
        row[2] += int(m.group(3))
        pages = _PAGES.search(entry)
        row[3] += int(pages.group(1)) if pages else 0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=20000, help="tasks drained (drain mode)")
    ap.add_argument("--probe", action="store_true", help="light load through bench/latency_probe.py instead")
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--batches", type=int, default=0,
                    help="batch submits of 500 (bench/submit.py) instead of a drain")
    ap.add_argument("--sdk", action="store_true",
                    help="drain with the SDK's orbit.Worker as a user sets it up (2 processes x concurrency 64)")
    args = ap.parse_args()
    here = Path(__file__).resolve().parent
    if args.batches:
        cmd = [sys.executable, str(here / "submit.py"), "--single", "1", "--batches", str(args.batches)]
        tasks = args.batches * 500
    elif args.probe:
        cmd = [sys.executable, str(here / "latency_probe.py"), "--rate", str(args.rate), "--seconds", str(args.seconds)]
        tasks = int(args.rate * args.seconds)
    else:
        cmd = [sys.executable, str(here / "drain_cpu.py"), "--tasks", str(args.tasks)]
        if args.sdk:
            cmd += ["--sdk", "--sessions", "1", "--concurrency", "64"]
        tasks = args.tasks
    datadir, before_time, before_file, before_on, before_verbosity = mysql(
        "SELECT @@datadir, @@global.long_query_time, @@global.slow_query_log_file, @@global.slow_query_log, "
        "@@global.log_slow_verbosity").split("\t")
    name = f"orbit-sql-profile-{os.getpid()}.log"
    path = Path(datadir.strip()) / name
    mysql(f"SET GLOBAL slow_query_log = 0; SET GLOBAL slow_query_log_file = '{name}'; "
          "SET GLOBAL long_query_time = 0; SET GLOBAL log_slow_verbosity = 'innodb'; SET GLOBAL slow_query_log = 1")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    finally:
        mysql(f"SET GLOBAL slow_query_log = 0; SET GLOBAL long_query_time = {float(before_time)}; "
              f"SET GLOBAL slow_query_log_file = '{before_file.strip()}'; "
              f"SET GLOBAL log_slow_verbosity = '{before_verbosity.strip()}'; SET GLOBAL slow_query_log = {int(before_on)}")
    try:
        log = path.read_text(errors="replace")
    finally:
        path.unlink(missing_ok=True)
    print(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-2000:])
    # The preload's writes are part of the drain's database: each task was submitted once.
    rows = aggregate(log)
    total = sum(r[1] for r in rows.values()) or 1.0
    print(f"{len(rows)} statement shapes; statement time per task {total * 1e6 / tasks:.1f} us ({tasks} tasks)")
    print(f"{'statements':>10} {'us/task':>8} {'share':>6} {'rows ex.':>9} {'pages':>8}  shape")
    for key, (n, secs, examined, pages) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{int(n):>10} {secs * 1e6 / tasks:>8.1f} {100 * secs / total:>5.1f}% {examined / n:>9.1f} "
              f"{pages / n:>8.0f}  {key}")


if __name__ == "__main__":
    main()
