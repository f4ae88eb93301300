"""`orbit`: run a server node (`orbit server`) or the embedded dev mode (`orbit dev`)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import click

from .. import __version__
from .logs import configure_logging


def _fail(message: str, code: int = 2) -> None:
    click.echo(f"orbit: {message}", err=True)
    sys.exit(code)


def _private_data_dir(path: Path) -> Path:
    """The data directory holds the database and an all-permissions credential. A new one is
    made 0700; an existing one that others may write to is refused, never chmod-ed: it may be a
    directory others share (a temporary directory), which a chmod would lock them out of."""
    try:
        path.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        if not path.is_dir():
            _fail(f"--data-dir {path} exists and is not a directory")
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            _fail(f"refusing to use {path} as the data directory: it is group- or world-writable "
                  f"(mode {mode:04o}); give a directory only you can write to (chmod go-w), or a new path")
    else:
        os.chmod(path, 0o700)
    return path.resolve()


def _lock_sqlite(url: str):
    """One node per SQLite file: hold an exclusive lock next to the database."""
    from ..server.store.dialect import sqlite_path

    path = sqlite_path(url)
    if path is None:
        return None
    fh = open(path + ".node.lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _fail(f"another Orbit node is already serving {path}; SQLite supports a single node")
    return fh


def _serve(settings, host: str, port: int, banner: list[str] | None = None, drain_seconds: float = 10.0) -> None:
    import uvicorn

    try:
        settings.check()
    except ValueError as exc:
        _fail(str(exc))

    from ..server.app import create_app
    from ..server.ws.corked import websocket_protocol

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM/SIGINT once its graceful shutdown is over, so the
        process would end *by the signal* (exit status -15/-2, i.e. 143/130). A node that
        drained cleanly exits 0 instead: forget the captured signals before uvicorn
        restores the default handlers and re-raises them."""

        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                try:
                    yield
                finally:
                    captured = getattr(self, "_captured_signals", None)
                    if isinstance(captured, list):
                        captured.clear()

        def handle_exit(self, sig, frame) -> None:
            """First signal: drain worker sessions (push `drain`, grant no claims, keep
            serving renew/complete) until they hold no lease or the drain deadline
            passes; then uvicorn's own graceful shutdown. A second signal forces it.
            From the first signal on, HTTP requests hear 503 (http/draining.py)."""
            app.state.node.draining = True
            hub = app.state.node.hub
            if not self.drain_started and not self.should_exit and hub.sessions and loop is not None:
                self.drain_started = True
                loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.drain()))
                return
            super().handle_exit(sig, frame)

        async def drain(self) -> None:
            app.state.node.draining = True
            await app.state.node.hub.begin_drain(int(drain_seconds * 1000))
            deadline = time.monotonic() + drain_seconds
            while time.monotonic() < deadline and not self.should_exit:
                try:
                    if not app.state.node.hub.sessions or await app.state.node.hub.leases_held() == 0:
                        break
                except Exception:
                    break
                await asyncio.sleep(0.2)
            self.should_exit = True

    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_config=None,
        lifespan="on",
        timeout_graceful_shutdown=10,
        ws=websocket_protocol(),  # worker frames written once per loop iteration
        ws_ping_interval=None,
        # Worker frames are small and travel inside the data centre: compressing each one
        # cost more CPU than it saved bytes (both ends run zlib per frame).
        ws_per_message_deflate=False,
    )
    server = Server(config)
    server.drain_started = False
    loop = None

    async def run() -> None:
        nonlocal loop
        loop = asyncio.get_running_loop()
        if banner:
            for line in banner:
                click.echo(line)
        await server.serve()

    _run_event_loop(run())
    if not server.started:
        sys.exit(1)


def _tune_gc() -> None:
    """A node allocates many short-lived containers per frame and per row, almost none of them
    cyclic garbage: start-up objects leave the cyclic collector's sight and young collections
    run far less often than the default threshold (700) would make them."""
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _run_event_loop(main: Any) -> None:
    """uvloop when installed (uvicorn[standard] brings it): its transports cost a fraction of
    asyncio's per frame and per database round trip."""
    _tune_gc()
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


@click.group()
@click.version_option(__version__, prog_name="orbit")
def cli() -> None:
    """The Orbit task execution service."""


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--database-url", default=None, help="mysql://… or sqlite:///…; default $ORBIT_DATABASE_URL")
@click.option("--node-id", default=None, help="this node's identity in leases and logs")
@click.option("--log-level", default="info", show_default=True)
@click.option("--database-wait", default=120.0, show_default=True, type=click.FloatRange(0, 86400),
              help="seconds to wait at start-up for a database that does not answer")
def server(host: str, port: int, database_url: str | None, node_id: str | None, log_level: str,
           database_wait: float) -> None:
    """Run a production node against a migrated database."""
    from ..server.config import Settings
    from ..server.core.ids import NODE_ID_RULE, is_node_id

    configure_logging(log_level)
    if node_id is not None and not is_node_id(node_id):
        _fail(f"--node-id must be {NODE_ID_RULE}")
    url = database_url or os.environ.get("ORBIT_DATABASE_URL")
    if not url:
        _fail("no database: pass --database-url or set ORBIT_DATABASE_URL")
    pending = _schema_check(url, database_wait)
    if pending:
        _fail(
            f"the database schema is not current: {len(pending)} migration(s) pending "
            f"({', '.join(r for r, _ in pending)}); run `orbit-admin migrate` first"
        )
    lock = _lock_sqlite(url)
    settings = Settings(database_url=url)
    if node_id:
        settings.node_id = node_id
    _serve(settings, host, port, [f"orbit server node {settings.node_id} listening on http://{host}:{port}"])
    del lock


def _schema_check(url: str, wait: float) -> list[tuple[str, str]]:
    """The migrations still pending. A database that does not answer yet (restarting with the
    node, or after it) is waited for, so that a node started during an outage comes up by
    itself instead of exiting; a bad URL, refused credentials or a refused statement fail at once."""
    from ..server.store import migrate
    from ..server.store.dialect import ACCESS_DENIED, is_unavailable, mysql_error_code

    deadline = time.monotonic() + wait
    delay = 0.25
    told = False
    while True:
        try:
            return asyncio.run(migrate.pending_migrations(url))
        except Exception as exc:
            reason = f"{type(exc).__name__}: {_without_password(str(exc), url)}"
            if (not is_unavailable(exc) or mysql_error_code(exc) in ACCESS_DENIED
                    or time.monotonic() + delay > deadline):
                _fail(f"cannot read the schema version: {reason}")
            if not told:
                click.echo(f"orbit: the database does not answer; waiting up to {wait:.0f}s ({reason})", err=True)
                told = True
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--data-dir", default=".local/orbit", show_default=True, type=click.Path(path_type=Path))
@click.option("--log-level", default="warning", show_default=True)
def dev(host: str, port: int, data_dir: Path, log_level: str) -> None:
    """Embedded single-node mode on SQLite, with a ready development credential."""
    from ..server.config import Settings
    from ..server.core.permissions import ALL_PERMISSIONS, ALL_QUEUES
    from ..server.services import tenancy
    from ..server.store import migrate
    from ..server.store.db import Database
    from .files import write_secret_json

    configure_logging(log_level)
    data_dir = _private_data_dir(data_dir)
    url = f"sqlite:///{data_dir / 'orbit.db'}"
    lock = _lock_sqlite(url)
    asyncio.run(migrate.upgrade(url))
    cred_path = data_dir / "credentials.json"
    if not cred_path.exists():

        async def first_start():
            db = Database(url, pool_size=1)
            try:
                async def body(tx):
                    app = await tenancy.ensure_application(tx, "dev")
                    ns = await tenancy.ensure_namespace(tx, app["id"], "default", "development")
                    q = await tenancy.ensure_queue(tx, ns["id"], "default")
                    return await tenancy.issue_credential(
                        tx, application=app, namespace=ns, permissions=list(ALL_PERMISSIONS),
                        queue_scope=ALL_QUEUES, queue_id=q["id"], label="orbit dev",
                    )

                return await db.transaction(body)
            finally:
                await db.close()

        issued = asyncio.run(first_start())
        write_secret_json(cred_path, issued.as_file(), force=False)
    settings = Settings(database_url=url, node_id="dev", dev_mode=True)
    base = f"http://{host}:{port}"
    _serve(
        settings,
        host,
        port,
        [
            f"Orbit dev server: {base}",
            f"dashboard:        {base}/ui/  (sign in with the \"token\" of the credentials file)",
            f"credentials:      {cred_path}",
            f"data:             {data_dir / 'orbit.db'}",
            f"try: export ORBIT_URL={base} ORBIT_TOKEN=$(python -c \"import json;print(json.load(open('{cred_path}'))['token'])\")",
        ],
    )
    del lock


def _without_password(text: str, url: str) -> str:
    """A driver's message can quote the URL it was given; its password never reaches the terminal."""
    from sqlalchemy.engine import make_url

    try:
        password = make_url(url.replace("mysql://", "mysql+asyncmy://", 1)).password
    except Exception:  # not a URL at all: nothing to hide in it, but say nothing of it either
        return text.replace(url, "<the database URL>")
    return text.replace(password, "***") if password else text


def main() -> None:
    cli(prog_name="orbit")
