"""Which database a URL names, how its sessions are set up, and what its errors mean."""

from __future__ import annotations

from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from ..errors import DatabaseUnavailable

__all__ = ["DatabaseUnavailable"]  # raised by the store; defined with the other refusals

MYSQL, SQLITE = "mysql", "sqlite"

# MySQL/MariaDB error codes the store acts on.
DEADLOCK = 1213
LOCK_WAIT_TIMEOUT = 1205
DUPLICATE_KEY = 1062
BAD_NULL = 1048  # "Column … cannot be null" (strict mode): how a guarded deferred UPDATE says no
CONNECTION_LOST = frozenset({2002, 2003, 2006, 2013, 2055})

# Every MySQL connection, whichever pool opened it, runs these once.
MYSQL_SESSION = (
    "SET SESSION time_zone = '+00:00'",
    "SET SESSION innodb_lock_wait_timeout = 5",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    # Guarded writes rely on strict mode: without it NULL into a NOT NULL column stores 0 with a warning.
    "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@sql_mode, ''), 'STRICT_TRANS_TABLES')",
)
# MariaDB only: a session stuck inside a transaction (frozen or partitioned node) is killed so
# that its row locks do not block every other node. MySQL refuses it, which is fine.
MYSQL_SESSION_OPTIONAL = ("SET SESSION idle_transaction_timeout = 15",)

SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA busy_timeout=10000",
    "PRAGMA foreign_keys=OFF",
)


class RetryTransaction(Exception):
    """Raised inside a transaction to have the helper roll back and run it again."""


class PlanNoLongerHolds(Exception):
    """A plan made on unlocked reads no longer holds under the lock: run again, locked first."""


def normalize_url(url: str) -> str:
    """Accept `mysql://`, `mariadb://` and `sqlite:///` and pick the async drivers."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme in ("mysql", "mariadb"):
        rest = url.split("://", 1)[1]
        u = make_url("mysql+asyncmy://" + rest)
        query = dict(u.query)
        query.setdefault("charset", "utf8mb4")
        return u.set(query=query).render_as_string(hide_password=False)
    if scheme == "sqlite":
        return "sqlite+aiosqlite://" + url.split("://", 1)[1]
    raise ValueError(f"unsupported database URL scheme {parts.scheme!r}: use mysql:// or sqlite:///")


def dialect_of(url: str) -> str:
    return SQLITE if url.startswith("sqlite") else MYSQL


def sqlite_path(url: str) -> str | None:
    """The file behind a SQLite URL; None for MySQL or an in-memory database."""
    if dialect_of(normalize_url(url)) != SQLITE:
        return None
    u = make_url(normalize_url(url))
    return u.database if u.database and u.database != ":memory:" else None


def driver_error(exc: BaseException) -> BaseException:
    """The driver's exception, whether SQLAlchemy wrapped it or not."""
    return getattr(exc, "orig", None) or exc


def mysql_error_code(exc: BaseException) -> int | None:
    orig = driver_error(exc)
    if not type(orig).__module__.startswith(("asyncmy", "pymysql", "MySQLdb")):
        return None
    args = getattr(orig, "args", None)
    if args and isinstance(args[0], int):
        return args[0]
    return None


def is_duplicate_key(exc: BaseException) -> bool:
    code = mysql_error_code(exc)
    if code is not None:
        return code == DUPLICATE_KEY
    orig = driver_error(exc)
    if type(orig).__name__ != "IntegrityError":
        return False
    return "UNIQUE constraint failed" in str(orig) or "PRIMARY KEY" in str(orig)


def is_retryable(exc: BaseException, dialect: str) -> bool:
    """Deadlocks, lock waits and SQLite's busy database mean: run the transaction again."""
    if isinstance(exc, RetryTransaction):
        return True
    if dialect == MYSQL:
        return mysql_error_code(exc) in (DEADLOCK, LOCK_WAIT_TIMEOUT)
    orig = driver_error(exc)
    return type(orig).__name__ == "OperationalError" and (
        "database is locked" in str(orig) or "database is busy" in str(orig)
    )


def is_connection_lost(exc: BaseException) -> bool:
    return mysql_error_code(exc) in CONNECTION_LOST


def is_operational(exc: BaseException) -> bool:
    """The drivers' (and SQLAlchemy's) OperationalError: the database refused to serve (too many
    connections, access, a locked SQLite file), as opposed to a statement that is wrong."""
    return type(driver_error(exc)).__name__ == "OperationalError" or type(exc).__name__ == "OperationalError"
