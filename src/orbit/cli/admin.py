"""`orbit-admin`: migrations, bootstrap and credentials, straight against the database."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from datetime import datetime
from pathlib import Path

import click
from asyncmy.errors import MySQLError
from sqlalchemy.exc import SQLAlchemyError

from .. import __version__
from ..server.core.ids import is_id
from ..server.core.permissions import ALL_PERMISSIONS, ALL_QUEUES, BOOTSTRAP_PERMISSIONS
from ..server.core.timefmt import format_ts
from ..server.errors import DatabaseUnavailable
from ..server.services import tenancy
from ..server.store import migrate as migrations
from ..server.store.db import Database
from .files import FileRefused, check_writable_target, write_secret_json


def _db_option(f):
    return click.option(
        "--database-url",
        "database_url",
        default=None,
        help="SQLAlchemy-style URL (mysql://… or sqlite:///…); default $ORBIT_DATABASE_URL",
    )(f)


def _resolve_url(ctx: click.Context, local: str | None) -> str:
    url = local or (ctx.find_root().obj or {}).get("database_url") or os.environ.get("ORBIT_DATABASE_URL")
    if not url:
        raise click.UsageError("no database: pass --database-url or set ORBIT_DATABASE_URL")
    return url


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"orbit-admin: {message}", err=True)
    sys.exit(code)


def _run(coro):
    """Run one database coroutine; a bad URL or an unreachable database is a one-line message.

    Exit 2, not a traceback's exit 1, so that `migrate --check` exits 1 only for pending migrations.
    """
    try:
        return asyncio.run(coro)
    except migrations.UnknownSchemaRevision as exc:
        _fail(str(exc), 2)
    except (DatabaseUnavailable, SQLAlchemyError, MySQLError, sqlite3.Error, OSError, ValueError) as exc:
        cause = exc.__cause__ if isinstance(exc, DatabaseUnavailable) and exc.__cause__ else exc
        first_line = (str(cause).splitlines() or [""])[0]
        _fail(f"database error: {type(cause).__name__}: {first_line}", 2)


async def _require_current_schema(url: str) -> None:
    pending = await migrations.pending_migrations(url)
    if pending:
        _fail(f"{len(pending)} migration(s) pending; run `orbit-admin migrate` first", 2)


@click.group()
@click.version_option(__version__, prog_name="orbit-admin")
@_db_option
@click.pass_context
def cli(ctx: click.Context, database_url: str | None) -> None:
    """Administer an Orbit database."""
    ctx.obj = {"database_url": database_url}


@cli.command()
@_db_option
@click.option("--check", is_flag=True, help="exit 1 if migrations are pending")
@click.option("--status", is_flag=True, help="list applied state and pending migrations")
@click.pass_context
def migrate(ctx: click.Context, database_url: str | None, check: bool, status: bool) -> None:
    """Apply pending migrations."""
    url = _resolve_url(ctx, database_url)

    async def run() -> int:
        pending = await migrations.pending_migrations(url)
        if status or check:
            current = await migrations.current_revision(url)
            if status:
                click.echo(f"current: {current or '(empty database)'}")
                click.echo(f"head:    {migrations.head_revision()}")
                for rev, doc in pending:
                    click.echo(f"pending: {rev}  {doc}")
                if not pending:
                    click.echo("up to date")
            return 1 if (check and pending) else 0
        applied = await migrations.upgrade(url)
        for rev, doc in applied:
            click.echo(f"applied: {rev}  {doc}")
        if not applied:
            click.echo("up to date")
        return 0

    sys.exit(_run(run()))


@cli.command()
@_db_option
@click.option("--application", required=True, help="application name")
@click.option("--namespace", required=True, help="namespace name")
@click.option("--environment", required=True, type=click.Choice(tenancy.ENVIRONMENTS))
@click.option("--queue", required=True, help="queue name to ensure")
@click.option("--worker-access", is_flag=True, help="also grant the worker permission")
@click.option("--permission", "extra", multiple=True, type=click.Choice(ALL_PERMISSIONS), help="extra permission")
@click.option("--output", required=True, type=click.Path(path_type=Path), help="credentials file to write (0600)")
@click.option("--force", is_flag=True, help="overwrite an existing output file")
@click.pass_context
def bootstrap(ctx, database_url, application, namespace, environment, queue, worker_access, extra, output, force):
    """Ensure application/namespace/queue exist and issue a new all-queues credential."""
    url = _resolve_url(ctx, database_url)
    try:
        check_writable_target(output, force=force)
    except FileRefused as exc:
        _fail(str(exc))
    perms = list(BOOTSTRAP_PERMISSIONS) + (["worker"] if worker_access else []) + list(extra)
    issued = _run(_bootstrap(url, application, namespace, environment, queue, perms))
    try:
        write_secret_json(output, issued.as_file(), force=force)
    except FileRefused as exc:
        _fail(f"{exc} (credential {issued.credential_id} was issued; revoke it)")
    click.echo(f"credential {issued.credential_id} written to {output}")


async def _bootstrap(url, application, namespace, environment, queue, perms) -> tenancy.IssuedCredential:
    await _require_current_schema(url)
    db = Database(url, pool_size=1)
    try:
        async def body(tx):
            app = await tenancy.ensure_application(tx, application)
            ns = await tenancy.ensure_namespace(tx, app["id"], namespace, environment)
            q = await tenancy.ensure_queue(tx, ns["id"], queue)
            return await tenancy.issue_credential(
                tx, application=app, namespace=ns, permissions=perms, queue_scope=ALL_QUEUES, queue_id=q["id"]
            )

        try:
            return await db.transaction(body)
        except tenancy.AdminError as exc:
            _fail(str(exc))
            raise
    finally:
        await db.close()


@cli.group()
def credentials() -> None:
    """Issue, list and revoke credentials."""


@credentials.command("create")
@_db_option
@click.option("--application", required=True, help="application name or id")
@click.option("--namespace", required=True, help="namespace name or id")
@click.option("--permission", "permissions", multiple=True, required=True, type=click.Choice(ALL_PERMISSIONS))
@click.option("--queue-scope", "queue_scope", multiple=True, help="queue id (repeatable); omitted: all queues")
@click.option("--label", default=None, help="free text shown by list")
@click.option("--output", required=True, type=click.Path(path_type=Path))
@click.option("--force", is_flag=True)
@click.pass_context
def credentials_create(ctx, database_url, application, namespace, permissions, queue_scope, label, output, force):
    """Issue a credential with exact permissions and scope."""
    url = _resolve_url(ctx, database_url)
    for q in queue_scope:
        if not is_id(q):
            _fail(f"--queue-scope {q!r} is not a queue id (32 lowercase hex characters)")
    try:
        check_writable_target(output, force=force)
    except FileRefused as exc:
        _fail(str(exc))
    scope = sorted(set(queue_scope)) if queue_scope else ALL_QUEUES

    async def run():
        await _require_current_schema(url)
        db = Database(url, pool_size=1)
        try:
            async def body(tx):
                app = await tenancy.find_application(tx, application)
                ns = await tenancy.find_namespace(tx, app["id"], namespace)
                if isinstance(scope, list):
                    await tenancy.check_queues_exist(tx, ns["id"], scope)
                return await tenancy.issue_credential(
                    tx, application=app, namespace=ns, permissions=list(permissions), queue_scope=scope,
                    queue_id=scope[0] if isinstance(scope, list) and len(scope) == 1 else None, label=label,
                )

            return await db.transaction(body)
        except tenancy.AdminError as exc:
            _fail(str(exc))
        finally:
            await db.close()

    issued = _run(run())
    try:
        write_secret_json(output, issued.as_file(), force=force)
    except FileRefused as exc:
        _fail(f"{exc} (credential {issued.credential_id} was issued; revoke it)")
    click.echo(f"credential {issued.credential_id} written to {output}")


@credentials.command("list")
@_db_option
@click.option("--application", default=None, help="application name or id")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per line")
@click.pass_context
def credentials_list(ctx, database_url, application, as_json):
    """List credentials (never their secrets)."""
    import orjson

    url = _resolve_url(ctx, database_url)

    async def run():
        db = Database(url, pool_size=1)
        try:
            async def body(tx):
                app_id = (await tenancy.find_application(tx, application))["id"] if application else None
                return await tenancy.list_credentials(tx, app_id)

            return await db.read(body)
        except tenancy.AdminError as exc:
            _fail(str(exc))
        finally:
            await db.close()

    rows = _run(run())
    for r in rows:
        status = "revoked" if r["revoked_at"] else "active"
        if as_json:
            out = {k: (format_ts(v) if isinstance(v, datetime) else v) for k, v in r.items()}
            out["status"] = status
            click.echo(orjson.dumps(out).decode())
        else:
            scope = r["queue_scope"] if r["queue_scope"] == ALL_QUEUES else ",".join(r["queue_scope"])
            click.echo(
                f"{r['id']}  {status:7}  app={r['application_id']}  ns={r['namespace_id']}  "
                f"scope={scope}  perms={','.join(r['permissions'])}" + (f"  label={r['label']}" if r["label"] else "")
            )


@credentials.command("revoke")
@_db_option
@click.argument("credential_id")
@click.option("--reason", required=True)
@click.pass_context
def credentials_revoke(ctx, database_url, credential_id, reason):
    """Revoke a credential; it stops working on the next request."""
    url = _resolve_url(ctx, database_url)

    async def run():
        db = Database(url, pool_size=1)
        try:
            return await db.transaction(lambda tx: tenancy.revoke_credential(tx, credential_id, reason))
        except tenancy.AdminError as exc:
            _fail(str(exc))
        finally:
            await db.close()

    changed = _run(run())
    click.echo(f"credential {credential_id} {'revoked' if changed else 'was already revoked'}")


def main() -> None:
    cli(prog_name="orbit-admin")
