"""How full the database's connection pools are, for the node's metrics: a pool that stays full
makes every request wait for a connection before its first statement."""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy.ext.asyncio import AsyncEngine

from .db import Database


class PoolUse(NamedTuple):
    pool: str
    in_use: int  # connections handed out now
    open: int  # connections open now, in use or idle
    max: int  # connections the pool may open


def _engine(name: str, engine: AsyncEngine) -> PoolUse:
    pool: Any = engine.pool
    size = pool.size()
    return PoolUse(name, pool.checkedout(), pool.checkedin() + pool.checkedout(), size + max(pool._max_overflow, 0))


def pool_usage(db: Database) -> list[PoolUse]:
    """MySQL: the driver pools (transactional, autocommit) and the SQLAlchemy engine of Core
    statements. SQLite: the single writer (in use while its lock is held) and the read pool."""
    out = [PoolUse(name, pool.size - pool.freesize, pool.size, pool.maxsize)
           for name, pool in sorted(db._pools.items())]
    if db._write_lock is None:
        out.append(_engine("engine", db.engine))
    else:
        held = int(db._write_lock.locked())
        out.append(PoolUse("sqlite_writer", held, 1, 1))
        out.append(_engine("sqlite_read", db.read_engine))
    return out
