"""Reusable multi-process harness: real `orbit server` nodes and worker processes.

Everything here is bounded in time and leaves no process behind:

* every child runs in its own session (so signals sent to the test runner do not
  reach it, and it can be killed as a group) and, when started from the main
  thread, with ``PR_SET_PDEATHSIG = SIGKILL`` so that it dies even if the test
  runner itself is killed;
* `Cluster.close()` (called by the fixtures in ``conftest.py`` even when a test
  fails) SIGKILLs whatever is still running;
* each child's stdout and stderr go to a log file that failing assertions print.

Typical use (see ``conftest.py`` for the fixtures)::

    cluster = Cluster(database_url, workdir)
    a, b = cluster.start_nodes(2)            # waits for GET /readyz == 200
    creds = bootstrap_credentials(database_url, workdir / "creds", application="app-x")
    ...
    assert b.terminate() == 0                # SIGTERM, clean exit within 15 s
    a.kill()                                 # SIGKILL
    a.start(); a.wait_ready()                # restart on the same port
    cluster.close()

Workers (later issues) are started with `Cluster.start_process(argv, name=...)`,
which gives the same lifetime guarantees.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MYSQL_BASE = os.environ.get("ORBIT_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306").rstrip("/")
READY_TIMEOUT = float(os.environ.get("ORBIT_CLUSTER_READY_TIMEOUT", "30"))
STOP_TIMEOUT = 15.0
NODE_LOG_LEVEL = os.environ.get("ORBIT_CLUSTER_LOG_LEVEL", "warning")

# Entry points run through this interpreter, so the console scripts' shims
# (pyenv, virtualenv wrappers) never stand between us and the real process.
ORBIT_CMD = [sys.executable, "-c", "from orbit.cli.orbit import main; main()"]
ORBIT_ADMIN_CMD = [sys.executable, "-c", "from orbit.cli.admin import main; main()"]


# --------------------------------------------------------------------------- ports


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- processes


def _child_setup() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the test runner
    except Exception:
        pass


class ProcessFailed(AssertionError):
    pass


@dataclass
class ManagedProcess:
    """A child process with a log file, started in its own session, always killable."""

    argv: list[str]
    name: str
    log_dir: Path
    env: dict[str, str] | None = None
    cwd: str | None = None
    proc: subprocess.Popen | None = None
    starts: int = 0
    history: list[tuple[str, int | None]] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> ManagedProcess:
        if self.alive:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(self.env or {})}
        log = open(self.log_path, "ab")
        log.write(f"\n===== start #{self.starts}: {' '.join(self._redacted_argv())}\n".encode())
        log.flush()
        in_main = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                # PDEATHSIG fires when the *thread* that forked exits: only safe from the main thread.
                preexec_fn=_child_setup if in_main else None,
            )
        finally:
            log.close()
        return self

    def _redacted_argv(self) -> list[str]:
        return [re.sub(r"orb_[A-Za-z0-9_\-]+", "orb_***", a) for a in self.argv]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def output(self, tail: int | None = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-tail:] if tail else lines)

    def describe(self) -> str:
        return (
            f"--- {self.name} (pid {self.pid}, rc {self.returncode}) log tail ---\n{self.output()}"
        )

    def send_signal(self, sig: int) -> None:
        if self.alive:
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self, timeout: float = STOP_TIMEOUT, sig: int = signal.SIGTERM) -> int:
        """Send SIGTERM (or ``sig``) and wait up to ``timeout`` s; SIGKILL and fail if it hangs."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ProcessFailed(
                f"{self.name} did not exit within {timeout}s of {signal.Signals(sig).name}\n{self.describe()}"
            ) from None
        self.history.append((signal.Signals(sig).name, rc))
        return rc

    def kill(self) -> None:
        """SIGKILL the process (and its process group) and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for target in (
            lambda: os.killpg(self.proc.pid, signal.SIGKILL),
            lambda: os.kill(self.proc.pid, signal.SIGKILL),
        ):
            try:
                target()
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            pass
        self.history.append(("SIGKILL", self.proc.returncode))

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit on its own; SIGKILL and fail after ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ProcessFailed(
                f"{self.name} still running after {timeout}s\n{self.describe()}"
            ) from None


@dataclass
class ServerNode(ManagedProcess):
    """One `orbit server` node on its own port; survives restarts on the same port."""

    database_url: str = ""
    node_id: str = ""
    port: int = 0
    host: str = "127.0.0.1"

    @classmethod
    def create(
        cls,
        database_url: str,
        node_id: str,
        log_dir: Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> ServerNode:
        port = port or free_port(host)
        argv = [
            *ORBIT_CMD,
            "server",
            "--database-url",
            database_url,
            "--host",
            host,
            "--port",
            str(port),
            "--node-id",
            node_id,
            "--log-level",
            NODE_LOG_LEVEL,
            *extra_args,
        ]
        return cls(
            argv=argv,
            name=node_id,
            log_dir=log_dir,
            env=env,
            database_url=database_url,
            node_id=node_id,
            port=port,
            host=host,
        )

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _check_ready(self, client: httpx.Client) -> bool:
        try:
            r = client.get(f"{self.base_url}/readyz")
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> ServerNode:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if not self.alive:
                    raise ProcessFailed(
                        f"{self.name} exited before becoming ready\n{self.describe()}"
                    )
                if self._check_ready(client):
                    return self
                time.sleep(0.1)
        self.kill()
        raise ProcessFailed(f"{self.name} not ready within {timeout}s\n{self.describe()}")

    async def wait_ready_async(self, timeout: float = READY_TIMEOUT) -> ServerNode:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if not self.alive:
                    raise ProcessFailed(
                        f"{self.name} exited before becoming ready\n{self.describe()}"
                    )
                try:
                    r = await client.get(f"{self.base_url}/readyz")
                    if r.status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        self.kill()
        raise ProcessFailed(f"{self.name} not ready within {timeout}s\n{self.describe()}")

    def restart(self, timeout: float = READY_TIMEOUT) -> ServerNode:
        """Start again on the same port (after `kill` or `terminate`) and wait until ready."""
        return self.start().wait_ready(timeout)


class Cluster:
    """Owns every process it starts; `close()` kills all of them."""

    def __init__(self, database_url: str, workdir: Path) -> None:
        self.database_url = database_url
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes: list[ServerNode] = []
        self.processes: list[ManagedProcess] = []

    def add_node(
        self, node_id: str | None = None, *, start: bool = True, wait: bool = True, **kwargs: Any
    ) -> ServerNode:
        node = ServerNode.create(
            self.database_url,
            node_id or f"node-{len(self.nodes) + 1}",
            self.workdir / "logs",
            **kwargs,
        )
        self.nodes.append(node)
        self.processes.append(node)
        if start:
            node.start()
            if wait:
                node.wait_ready()
        return node

    def start_nodes(self, k: int, **kwargs: Any) -> list[ServerNode]:
        """Start ``k`` nodes in parallel and wait until each answers /readyz with 200."""
        new = [self.add_node(start=False, **kwargs) for _ in range(k)]
        for n in new:
            n.start()
        for n in new:
            n.wait_ready()
        return new

    def start_process(
        self,
        argv: Sequence[str],
        *,
        name: str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ManagedProcess:
        """Start an arbitrary child (a worker, a load generator) under the same guarantees."""
        p = ManagedProcess(list(argv), name, self.workdir / "logs", env=env, cwd=cwd)
        self.processes.append(p)
        return p.start()

    @property
    def urls(self) -> list[str]:
        return [n.base_url for n in self.nodes]

    def describe(self) -> str:
        return "\n".join(p.describe() for p in self.processes)

    def close(self) -> None:
        for p in self.processes:
            p.kill()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --------------------------------------------------------------------------- databases and credentials


def private_dir(parent: Path | None = None, prefix: str = "orbit-creds-") -> Path:
    """A fresh directory with mode 0700 (orbit-admin refuses group/world-writable ones)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir=str(parent) if parent else None))
    os.chmod(d, stat.S_IRWXU)
    return d


def run_admin(database_url: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*ORBIT_ADMIN_CMD, *args, "--database-url", database_url],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def bootstrap_credentials(
    database_url: str,
    out_dir: Path,
    *,
    application: str | None = None,
    namespace: str = "default",
    environment: str = "development",
    queue: str = "q",
    worker_access: bool = True,
    permissions: Sequence[str] = (),
) -> dict[str, Any]:
    """Run `orbit-admin bootstrap` and return the credentials file's JSON (it holds `token`)."""
    application = application or f"cluster-{uuid.uuid4().hex[:10]}"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(out_dir, stat.S_IRWXU)
    output = out_dir / f"{application}-{uuid.uuid4().hex[:6]}.json"
    args = [
        "bootstrap",
        "--application",
        application,
        "--namespace",
        namespace,
        "--environment",
        environment,
        "--queue",
        queue,
        "--output",
        str(output),
    ]
    if worker_access:
        args.append("--worker-access")
    for p in permissions:
        args += ["--permission", p]
    r = run_admin(database_url, *args)
    assert r.returncode == 0, (
        f"orbit-admin bootstrap failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    )
    assert stat.S_IMODE(output.stat().st_mode) == 0o600, oct(output.stat().st_mode)
    creds = json.loads(output.read_text())
    assert creds["token"].startswith("orb_")
    creds["application"] = application
    creds["file"] = str(output)
    return creds


def _server_parts() -> tuple[str, int, str, str]:
    from sqlalchemy.engine import make_url

    u = make_url(MYSQL_BASE.replace("mysql://", "mysql+asyncmy://", 1))
    return u.host or "127.0.0.1", u.port or 3306, u.username or "root", u.password or ""


async def _mysql_admin(sql: str) -> None:
    import asyncmy

    host, port, user, password = _server_parts()
    conn = await asyncmy.connect(host=host, port=port, user=user, password=password)
    try:
        async with conn.cursor() as cur:
            await cur.execute(sql)
    finally:
        conn.close()


def create_database(*, migrate: bool = True, prefix: str = "orbit_cluster") -> str:
    """A brand-new MariaDB database (migrated unless ``migrate=False``); returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    asyncio.run(_mysql_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    url = f"{MYSQL_BASE}/{name}"
    if migrate:
        from orbit.server.store import migrate as migrations

        asyncio.run(migrations.upgrade(url))
    return url


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1].split("?", 1)[0]
    assert re.fullmatch(r"[A-Za-z0-9_]+", name), name
    asyncio.run(_mysql_admin(f"DROP DATABASE IF EXISTS `{name}`"))


async def fetch_all(database_url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Read straight from the database (bypassing every node)."""
    from sqlalchemy import text

    from orbit.server.store.db import null_pool_engine

    engine = null_pool_engine(database_url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(text(sql), params)
            return [dict(r) for r in result.mappings().all()]
    finally:
        await engine.dispose()


async def stored_events(database_url: str, *, namespace_id: str | None = None,
                        resource_id: str | None = None) -> list[dict[str, Any]]:
    """The stored events of a namespace or about a resource, in the order written: each batch
    row holds its events as a JSON array of [type, time, resource_type, resource_id, data]."""
    if namespace_id is not None:
        where, value = "namespace_id = :v", namespace_id
    else:
        where, value = "events LIKE :v", f'%"{resource_id}"%'
    rows = await fetch_all(database_url, f"SELECT namespace_id, events FROM event_batches WHERE {where} "
                           "ORDER BY batch_id", v=value)
    return [{"namespace_id": r["namespace_id"], "type": ev[0], "time": ev[1], "resource_type": ev[2],
             "resource_id": ev[3], "data": ev[4]} for r in rows for ev in json.loads(r["events"])
            if resource_id is None or ev[3] == resource_id]


async def execute(database_url: str, sql: str, **params: Any) -> int:
    """Run one statement in its own committed transaction (fault injection, fixtures); returns rowcount."""
    from sqlalchemy import text

    from orbit.server.store.db import null_pool_engine

    engine = null_pool_engine(database_url)
    try:
        async with engine.begin() as conn:
            return (await conn.execute(text(sql), params)).rowcount
    finally:
        await engine.dispose()


def query(database_url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Synchronous `fetch_all` (not from inside a running event loop)."""
    return asyncio.run(fetch_all(database_url, sql, **params))


# --------------------------------------------------------------------------- HTTP calls


@dataclass
class Answer:
    """One HTTP attempt: either a response or the transport error that replaced it."""

    node: str
    status: int | None = None
    content: bytes = b""
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.status is not None

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.content) if self.content else {}

    @property
    def code(self) -> str | None:
        return (self.body.get("error") or {}).get("code") if self.answered else None

    @property
    def data(self) -> dict[str, Any] | None:
        return self.body.get("data") if self.answered else None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def raw_field(self, name: str) -> bytes:
        """The exact bytes of a flat JSON object member, e.g. ``"queue"`` in a queue result."""
        m = re.search(rb'"' + name.encode() + rb'":(\{[^{}]*\})', self.content)
        assert m, f"no flat object {name!r} in {self.content!r}"
        return m.group(1)

    def __repr__(self) -> str:
        if self.answered:
            return f"<{self.node} {self.status} {self.content[:300]!r}>"
        return f"<{self.node} transport error {self.error}>"


def _target(node: Any) -> tuple[str, str]:
    if isinstance(node, str):
        return node, node
    return node.base_url, node.name


def auth_headers(token: str, key: str | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {token}"}
    if key is not None:
        h["Idempotency-Key"] = key
        h["Content-Type"] = "application/json"
    return h


async def post(
    client: httpx.AsyncClient,
    node: Any,
    path: str,
    body: Any,
    *,
    token: str,
    key: str,
    timeout: float = 20.0,
) -> Answer:
    """POST JSON to a node (a `ServerNode`, a `FaultProxy` or a base URL); never raises on transport errors."""
    base, name = _target(node)
    try:
        r = await client.post(
            base + path,
            content=json.dumps(body).encode(),
            headers=auth_headers(token, key),
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        return Answer(name, error=f"{type(exc).__name__}: {exc}")
    return Answer(name, r.status_code, r.content)


async def get(
    client: httpx.AsyncClient, node: Any, path: str, *, token: str, timeout: float = 10.0
) -> Answer:
    base, name = _target(node)
    try:
        r = await client.get(base + path, headers=auth_headers(token), timeout=timeout)
    except httpx.HTTPError as exc:
        return Answer(name, error=f"{type(exc).__name__}: {exc}")
    return Answer(name, r.status_code, r.content)


async def warm_up(
    client: httpx.AsyncClient, nodes: Sequence[ServerNode], connections: int = 20
) -> None:
    """Open pooled keep-alive connections to every node so a burst starts all at once."""
    await asyncio.gather(
        *(client.get(n.base_url + "/healthz") for n in nodes for _ in range(connections))
    )


def async_client(max_connections: int = 200) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(20.0, connect=3.0))


# --------------------------------------------------------------------------- network faults


class FaultProxy:
    """A TCP proxy in front of a node, run on the test's event loop.

    ``mode="forward"`` relays both ways. ``mode="drop_answers"`` relays the request
    but, as soon as the node starts answering, closes the client's connection
    without passing a byte on: the node did the work (committed) and the client
    never learns the outcome, exactly as if the node had died between its commit
    and its answer. ``dropped`` counts the answers thrown away.
    """

    def __init__(self, target: ServerNode, mode: str = "forward") -> None:
        assert mode in ("forward", "drop_answers")
        self.target = target
        self.mode = mode
        self.dropped = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return f"proxy->{self.target.name}"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            try:
                up_r, up_w = await asyncio.open_connection(self.target.host, self.target.port)
            except OSError:
                client_w.close()
                return
            upstream = asyncio.create_task(self._pump(client_r, up_w))
            try:
                if self.mode == "forward":
                    await self._pump(up_r, client_w)
                else:
                    first = await up_r.read(1)
                    if first:
                        self.dropped += 1
                    client_w.transport.abort()  # RST: the client sees the connection die
            finally:
                upstream.cancel()
                up_w.close()
                client_w.close()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        if self._server is not None:
            await self._server.wait_closed()
