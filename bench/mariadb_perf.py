"""What MariaDB's CPU per task is spent on, by phase of its statements, under a real workload.

    python bench/mariadb_perf.py [--tasks 60000] [--sdk]              # a drain (bench/drain_cpu.py)
    python bench/mariadb_perf.py --probe [--rate 50 --seconds 25]     # light load (bench/latency_probe.py)
    python bench/mariadb_perf.py --batches 400                        # batch submits of 500 (bench/submit.py)

Runs the workload in a process of its own and, once it is under way, samples mariadbd's
on-CPU stacks with `perf record` for `--record` seconds; the tasks that ended in that window
(read from the workload's fresh database, by the database clock) turn samples into CPU µs per
task (with `--batches`: the tasks accepted in the window, by their `created_at`). Each sample is put in one phase by the MariaDB functions on its stack: parsing, one kind of
statement's execution (SELECT, UPDATE, INSERT, COMMIT; an UPDATE split further into InnoDB's
row work, the range optimizer that reads the `IN (…)` lists and the evaluation of the SET
values), the protocol around statements, and the rest (background threads: purge, the log
writer, I/O). Unlike the slow log (`bench/sql_profile.py`) it counts CPU, not wall time with
waits, and it costs the workload almost nothing. Needs `perf` and the benchmark MariaDB on this
machine (mariadbd's symbols: Debian's package keeps them).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._harness import mysql, pid_of

HZ = 1999

# The statement kinds, by the function mysql_execute_command calls for them (a SELECT's is a
# static function without a symbol).
_EXECUTORS = {"mysql_update": "UPDATE", "mysql_multi_update": "UPDATE", "mysql_insert": "INSERT",
              "trans_commit": "COMMIT", "trans_commit_implicit": "COMMIT", "handle_select": "SELECT",
              "mysql_select": "SELECT", "mysql_delete": "DELETE"}
_UPDATE_PARTS = {"handler::ha_update_row": "row work (InnoDB)", "SQL_SELECT::test_quick_select": "range optimizer",
                 "fill_record_n_invoke_before_triggers": "SET values"}


def classify(stack: list[str]) -> str:
    """One sample's phase; `stack` is leaf first."""
    if "mysql_execute_command" in stack:
        i = stack.index("mysql_execute_command")
        inner = stack[:i]
        kind = next((_EXECUTORS[f] for f in reversed(inner) if f in _EXECUTORS), "SELECT")
        if kind == "UPDATE":
            part = next((p for f, p in _UPDATE_PARTS.items() if f in inner), "other")
            return f"UPDATE: {part}"
        return kind
    if "MYSQLparse" in stack or "parse_sql" in stack:
        return "parse"
    if "do_command" in stack:
        return "protocol and dispatch (network, statement set-up)"
    return "background threads and other"


def samples(text: str):
    """Stacks (leaf first, function names) of `perf script -F comm,ip,sym` output."""
    stack: list[str] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            if stack:
                yield stack
            stack = []
            continue
        if stack is not None:
            parts = line.strip().split(" ", 1)
            stack.append(parts[1].split("+0x")[0] if len(parts) > 1 else "?")
    if stack:
        yield stack


# Per workload: when it is under way (a read of a few rows, not a scan, as it is asked five
# times a second), and the tasks it handled between two database clock readings.
_UNDER_WAY = {"drain": "SELECT EXISTS (SELECT 1 FROM leases)",
              "batches": "SELECT EXISTS (SELECT 1 FROM tasks LIMIT 1 OFFSET 1000)"}
_HANDLED = {"drain": "SELECT COUNT(*) FROM tasks WHERE finished_at > '{t0}' AND finished_at <= '{t1}'",
            "batches": "SELECT COUNT(*) FROM tasks WHERE created_at > '{t0}' AND created_at <= '{t1}'"}


def _under_way(db: str, kind: str) -> bool:
    """False too while the workload's tables are still being made."""
    try:
        return mysql(_UNDER_WAY[kind], db).strip() == "1"
    except subprocess.CalledProcessError:
        return False


def newest_database(before: set[str]) -> str | None:
    names = set(mysql("SHOW DATABASES LIKE 'orbit\\_bench\\_%'").split())
    fresh = sorted(names - before)
    return fresh[-1] if fresh else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=60000, help="tasks drained (drain mode)")
    ap.add_argument("--sdk", action="store_true",
                    help="drain with the SDK's orbit.Worker as a user sets it up (2 processes x concurrency 64)")
    ap.add_argument("--probe", action="store_true", help="light load through bench/latency_probe.py instead")
    ap.add_argument("--rate", type=float, default=50)
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--batches", type=int, default=0,
                    help="batch submits of 500 (bench/submit.py) instead of a drain: MariaDB CPU per accepted task")
    ap.add_argument("--record", type=float, default=5, help="seconds of sampling")
    args = ap.parse_args()
    if not shutil.which("perf"):
        sys.exit("perf is not installed")
    here = Path(__file__).resolve().parent
    kind = "batches" if args.batches else "drain"
    if args.batches:
        cmd = [sys.executable, str(here / "submit.py"), "--single", "1", "--batches", str(args.batches)]
    elif args.probe:
        cmd = [sys.executable, str(here / "latency_probe.py"), "--rate", str(args.rate), "--seconds", str(args.seconds)]
    else:
        cmd = [sys.executable, str(here / "drain_cpu.py"), "--tasks", str(args.tasks)]
        if args.sdk:
            cmd += ["--sdk", "--sessions", "1", "--concurrency", "64"]
    mariadbd = pid_of("-x", "mariadbd")
    if mariadbd is None:
        sys.exit("no mariadbd process on this machine")
    before = set(mysql("SHOW DATABASES LIKE 'orbit\\_bench\\_%'").split())
    workload = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, ended, script = _sample(workload, kind, before, str(mariadbd), args.record)
    finally:
        if workload.poll() is None:
            workload.kill()
            workload.wait()
    _report(out, ended, script, args.record)


def _sample(workload: subprocess.Popen, kind: str, before: set[str], pid: str,
            seconds: float) -> tuple[str, int, str]:
    """The workload's output, the tasks it handled while mariadbd was sampled and the samples."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        db = None
        deadline = time.time() + 120
        while time.time() < deadline and workload.poll() is None:
            db = db or newest_database(before)
            if db and _under_way(db, kind):
                break
            time.sleep(0.2)
        if db is None or workload.poll() is not None:
            sys.exit(f"the workload ended before its tasks ran:\n{workload.communicate()[0][-2000:]}")
        time.sleep(2.0)  # past the workers' start-up
        t0 = mysql("SELECT NOW(6)", db).strip()
        subprocess.run(["perf", "record", "-e", "cpu-clock", "-F", str(HZ), "-g", "-p", pid, "-o", str(data),
                        "--", "sleep", str(seconds)], check=True, capture_output=True)
        t1 = mysql("SELECT NOW(6)", db).strip()
        ended = int(mysql(_HANDLED[kind].format(t0=t0, t1=t1), db))
        out = workload.communicate()[0]
        script = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,ip,sym"], check=True, capture_output=True,
                                text=True).stdout
    return out, ended, script


def _report(out: str, ended: int, script: str, seconds: float) -> None:
    last = [line for line in out.splitlines() if line.lstrip().startswith(("preload", "TOTAL", "batch"))]
    print(last[-1] if last else out.strip().splitlines()[-1])
    if not ended:
        sys.exit("no task was handled while sampling")
    phases: collections.Counter[str] = collections.Counter()
    for stack in samples(script):
        phases[classify(stack)] += 1
    total = sum(phases.values())
    us = 1e6 / HZ / ended
    print(f"mariadbd on-CPU: {total * us:.0f} us per task ({total} samples over {ended} tasks in {seconds:g} s)")
    for phase, n in phases.most_common():
        print(f"{n * us:>9.1f} us/task {100 * n / total:>5.1f}%  {phase}")


if __name__ == "__main__":
    main()
