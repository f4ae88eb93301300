"""Which database a URL names, how its sessions are set up, and what its errors mean."""

from __future__ import annotations

from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from ..errors import DatabaseUnavailable, ValueRefused

__all__ = ["DatabaseUnavailable", "ValueRefused"]  # raised by the store; defined with the other refusals

MYSQL, SQLITE = "mysql", "sqlite"

# MySQL/MariaDB error codes the store acts on.
DEADLOCK = 1213
LOCK_WAIT_TIMEOUT = 1205
DUPLICATE_KEY = 1062
BAD_NULL = 1048  # "Column … cannot be null" (strict mode): how a guarded deferred UPDATE says no
CONNECTION_LOST = frozenset({2002, 2003, 2006, 2013, 2055})
# The server answers but takes no more connections: to this node, as good as unreachable.
CONNECTIONS_REFUSED = frozenset({1040, 1203})
# The server did not serve (beyond the lost connections above and the client library's own
# errors, 2000-2999): overloaded, out of resources, refusing access, read-only, shutting down,
# a statement killed or timed out, a crashed table. Safe to retry later: UNAVAILABLE.
SERVER_UNAVAILABLE = frozenset({
    1021, 1037, 1038, 1040, 1041, 1044, 1045, 1047, 1053, 1077, 1079, 1080, 1081, 1114, 1129, 1130,
    1135, 1152, 1154, 1155, 1156, 1157, 1158, 1159, 1160, 1161, 1180, 1181, 1184, 1194, 1195, 1203,
    1205, 1213, 1226, 1290, 1317, 1792, 1836, 1927, 1969, 3024, 4031,
})
# Access refused (user or password, or rights on the database): once running, as unavailable as a
# down server (credentials are being rotated); at start-up, a configuration error to say at once.
ACCESS_DENIED = frozenset({1044, 1045})
# A statement larger than the server's max_allowed_packet: refused before it ran (the server
# then drops the connection). Its values are too large to send, not the server unavailable.
PACKET_TOO_LARGE = 1153
# The server refused a value (a character its column cannot hold, too long, out of range, a bad
# date, an illegal mix of collations in a comparison, more than one statement may carry): the
# request carried a value validation should have refused. Never an outage: INVALID_ARGUMENT.
# SQLSTATE class 22 is data errors too.
DATA_ERRORS = frozenset({1264, 1265, 1266, 1267, 1270, 1271, 1292, 1300, 1366, 1367, 1406, 1411, 1690, 3140,
                         PACKET_TOO_LARGE})
# SQLite's refusals that mean the file cannot be served now, as opposed to a statement it refused.
_SQLITE_UNAVAILABLE = ("database is locked", "database is busy", "unable to open database", "disk i/o error",
                       "database or disk is full", "readonly database", "database disk image is malformed")

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


def is_unreachable(exc: BaseException) -> bool:
    """A MySQL node's view of an outage: the database could not be reached, a connection to it
    was lost or refused, or none came in time. Only a hint: a probe confirms it (store/health.py),
    since one stale pooled connection proves nothing."""
    code = mysql_error_code(exc)
    if code is not None:
        return code in CONNECTION_LOST or code in CONNECTIONS_REFUSED
    if getattr(exc, "connection_invalidated", False) or type(exc).__name__ == "TimeoutError":
        return True  # SQLAlchemy's: a connection it invalidated, its pool's timeout
    return isinstance(driver_error(exc), OSError)  # refused, reset, timed out (TimeoutError is one)


def is_data_error(exc: BaseException) -> bool:
    """The database refused a value, not the statement or the service: see `DATA_ERRORS`. On
    SQLite, an integer beyond 64 bits (the driver refuses to bind it)."""
    code = mysql_error_code(exc)
    if code is not None:
        return code in DATA_ERRORS or str(getattr(driver_error(exc), "sqlstate", "") or "").startswith("22")
    orig = driver_error(exc)
    if isinstance(orig, OverflowError):
        return "SQLite" in str(orig)
    return type(orig).__name__ == "DataError"


def is_unavailable(exc: BaseException) -> bool:
    """The database did not serve (unreachable, overloaded, refusing access, read-only, a locked
    or unwritable SQLite file), as opposed to a statement it refused (a bug: 500) or a value it
    refused (`is_data_error`: 400). Only this is a retryable outage (503 UNAVAILABLE)."""
    code = mysql_error_code(exc)
    if code is not None:
        return code in CONNECTION_LOST or code in SERVER_UNAVAILABLE or 2000 <= code < 3000
    orig = driver_error(exc)
    if type(orig).__name__ == "OperationalError" and type(orig).__module__.startswith("sqlite3"):
        message = str(orig).lower()
        return any(m in message for m in _SQLITE_UNAVAILABLE)
    # SQLAlchemy's own (a pool timeout, a connection it could not open) name no driver error.
    return type(exc).__name__ == "OperationalError" and orig is exc
