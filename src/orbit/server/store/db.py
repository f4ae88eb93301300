"""The database: its connection pools and the one transaction helper.

Every state change runs as ``await db.transaction(fn)`` where ``fn(tx)`` does all of
its work through ``tx``: the whole function is re-run on deadlock or lock-wait errors,
so it must not touch the network other than the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import structlog
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ..errors import Overloaded
from ..overload import time_left
from .dialect import (
    LOCK_WAIT_TIMEOUT,
    MYSQL,
    MYSQL_SESSION,
    MYSQL_SESSION_OPTIONAL,
    PACKET_TOO_LARGE,
    SQLITE_PRAGMAS,
    DatabaseUnavailable,
    PlanNoLongerHolds,
    ValueRefused,
    dialect_of,
    driver_error,
    is_connection_lost,
    is_data_error,
    is_retryable,
    is_unavailable,
    is_unreachable,
    mysql_error_code,
    normalize_url,
)
from .health import DatabaseHealth, describe
from .pool import DriverPool
from .tx import Stmt, Tx

T = TypeVar("T")
log = structlog.get_logger("orbit.store")

# A lock wait timeout is retried only a couple of times: a row held that long belongs to a
# stuck peer, and the client is better served by a prompt 503.
MAX_LOCK_WAIT_RETRIES = 2
MAX_ATTEMPTS = 12
# A connection (SQLite: the writer) is waited for this long at most when none is free; longer
# means the node is overloaded or the database is not answering: UNAVAILABLE, and a probe decides
# whether it is an outage. Short, so that no request waits much longer than a few seconds.
ACQUIRE_TIMEOUT_S = 3.0
# A transaction is not run again after this long since its first attempt began: conflicts that
# outlast it give up as MAX_ATTEMPTS do (one line, UNAVAILABLE), instead of holding the caller.
RETRY_BUDGET_S = 5.0
CONNECT_TIMEOUT_S = 5


def _mysql_session_sync(cursor: Any) -> None:
    for sql in MYSQL_SESSION:
        cursor.execute(sql)
    for sql in MYSQL_SESSION_OPTIONAL:
        try:
            cursor.execute(sql)
        except Exception:
            pass


class Database:
    """Owns the pools. MySQL: plain driver pools (a transactional one with multi-statements, an
    autocommit one for reads) and a SQLAlchemy engine for Core statements (tests, migrations).
    SQLite: one writer connection behind a lock (the single writer) and a read pool."""

    def __init__(self, url: str, *, pool_size: int = 20, echo: bool = False) -> None:
        self.url = normalize_url(url)
        self.dialect = dialect_of(self.url)
        self._pools: dict[str, DriverPool] = {}
        self._returned_at = time.monotonic()  # when a pooled connection last came back
        self.overloaded = 0  # waits for a connection (SQLite: the writer) that ended without one
        self._pool_size = pool_size
        if self.dialect == MYSQL:
            self.engine: AsyncEngine = create_async_engine(
                self.url, pool_size=4, max_overflow=pool_size, pool_recycle=1800, pool_timeout=ACQUIRE_TIMEOUT_S,
                isolation_level="READ COMMITTED", echo=echo, hide_parameters=True,
            )

            @event.listens_for(self.engine.sync_engine, "connect")
            def _on_connect(dbapi_conn, _record):  # pragma: no cover - driver callback
                cur = dbapi_conn.cursor()
                _mysql_session_sync(cur)
                cur.close()

            self.read_engine = self.engine
            self._write_lock: asyncio.Lock | None = None
        else:
            self.engine = create_async_engine(self.url, pool_size=1, max_overflow=0, echo=echo,
                                              hide_parameters=True)
            self._install_sqlite(self.engine, immediate=True)
            self.read_engine = create_async_engine(self.url, pool_size=4, max_overflow=4, echo=echo,
                                                   pool_timeout=ACQUIRE_TIMEOUT_S, hide_parameters=True)
            self._install_sqlite(self.read_engine, immediate=False)
            self._write_lock = asyncio.Lock()
        # Called after a commit with the resource keys that transaction gave permits back to.
        self.on_keys_freed: Callable[[set[str]], None] | None = None
        # Called after a commit that gave waiting claims work (`Tx.claimable`): per queue, how many.
        self.on_claimable: Callable[[dict[str, int]], None] | None = None
        # Called after a commit with the namespaces that transaction wrote events to.
        self.on_events_written: Callable[[set[str]], None] | None = None
        # Whether the database can be reached: while it cannot, every operation is refused at once.
        self.health = DatabaseHealth(self._probe, self._drop_idle_connections)

    @staticmethod
    def _install_sqlite(engine: AsyncEngine, *, immediate: bool) -> None:
        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_conn, _record):  # pragma: no cover - driver callback
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            for pragma in SQLITE_PRAGMAS:
                cur.execute(pragma)
            cur.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn):  # pragma: no cover - driver callback
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    # ---------------------------------------------------------------- transactions

    async def transaction(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """Run ``fn`` in one write transaction, retrying the whole of it on lock conflicts."""
        if not self.health.available:
            raise self.health.unavailable()
        last: Tx | None = None  # the attempt that committed

        async def body(tx: Tx) -> T:
            nonlocal last
            result = await fn(tx)
            last = tx  # its `claimable` is filled by the COMMIT's round trip
            return result

        result = await self._transaction(body)
        assert last is not None
        freed, written = last.keys_freed, last.events_written
        if freed and self.on_keys_freed is not None:
            self.on_keys_freed(freed)
        if last.claimable and self.on_claimable is not None:
            self.on_claimable(last.claimable)
        if written and self.on_events_written is not None:
            self.on_events_written(written)
        return result

    async def _transaction(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        if self.dialect != MYSQL:
            return await self.core_transaction(fn)

        async def once(state: dict[str, bool]) -> T:
            pool = await self._driver_pool()
            conn = await self._acquire(pool)
            try:
                await self._prepare_driver_conn(conn)
                # No BEGIN round trip: with autocommit off the first statement opens the transaction.
                tx = Tx(MYSQL, driver=conn, multi=True)
                try:
                    result = await fn(tx)
                    state["committing"] = True
                    if not await tx.commit_deferred():
                        await conn.commit()
                except Exception as exc:
                    meaning = tx.meaning_of(exc)
                    if meaning is not None:
                        state["committing"] = False  # a statement before the COMMIT failed: it never ran
                        raise meaning from exc
                    raise
                return result
            except BaseException:
                try:
                    await conn.rollback()
                except Exception:
                    conn.close()
                raise
            finally:
                self._release(pool, conn)

        return await self._retrying(once)

    async def lock_last(self, body: Callable[[Tx, bool], Awaitable[T]]) -> T:
        """Run `body(tx, True)`, which plans on unlocked reads and locks the hot usage rows last
        (held only until the commit); if the plan no longer holds under the lock, it raises
        `PlanNoLongerHolds` and runs again as `body(tx, False)` with the usage rows locked first."""
        try:
            return await self.transaction(lambda tx: body(tx, True))
        except PlanNoLongerHolds:
            return await self.transaction(lambda tx: body(tx, False))

    async def read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """Reads of independent statements: on MySQL an autocommit connection (no BEGIN/COMMIT);
        on SQLite a read-only transaction beside the writer."""
        if self.dialect != MYSQL:
            return await self.core_read(fn)
        if not self.health.available:
            raise self.health.unavailable()
        conn = pool = None
        try:
            pool = await self._driver_pool(autocommit=True)
            conn = await self._acquire(pool)
            await self._prepare_driver_conn(conn)
            return await fn(Tx(MYSQL, driver=conn, multi_reads=True))
        except Exception as exc:
            lost = is_connection_lost(exc) or isinstance(exc, OSError)
            if (lost or mysql_error_code(exc) == PACKET_TOO_LARGE) and conn is not None:
                conn.close()  # the server dropped it
            self._unreachable(exc)
            _refused_value(exc)
            if lost or is_unavailable(exc):
                raise DatabaseUnavailable(type(driver_error(exc)).__name__) from exc
            raise
        finally:
            if conn is not None:
                self._release(pool, conn)

    async def any_row(self, stmt: Stmt) -> bool:
        """Whether a read finds a row: periodic jobs ask first and skip their transaction when
        there is nothing to do, which is nearly always."""
        return bool(await self.read(lambda tx: tx.rows(stmt)))

    async def core_transaction(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """A write transaction on a SQLAlchemy connection (Core statements of tests and tools;
        SQLite's single writer), retried like `transaction`."""
        if not self.health.available:
            raise self.health.unavailable()

        async def once(state: dict[str, bool]) -> T:
            async with self._writer(), self.engine.connect() as conn:
                async with conn.begin():
                    result = await fn(Tx(self.dialect, conn=conn))
                    state["committing"] = True
            return result

        return await self._retrying(once)

    @contextlib.asynccontextmanager
    async def _writer(self) -> AsyncIterator[None]:
        """SQLite's single writer, waited for at most ACQUIRE_TIMEOUT_S, or until the request's
        waits must end (MySQL: no lock)."""
        lock = self._write_lock
        if lock is None:
            yield
            return
        if lock.locked():
            try:
                await asyncio.wait_for(lock.acquire(), max(0.0, time_left(ACQUIRE_TIMEOUT_S)))
            except TimeoutError:
                self.overloaded += 1
                raise Overloaded("the writer stayed busy") from None
        else:
            await lock.acquire()
        try:
            yield
        finally:
            lock.release()

    async def core_read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        """A read-only transaction on a SQLAlchemy connection (no write lock on SQLite)."""
        if not self.health.available:
            raise self.health.unavailable()
        for attempt in (1, 2):
            try:
                async with self.read_engine.connect() as conn:
                    async with conn.begin():
                        return await fn(Tx(self.dialect, conn=conn))
            except SQLAlchemyTimeoutError:
                self.overloaded += 1
                raise Overloaded("every read connection stayed busy") from None
            except (DBAPIError, OverflowError) as exc:
                _refused_value(exc)
                invalidated = isinstance(exc, DBAPIError) and exc.connection_invalidated
                if invalidated and attempt == 1:
                    continue
                if is_unavailable(exc) or invalidated:
                    raise DatabaseUnavailable(type(exc).__name__) from exc
                raise
        raise AssertionError("unreachable")

    async def _retrying(self, once: Callable[[dict[str, bool]], Awaitable[T]]) -> T:
        attempt = 0
        lock_waits = 0
        give_up_at = time.monotonic() + RETRY_BUDGET_S
        while True:
            attempt += 1
            state = {"committing": False}
            try:
                return await once(state)
            except Exception as exc:
                committing = state["committing"]
                stale = isinstance(exc, DBAPIError) and exc.connection_invalidated and not committing
                # A pooled connection the server had closed: the transaction never ran, so once more
                # on a fresh one (the pool drops the dead one).
                stale = stale or (attempt == 1 and is_connection_lost(exc) and not committing)
                if mysql_error_code(exc) == LOCK_WAIT_TIMEOUT:
                    lock_waits += 1
                    if lock_waits > MAX_LOCK_WAIT_RETRIES:
                        raise self._gave_up(exc, attempt) from exc
                again = attempt < MAX_ATTEMPTS and time.monotonic() < give_up_at
                if (stale or is_retryable(exc, self.dialect)) and again:
                    await asyncio.sleep(random.uniform(0, 0.002 * (2 ** min(attempt, 7))))
                    continue
                if is_retryable(exc, self.dialect):
                    raise self._gave_up(exc, attempt) from exc
                if self._unreachable(exc):
                    raise DatabaseUnavailable(describe(exc)) from exc
                if is_connection_lost(exc):
                    raise DatabaseUnavailable("connection lost") from exc
                _refused_value(exc)
                invalidated = isinstance(exc, DBAPIError) and exc.connection_invalidated
                if (is_unavailable(exc) or invalidated) and not isinstance(exc, IntegrityError):
                    log.warning("database_unavailable", error=type(driver_error(exc)).__name__,
                                code=mysql_error_code(exc), during_commit=committing)
                    raise DatabaseUnavailable(type(driver_error(exc)).__name__) from exc
                if isinstance(exc, OSError) and self.dialect == MYSQL:
                    raise DatabaseUnavailable(type(exc).__name__) from exc
                raise

    def _gave_up(self, exc: BaseException, attempts: int) -> DatabaseUnavailable:
        """Deadlocks or lock waits that outlasted the retries: contention, not an outage. One line
        (no traceback: the code says it all) and a clean UNAVAILABLE the client may retry."""
        log.warning("transaction_gave_up", error=describe(exc), attempts=attempts)
        return DatabaseUnavailable("lock conflicts outlasted the retries",
                                   retry_after_ms=self.health.retry_after_ms())

    def _unreachable(self, exc: BaseException) -> bool:
        """Report a lost, refused or timed-out connection to the health (it confirms with a probe
        and logs the outage); True when `exc` was one."""
        if self.dialect == MYSQL and is_unreachable(exc):
            self.health.lost(exc)
            return True
        return False

    # ---------------------------------------------------------------- pools

    async def _acquire(self, pool: DriverPool) -> Any:
        """A pooled connection, waited for at most ACQUIRE_TIMEOUT_S (less when the request's
        waits must end sooner: `overload.time_left`). None in time while connections keep coming
        back is overload (`Overloaded`, no probe); none coming back at all may be a database that
        stopped answering: reported to the health, whose probe decides."""
        conn = await pool.acquire(time_left(ACQUIRE_TIMEOUT_S))
        if conn is None:
            if time.monotonic() - self._returned_at < ACQUIRE_TIMEOUT_S:
                self.overloaded += 1
                raise Overloaded("every database connection stayed busy")
            raise TimeoutError("no database connection came back in time")
        return conn

    def _release(self, pool: DriverPool, conn: Any) -> None:
        self._returned_at = time.monotonic()
        pool.release(conn)

    async def _probe(self) -> None:
        """One `SELECT 1` on a fresh connection, outside the pools: whether the database answers
        now, whatever the pooled connections' state."""
        if self.dialect != MYSQL:
            async with self.read_engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
            return
        import asyncmy

        u = make_url(self.url)
        conn = await asyncmy.connect(host=u.host or "127.0.0.1", port=u.port or 3306, user=u.username or "root",
                                     password=u.password or "", db=u.database, connect_timeout=CONNECT_TIMEOUT_S)
        try:
            async with conn.cursor() as cur:
                await cur.execute("SELECT 1")
        finally:
            conn.close()

    async def _drop_idle_connections(self) -> None:
        """After an outage the pooled connections are dead: close them before traffic resumes."""
        for pool in list(self._pools.values()):
            await asyncio.wait_for(pool.clear(), CONNECT_TIMEOUT_S)
        if self.dialect == MYSQL:
            await self.engine.dispose()

    async def _driver_pool(self, *, autocommit: bool = False) -> DriverPool:
        key = "autocommit" if autocommit else "transactional"
        pool = self._pools.get(key)
        if pool is None:
            import asyncmy
            from asyncmy.constants import CLIENT

            u = make_url(self.url)
            # Multi-statements let a transaction's writes travel in one round trip (Tx.defer),
            # and a read's independent statements (Tx.rows_multi); every statement is built from
            # `?` placeholders, never from input.
            flags = CLIENT.MULTI_STATEMENTS
            params = dict(client_flag=flags, host=u.host or "127.0.0.1", port=u.port or 3306,
                          user=u.username or "root", password=u.password or "", db=u.database, charset="utf8mb4",
                          autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S)
            pool = self._pools[key] = DriverPool(lambda: asyncmy.connect(**params), maxsize=self._pool_size * 2,
                                                 recycle_s=1800)
        return pool

    @staticmethod
    async def _prepare_driver_conn(conn: Any) -> None:
        """The session settings, once per connection."""
        if getattr(conn, "_orbit_ready", False):
            return
        async with conn.cursor() as cur:
            for sql in MYSQL_SESSION:
                await cur.execute(sql)
            for sql in MYSQL_SESSION_OPTIONAL:
                try:
                    await cur.execute(sql)
                except Exception:
                    pass
        if not conn.get_autocommit():
            await conn.commit()
        conn._orbit_ready = True

    async def ping(self) -> bool:
        """Whether the database answers. A node too busy to get a connection in time says yes:
        its connections keep coming back, and readiness is not the place to shed load (a balancer
        that took overloaded nodes out would only overload the others)."""
        try:
            await self.read(lambda tx: tx.rows(Stmt("SELECT 1 AS one")))
            return True
        except Overloaded:
            return True
        except Exception:
            return False

    async def close(self) -> None:
        await self.health.close()
        for pool in self._pools.values():
            pool.close()
            await pool.wait_closed()
        self._pools.clear()
        await self.engine.dispose()
        if self.read_engine is not self.engine:
            await self.read_engine.dispose()


def _refused_value(exc: BaseException) -> None:
    """A value the database refused is the request's fault (validation let it through), never an
    outage: 400, logged by code so that the gap in validation gets closed."""
    if is_data_error(exc):
        log.warning("database_refused_value", error=type(driver_error(exc)).__name__, code=mysql_error_code(exc))
        raise ValueRefused() from exc


def null_pool_engine(url: str) -> AsyncEngine:
    """A short-lived engine for admin commands and migrations.

    A SQLite file in a directory that does not exist is refused here, with a plain message:
    aiosqlite's failed connect could otherwise answer from its thread after the command's
    event loop had closed, and print a traceback beside the one-line error."""
    normalized = normalize_url(url)
    parsed = make_url(normalized)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parent = os.path.dirname(os.path.abspath(parsed.database))
        if not os.path.isdir(parent):
            raise ValueError(f"the SQLite database's directory {parent} does not exist")
    return create_async_engine(normalized, poolclass=NullPool, hide_parameters=True)
