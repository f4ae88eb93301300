"""Start what a benchmark needs on loopback: a migrated database, bootstrap credentials, server nodes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from bench import _proc

MYSQL_BASE = os.environ.get("ORBIT_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(name: str) -> list[str]:
    """The command of `orbit` / `orbit-admin`; ORBIT_BENCH_SERVER_CMD replaces `orbit` (e.g. a
    wrapper that instruments the server)."""
    if name == "orbit" and os.environ.get("ORBIT_BENCH_SERVER_CMD"):
        return os.environ["ORBIT_BENCH_SERVER_CMD"].split()
    exe = shutil.which(name)
    if exe:
        return [exe]
    module = "orbit.cli.orbit" if name == "orbit" else "orbit.cli.admin"
    return [sys.executable, "-c", f"from {module} import main; main()"]


def mysql_params(url: str | None = None) -> dict:
    """asyncmy/pymysql connection keywords for a mysql://user:pass@host:port[/db] URL."""
    u = urlsplit(url or MYSQL_BASE)
    params = {"host": u.hostname or "127.0.0.1", "port": u.port or 3306, "user": unquote(u.username or "root"),
              "password": unquote(u.password or "")}
    db = u.path.lstrip("/")
    if db:
        params["db"] = db
    return params


def mysql(sql: str, database: str | None = None, timeout: float = 120) -> str:
    """Run SQL with the mysql client against the benchmark server; returns its tab-separated output."""
    p = mysql_params()
    args = ["mysql", f"-u{p['user']}", f"-h{p['host']}", f"-P{p['port']}", "-N", "-e", sql]
    if p["password"]:
        args.insert(1, f"-p{p['password']}")
    if database:
        args.append(database)
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=timeout).stdout


def create_mysql_database(prefix: str = "orbit_bench") -> str:
    """A fresh database, dropped at the end of the run (or by `drop_mysql_database`)."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    mysql(f"CREATE DATABASE {name} CHARACTER SET utf8mb4", timeout=30)
    url = f"{MYSQL_BASE}/{name}"
    _drops[url] = _proc.on_cleanup(f"drop database {name}",
                                   lambda: mysql(f"DROP DATABASE IF EXISTS {name}", timeout=300))
    return url


_drops: dict = {}


def drop_mysql_database(url: str) -> None:
    drop = _drops.pop(url, None)
    if drop is not None:
        drop()
    else:
        mysql(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]}", timeout=300)


def bootstrap(url: str, workdir: Path, permissions: tuple[str, ...] = (), schema_sql: str | None = None) -> dict:
    """Migrate, then issue the bootstrap credential (its permissions, the worker's, and `permissions`).
    `schema_sql` runs after the migrations: a schema change measured before it becomes one."""
    subprocess.run(_cli("orbit-admin") + ["--database-url", url, "migrate"], check=True, capture_output=True,
                   timeout=300)
    if schema_sql:
        mysql(schema_sql, database=urlsplit(url).path.lstrip("/"), timeout=300)
    out = workdir / "credentials.json"
    subprocess.run(
        _cli("orbit-admin") + ["--database-url", url, "bootstrap", "--application", "bench", "--namespace",
                               "default", "--environment", "development", "--queue", "default",
                               "--worker-access", "--output", str(out)]
        + [arg for p in permissions for arg in ("--permission", p)],
        check=True, capture_output=True, timeout=120,
    )
    return json.loads(out.read_text())


@contextmanager
def servers(url: str, count: int = 1, log_dir: Path | None = None):
    """Yield base URLs of `count` orbit server nodes on one database (stopped on exit, even on failure)."""
    procs, urls = [], []
    try:
        for i in range(count):
            port = free_port()
            log = str(log_dir / f"server-{i}.log") if log_dir else None
            procs.append(_proc.spawn(
                _cli("orbit") + ["server", "--database-url", url, "--port", str(port), "--node-id", f"bench-{i}",
                                 "--log-level", "warning"],
                log_path=log,
            ))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.time() + 60
        for p, u in zip(procs, urls):
            while True:
                try:
                    if httpx.get(u + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if p.poll() is not None:
                    raise RuntimeError(f"server {u} exited with code {p.returncode}")
                if time.time() > deadline:
                    raise RuntimeError(f"server {u} did not become ready")
                time.sleep(0.1)
        yield urls
    finally:
        _proc.stop_many(procs, grace=15)


@contextmanager
def environment(database_url: str | None, nodes: int = 1, log_dir: Path | None = None,
                permissions: tuple[str, ...] = (), schema_sql: str | None = None):
    """A fresh MariaDB database (unless one is given), credentials (with `permissions` beyond the
    bootstrap's, e.g. `applications:manage`) and running nodes; `schema_sql` as in `bootstrap`."""
    url = database_url or create_mysql_database()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        try:
            creds = bootstrap(url, Path(tmp), permissions, schema_sql)
            creds["_database_url"] = url
            with servers(url, nodes, log_dir) as urls:
                yield urls, creds
        finally:
            if database_url is None:
                drop_mysql_database(url)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a local process has used so far, from /proc."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds a local process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def context_switches(pid: int) -> int:
    """Context switches of all a local process's threads so far: each time one slept and was
    woken (a read that had to wait) or was preempted, from /proc."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(OSError):
            for line in status.read_text().splitlines():
                if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                    total += int(line.split()[1])
    return total


def pids_of(*pgrep_args: str) -> list[int]:
    """The processes `pgrep` finds with these arguments."""
    out = subprocess.run(["pgrep", *pgrep_args], capture_output=True, text=True, check=False).stdout.split()
    return [int(p) for p in out]


def pid_of(*pgrep_args: str) -> int | None:
    """The first process `pgrep` finds with these arguments, or None."""
    pids = pids_of(*pgrep_args)
    return pids[0] if pids else None


class DrainCpu:
    """CPU time of the servers, MariaDB and the worker processes from now on, per task: where a
    drain's time goes, read the same way in every run (all share the machine's cores)."""

    def __init__(self, worker_pids: list[int]) -> None:
        self.pids = {"server": pids_of("-f", "orbit server"), "mariadb": pids_of("-x", "mariadbd")[:1],
                     "workers": worker_pids}
        self.before = self._now()

    def _now(self) -> dict[str, tuple[float, float, int]]:
        out = {}
        for name, pids in self.pids.items():
            user = system = 0.0
            switches = 0
            for pid in pids:
                with contextlib.suppress(OSError):
                    u, s = cpu_split(pid)
                    user, system, switches = user + u, system + s, switches + context_switches(pid)
            out[name] = (user, system, switches)
        return out

    def us_per_task(self, tasks: int) -> dict[str, float]:
        return {k: v for k, v in self.per_task(tasks).items() if k.endswith("_cpu_us_per_task")}

    def per_task(self, tasks: int) -> dict[str, float]:
        """CPU µs per task of each, the share of it spent in the kernel (system calls: the
        round trips' writes and reads, and the wake-ups they cause) and context switches per task."""
        after = self._now()
        out: dict[str, float] = {}
        n = max(1, tasks)
        for name in self.pids:
            if not self.pids[name]:
                continue
            (u0, s0, c0), (u1, s1, c1) = self.before[name], after[name]
            cpu = (u1 - u0) + (s1 - s0)
            out[f"{name}_cpu_us_per_task"] = round(cpu / n * 1e6)
            out[f"{name}_system_share"] = round((s1 - s0) / cpu, 2) if cpu else 0.0
            out[f"{name}_switches_per_task"] = round((c1 - c0) / n, 3)
        return out


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(p / 100 * (len(ordered) - 1)))))
    return ordered[k]
