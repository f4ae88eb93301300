"""Helpers for the tests of one migration: run a step on a database, migrate to a revision."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

from alembic import command

from orbit.server.store import migrate
from orbit.server.store.db import null_pool_engine


def run(url: str, fn) -> Any:
    """`fn(connection)` in one transaction on the database at `url`; its result."""
    async def go():
        engine = null_pool_engine(url)
        try:
            async with engine.begin() as conn:
                return await conn.run_sync(fn)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def to(revision: str):
    """A step that migrates the connection's database up to `revision`."""
    def upgrade(conn) -> None:
        warnings.filterwarnings("ignore", message=".*ignored for PRIMARY key")
        cfg = migrate._config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)

    return upgrade
