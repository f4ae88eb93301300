"""Structured JSON logs on stderr: one object per line, never a token or a payload.

Log calls name ids, codes and timings only. The one way application data could still reach a
line is an exception's text: a database error's message can quote the statement it failed on,
values included (MySQL's "Duplicate entry '…'", "… near '…'", and SQLAlchemy's "[parameters: …]").
So tracebacks are written here with such errors reduced to their class and code, for the JSON
lines and for the standard library's (uvicorn, asyncio) alike.

URLs are the other way in: a client may put its token in a query string or a path although only
the Authorization header should carry it. No line names a raw URL: requests and WebSocket
upgrades are logged by the node with their route's template, uvicorn's access log is off, and
its WebSocket lines (written by its error logger at INFO whatever `access_log` says, with the
path and query string) are dropped. As a last guard every line is written with anything shaped
like a token (`orb_…`) redacted.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from typing import Any, TextIO

import structlog

# Top-level packages whose exceptions may carry statement text or bound values.
_DATABASE_PACKAGES = frozenset({"sqlalchemy", "asyncmy", "pymysql", "MySQLdb", "sqlite3", "aiosqlite"})
# Libraries whose INFO lines are statements or per-connection chatter (Alembic announces its
# dialect on every migration-context use).
_QUIET = ("sqlalchemy", "aiosqlite", "asyncmy", "websockets", "alembic")
# A bearer token, or what a client may have cut from one: `orb_` and the token alphabet after it.
TOKEN_SHAPE = re.compile(r"orb_[A-Za-z0-9_\-]+")
REDACTED = "orb_[redacted]"
# How uvicorn's per-connection WebSocket lines begin: '<client> - "WebSocket <path?query>" <status>'.
_UVICORN_WEBSOCKET_LINE = '%s - "WebSocket %s"'
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _is_database_error(exc: BaseException) -> bool:
    return type(exc).__module__.partition(".")[0] in _DATABASE_PACKAGES


def _code(exc: BaseException) -> Any:
    """The driver's error code: MySQL's number, SQLite's extended code; None when it has none."""
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlite_errorcode", None)
    if code is None and orig.args and isinstance(orig.args[0], int):
        code = orig.args[0]
    return code


def _headline(exc: BaseException) -> str:
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    if _is_database_error(exc):
        return f"{name}: [message withheld: database errors may quote values] code={_code(exc)}\n"
    return "".join(traceback.format_exception_only(type(exc), exc))


def safe_traceback(exc: BaseException) -> str:
    """The traceback `traceback.format_exception` would write, database errors' messages withheld."""
    chain: list[tuple[BaseException, str | None]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    link: str | None = None
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, _CONTEXT
        else:
            current = None
    out: list[str] = []
    for e, joined_by in reversed(chain):
        if e.__traceback__ is not None:
            out.append("Traceback (most recent call last):\n")
            out.extend(traceback.format_list(traceback.extract_tb(e.__traceback__)))
        out.append(_headline(e))
        if joined_by is not None:
            out.append(joined_by)
    return "".join(out).rstrip("\n")


def _exception_of(exc_info: Any) -> BaseException | None:
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple):
        return exc_info[1]
    return sys.exc_info()[1] if exc_info else None


def format_exc_info(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
    """structlog's `format_exc_info`, through `safe_traceback`."""
    exc = _exception_of(event.pop("exc_info", None))
    if exc is not None:
        event["exception"] = safe_traceback(exc)
    return event


def redact(text: str) -> str:
    """`text` with anything shaped like a token replaced."""
    return TOKEN_SHAPE.sub(REDACTED, text) if "orb_" in text else text


class SafeFormatter(logging.Formatter):
    """The standard library's lines (uvicorn, asyncio), with tracebacks through `safe_traceback`
    and tokens redacted."""

    def format(self, record: logging.LogRecord) -> str:
        # `logging.Formatter` reuses a traceback another handler already wrote on the record
        # (`exc_text`), unsafely: this one writes its own, and leaves theirs as it found it.
        cached, record.exc_text = record.exc_text, None
        try:
            return redact(super().format(record))
        finally:
            record.exc_text = cached

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        exc = _exception_of(ei)
        return safe_traceback(exc) if exc is not None else ""


class NoRawUrls(logging.Filter):
    """Drops uvicorn's WebSocket lines, which name the raw path and query string (the node logs
    each upgrade itself, by route), and writes asyncio's reports of unhandled errors without the
    `repr` of the task or callback: it holds the exception's arguments, which for a database
    error can quote a statement's values (the traceback follows, through `safe_traceback`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str):
            return True
        if record.name.startswith("uvicorn") and record.msg.startswith(_UVICORN_WEBSOCKET_LINE):
            return False
        if record.name == "asyncio" and record.exc_info:
            # "Task exception was never retrieved\nfuture: <Task … exception=Error('…')>", or
            # "Exception in callback f(arguments)": the first line, up to any repr.
            record.msg, record.args = re.split(r"[(<=\n]", record.msg, maxsplit=1)[0].rstrip(), None
        return True


def _redact_line(_logger: Any, _name: str, line: Any) -> Any:
    """The last structlog processor: the rendered JSON line with tokens redacted."""
    return redact(line) if isinstance(line, str) else line


def configure_logging(level: str = "info", *, stream: TextIO | None = None, cache: bool = True) -> None:
    """JSON lines at `level` on `stream` (stderr). `cache=False` keeps loggers from holding on to
    this configuration, for tests that configure it in-process and restore it afterwards."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(SafeFormatter("%(message)s"))
    handler.addFilter(NoRawUrls())
    root = logging.getLogger()
    root.addHandler(handler)
    # DEBUG is Orbit's own: below INFO the libraries write statements, rows and frames, values
    # included (aiosqlite its calls' arguments, SQLAlchemy result rows, websockets frame text).
    root.setLevel(max(lvl, logging.INFO))
    logging.getLogger("orbit").setLevel(lvl)
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(lvl, logging.WARNING))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            format_exc_info,
            structlog.processors.JSONRenderer(),
            _redact_line,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=cache,
    )
