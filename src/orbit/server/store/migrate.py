"""Programmatic Alembic: apply, check and list migrations."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from .db import null_pool_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    return ScriptDirectory.from_config(_config()).get_current_head()


class UnknownSchemaRevision(Exception):
    """The database was migrated by a newer Orbit than this one."""


def _known(script: ScriptDirectory, revision: str) -> bool:
    try:
        return script.get_revision(revision) is not None
    except Exception:
        return False


def _pending_sync(conn) -> list[tuple[str, str]]:
    script = ScriptDirectory.from_config(_config())
    current = MigrationContext.configure(conn).get_current_revision()
    if current is not None and not _known(script, current):
        raise UnknownSchemaRevision(
            f"the database is at schema revision {current}, which this Orbit version does not know "
            f"(its latest is {script.get_current_head()}); run a newer Orbit"
        )
    pending = []
    for rev in script.walk_revisions(base="base", head="heads"):
        if current is not None and (rev.revision == current or _is_ancestor(script, rev.revision, current)):
            continue
        pending.append((rev.revision, rev.doc.splitlines()[0] if rev.doc else ""))
    pending.reverse()
    return pending


def _is_ancestor(script: ScriptDirectory, candidate: str, of: str) -> bool:
    return any(r.revision == candidate for r in script.iterate_revisions(of, "base"))


async def pending_migrations(url: str) -> list[tuple[str, str]]:
    engine = null_pool_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(_pending_sync)
    finally:
        await engine.dispose()


async def current_revision(url: str) -> str | None:
    engine = null_pool_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())
    finally:
        await engine.dispose()



def _not_primary_key_name_note(record: logging.LogRecord) -> bool:
    return "ignored for PRIMARY key" not in record.getMessage()

async def upgrade(url: str) -> list[tuple[str, str]]:
    """Apply pending migrations; return what was applied."""
    applied = await pending_migrations(url)
    if not applied:
        return []
    engine = null_pool_engine(url)

    def _run(conn) -> None:
        # MariaDB notes that it ignores the name of alembic's primary key; that is not news
        # (a Python warning from some drivers, a log record from asyncmy).
        warnings.filterwarnings("ignore", message=".*ignored for PRIMARY key")
        logging.getLogger("asyncmy").addFilter(_not_primary_key_name_note)
        cfg = _config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")

    try:
        async with engine.begin() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()
    return applied


async def current_revision_on(db) -> str | None:
    """The schema revision, read through an already open `Database`."""
    async with db.read_engine.connect() as conn:
        return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())
