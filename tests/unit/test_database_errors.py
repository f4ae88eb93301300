"""What a database error means for the client: a value the database refused is the request's
fault (400), the database not serving is an outage (503, retry), anything else is a bug (500).
Only the second may tell a client to retry."""

from __future__ import annotations

import sqlite3

import pytest
from asyncmy import errors as mysql
from sqlalchemy.exc import DBAPIError

from orbit.server.store.dialect import is_data_error, is_unavailable


def wrapped(orig: BaseException) -> DBAPIError:
    return DBAPIError.instance("SELECT 1", None, orig, Exception)


DATA = [1153, 1264, 1265, 1267, 1271, 1292, 1300, 1366, 1406, 1411, 1690]
OUTAGE = [1040, 1045, 1053, 1205, 1213, 1290, 1836, 1927, 1969, 2002, 2003, 2006, 2013, 2055]
BUGS = [1054, 1064, 1146, 1062, 1048, 1406 + 10_000]


@pytest.mark.parametrize("code", DATA)
def test_values_the_database_refuses_are_data_errors(code):
    for exc in (mysql.OperationalError(code, "x"), mysql.DataError(code, "x")):
        assert is_data_error(exc) and is_data_error(wrapped(exc))
        assert not is_unavailable(exc) and not is_unavailable(wrapped(exc))


@pytest.mark.parametrize("code", OUTAGE)
def test_a_database_that_does_not_serve_is_unavailable(code):
    exc = mysql.OperationalError(code, "x")
    assert is_unavailable(exc) and is_unavailable(wrapped(exc))
    assert not is_data_error(exc)


@pytest.mark.parametrize("code", BUGS)
def test_statements_the_database_refuses_are_neither(code):
    exc = mysql.OperationalError(code, "x")  # asyncmy's class for every code it does not map
    assert not is_unavailable(exc) and not is_data_error(exc)


def test_sqlite():
    for message in ("database is locked", "unable to open database file", "disk I/O error",
                    "database or disk is full", "attempt to write a readonly database"):
        exc = sqlite3.OperationalError(message)
        assert is_unavailable(exc) and is_unavailable(wrapped(exc)) and not is_data_error(exc)
    for message in ("near \"WHERE\": syntax error", "no such column: x", "no such table: x"):
        exc = sqlite3.OperationalError(message)
        assert not is_unavailable(exc) and not is_data_error(exc)
    too_big = OverflowError("Python int too large to convert to SQLite INTEGER")
    assert is_data_error(too_big) and not is_unavailable(too_big)
    assert not is_data_error(OverflowError("date value out of range"))
