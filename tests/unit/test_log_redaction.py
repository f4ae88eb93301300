"""The log configuration's guards, line by line: token-shaped text redacted (standard library and
structlog lines), uvicorn's WebSocket lines (raw URLs) dropped, asyncio's reports written without
the repr that quotes an exception's arguments, and a traceback another handler cached unused."""

from __future__ import annotations

import io
import logging
import sqlite3

import pytest
import structlog

from orbit.cli.logs import configure_logging, redact

TOKEN = "orb_0123456789abcdef0123456789abcdef_s3cr3t-Secret_value"


@pytest.fixture
def out():
    stream = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    configure_logging("info", stream=stream, cache=False)
    yield stream
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    root.setLevel(level)
    structlog.reset_defaults()


def test_redact_replaces_anything_shaped_like_a_token():
    assert redact(f"GET /v1/queues?token={TOKEN}&x=1") == "GET /v1/queues?token=orb_[redacted]&x=1"
    assert redact("orb_abc") == "orb_[redacted]"
    assert redact("nothing here") == "nothing here"


def test_no_line_holds_a_token(out):
    logging.getLogger("some.library").warning("saw %s", TOKEN)
    structlog.get_logger("orbit.test").info("event", value=TOKEN)
    text = out.getvalue()
    assert TOKEN not in text and "s3cr3t" not in text and text.count("orb_[redacted]") == 2


def test_uvicorn_websocket_lines_are_dropped(out):
    uvicorn = logging.getLogger("uvicorn.error")
    uvicorn.info('%s - "WebSocket %s" [accepted]', "127.0.0.1:1", f"/v1/workers/connect?token={TOKEN}")
    uvicorn.info('%s - "WebSocket %s" %d', "127.0.0.1:1", "/v1/workers/connect?x=y", 401)
    uvicorn.info("Application startup complete.")
    assert out.getvalue().splitlines() == ["Application startup complete."]


def test_asyncio_reports_lose_the_repr_and_keep_the_safe_traceback(out):
    message = "near 'MARK" + "VALUE': syntax error"  # not quoted by the traceback's source line
    try:
        raise sqlite3.OperationalError(message)
    except sqlite3.OperationalError as exc:
        error = exc
    handler = logging.Handler()  # another handler that formats first, caching the plain traceback
    handler.format = lambda record: logging.Formatter().format(record)  # type: ignore[method-assign]
    handler.emit = lambda record: handler.format(record)  # type: ignore[method-assign]
    logging.getLogger().addHandler(handler)
    try:
        logging.getLogger("asyncio").error(
            "Task exception was never retrieved\nfuture: <Task finished exception=%r>", error,
            exc_info=(type(error), error, error.__traceback__))
        logging.getLogger("asyncio").error(
            "Exception in callback later(%r)", "MARK" + "VALUE", exc_info=(type(error), error, error.__traceback__))
    finally:
        logging.getLogger().removeHandler(handler)
    text = out.getvalue()
    assert "MARKVALUE" not in text
    assert "Task exception was never retrieved" in text and "Exception in callback later" in text
    assert text.count("message withheld") == 2
