"""The CLIs as real subprocesses: helpers to run them, start servers, and fresh empty databases.

Every spawned server is killed in teardown, whatever the test did. Independent CLI
calls run concurrently (`cli_many`) because each one pays ~1.5 s of imports.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

SCRIPTS = Path(sysconfig.get_path("scripts"))
CLI_TIMEOUT = 30
READY_TIMEOUT = 25
# Never inherit the developer's own Orbit settings into the processes under test.
SCRUBBED = ("ORBIT_DATABASE_URL", "ORBIT_CREDENTIALS_FILE", "ORBIT_URL", "ORBIT_TOKEN")


def script(name: str) -> str:
    path = SCRIPTS / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"console script {name!r} not installed (pip install -e .)")
    return found


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:
        return f"{' '.join(self.args)} -> {self.returncode}\nstdout: {self.stdout}\nstderr: {self.stderr}"


def cli_many(*calls: tuple[list[str], dict[str, str] | None]) -> list[Result]:
    """Run independent CLI invocations concurrently; each is (argv with script name first, env)."""
    procs = []
    for argv, env in calls:
        cmd = [script(argv[0]), *argv[1:]]
        procs.append(
            (cmd, subprocess.Popen(cmd, env=env or child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   stdin=subprocess.DEVNULL, text=True))
        )
    results = []
    deadline = time.monotonic() + CLI_TIMEOUT
    for cmd, p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for _, q in procs:
                q.kill()
            pytest.fail(f"{' '.join(cmd)} did not finish within {CLI_TIMEOUT}s")
        results.append(Result(cmd, p.returncode, out, err))
    return results


def cli(*argv: str, env: dict[str, str] | None = None) -> Result:
    return cli_many((list(argv), env))[0]


def admin(*argv: str, env: dict[str, str] | None = None) -> Result:
    return cli("orbit-admin", *argv, env=env)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `orbit server`/`orbit dev` child with its output captured in files."""

    def __init__(self, argv: list[str], env: dict[str, str] | None, port: int, logdir: Path) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        tag = uuid.uuid4().hex[:6]
        self.out_path = logdir / f"{argv[0]}-{tag}.out"
        self.err_path = logdir / f"{argv[0]}-{tag}.err"
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(
                [script(argv[0]), *argv[1:]], env=env or child_env(), stdout=out, stderr=err,
                stdin=subprocess.DEVNULL,
            )

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> httpx.Response:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited {self.proc.returncode} before ready:\n{self.stdout}\n{self.stderr}")
            try:
                r = httpx.get(f"{self.base}/readyz", timeout=2)
                if r.status_code == 200:
                    return r
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        pytest.fail(f"server not ready within {timeout}s:\n{self.stdout}\n{self.stderr}")

    def terminate(self, timeout: float = 15) -> int:
        """SIGTERM and wait; a graceful exit must come within `timeout` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            pytest.fail(f"no exit within {timeout}s of SIGTERM:\n{self.stderr[-2000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def get(self, path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(self.base + path, headers=headers, timeout=10)

    def post(self, path: str, body: dict, token: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex}
        return httpx.post(self.base + path, json=body, headers=headers, timeout=10)


@pytest.fixture
def spawn(tmp_path):
    """Start servers; all still running at teardown are killed."""
    started: list[Server] = []
    logdir = tmp_path / "logs"
    logdir.mkdir(exist_ok=True)

    def start(*argv: str, env: dict[str, str] | None = None, port: int | None = None) -> Server:
        port = port or free_port()
        server = Server([*argv, "--port", str(port)], env, port, logdir)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def private_dir(tmp_path) -> Path:
    """A mode-0700 directory, as credentials files require."""
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    os.chmod(d, 0o700)
    return d


def _mariadb_admin(sql: str) -> None:
    from tests.conftest import _mysql_admin

    _mysql_admin(sql)


@pytest.fixture(params=["sqlite", "mariadb"])
def empty_db_url(request, tmp_path):
    """A brand-new database with no schema at all, dropped afterwards."""
    if request.param == "sqlite":
        path = tmp_path / "empty.db"
        yield f"sqlite:///{path}"  # sqlite:////abs/path.db
        return
    from tests.conftest import MYSQL_BASE, REQUIRE_MARIADB

    name = f"orbit_e2e_{uuid.uuid4().hex[:12]}"
    try:
        _mariadb_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    except Exception as exc:  # noqa: BLE001 - any failure to connect means no MariaDB here
        if REQUIRE_MARIADB:
            pytest.fail(f"MariaDB is required but unreachable: {exc}")
        pytest.skip(f"MariaDB unreachable: {exc}")
    try:
        yield f"{MYSQL_BASE}/{name}"
    finally:
        with contextlib.suppress(Exception):
            _mariadb_admin(f"DROP DATABASE IF EXISTS `{name}`")


def pending(url: str) -> list[str]:
    from orbit.server.store import migrate

    return [rev for rev, _ in asyncio.run(migrate.pending_migrations(url))]


def run_db(url: str, body):
    """Run `body(tx)` in one transaction against `url`, in this process."""
    from orbit.server.store.db import Database

    async def go():
        db = Database(url, pool_size=1)
        try:
            return await db.transaction(body)
        finally:
            await db.close()

    return asyncio.run(go())
