"""Start what a benchmark needs on loopback: a migrated database, bootstrap credentials, server nodes."""

from __future__ import annotations

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

import httpx

MYSQL_BASE = os.environ.get("ORBIT_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli(name: str) -> list[str]:
    exe = shutil.which(name)
    if exe:
        return [exe]
    module = "orbit.cli.orbit" if name == "orbit" else "orbit.cli.admin"
    return [sys.executable, "-c", f"from {module} import main; main()"]


def create_mysql_database() -> str:
    name = f"orbit_bench_{uuid.uuid4().hex[:8]}"
    subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"CREATE DATABASE {name} CHARACTER SET utf8mb4"], check=True)
    return f"{MYSQL_BASE}/{name}"


def drop_mysql_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"DROP DATABASE IF EXISTS {name}"], check=False)


def bootstrap(url: str, workdir: Path) -> dict:
    subprocess.run(_cli("orbit-admin") + ["--database-url", url, "migrate"], check=True, capture_output=True)
    out = workdir / "credentials.json"
    subprocess.run(
        _cli("orbit-admin") + ["--database-url", url, "bootstrap", "--application", "bench", "--namespace",
                               "default", "--environment", "development", "--queue", "default",
                               "--worker-access", "--output", str(out)],
        check=True, capture_output=True,
    )
    return json.loads(out.read_text())


@contextmanager
def servers(url: str, count: int = 1):
    """Yield base URLs of `count` orbit server nodes on one database."""
    procs, urls = [], []
    try:
        for i in range(count):
            port = free_port()
            procs.append(subprocess.Popen(
                _cli("orbit") + ["server", "--database-url", url, "--port", str(port), "--node-id", f"bench-{i}",
                                 "--log-level", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
            urls.append(f"http://127.0.0.1:{port}")
        deadline = time.time() + 30
        for u in urls:
            while True:
                try:
                    if httpx.get(u + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"server {u} did not become ready")
                time.sleep(0.1)
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


@contextmanager
def environment(database_url: str | None, nodes: int = 1):
    """A fresh MariaDB database (unless one is given), credentials and running nodes."""
    url = database_url or create_mysql_database()
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o700)
        creds = bootstrap(url, Path(tmp))
        creds["_database_url"] = url
        try:
            with servers(url, nodes) as urls:
                yield urls, creds
        finally:
            if database_url is None:
                drop_mysql_database(url)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(p / 100 * (len(ordered) - 1)))))
    return ordered[k]
