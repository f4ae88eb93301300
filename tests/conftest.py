"""Shared fixtures: every storage test runs on SQLite and on MariaDB.

MariaDB comes from ORBIT_TEST_MYSQL_URL (default mysql://root@127.0.0.1:3306).
Each test session creates its own database and drops it at the end. When
ORBIT_REQUIRE_MARIADB=1 (CI), an unreachable MariaDB fails the run instead of
skipping its half of the suite.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from pathlib import Path

import pytest

MYSQL_BASE = os.environ.get("ORBIT_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306").rstrip("/")
REQUIRE_MARIADB = os.environ.get("ORBIT_REQUIRE_MARIADB") == "1"


def _mysql_admin(sql: str) -> None:
    import asyncmy
    from sqlalchemy.engine import make_url

    u = make_url(MYSQL_BASE.replace("mysql://", "mysql+asyncmy://", 1))

    async def run() -> None:
        conn = await asyncmy.connect(
            host=u.host or "127.0.0.1", port=u.port or 3306, user=u.username or "root", password=u.password or ""
        )
        try:
            async with conn.cursor() as cur:
                await cur.execute(sql)
        finally:
            conn.close()

    asyncio.run(run())


def _migrate(url: str) -> None:
    from orbit.server.store import migrate

    asyncio.run(migrate.upgrade(url))


@pytest.fixture(scope="session")
def mariadb_url():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw")
    name = f"orbit_test_{worker}_{uuid.uuid4().hex[:8]}"
    try:
        _mysql_admin(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    except Exception as exc:  # pragma: no cover - environment dependent
        if REQUIRE_MARIADB:
            pytest.fail(f"MariaDB is required (ORBIT_REQUIRE_MARIADB=1) but unreachable: {exc}")
        pytest.skip(f"MariaDB unreachable: {exc}")
    url = f"{MYSQL_BASE}/{name}"
    _migrate(url)
    yield url
    try:
        _mysql_admin(f"DROP DATABASE IF EXISTS `{name}`")
    except Exception:
        pass


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory):
    path: Path = tmp_path_factory.mktemp("sqlite") / "orbit.db"
    url = f"sqlite:///{path}"
    _migrate(url)
    return url


@pytest.fixture(params=["sqlite", "mariadb"])
def db_url(request):
    """The database URL of the backend under test."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def anyio_backend():
    return "asyncio"


class WorkerEvents(logging.Handler):
    """The SDK worker's log events in order: each `record.orbit` (event and fields) plus `at`,
    the record's wall-clock time."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "orbit", None)
        if fields:
            self.events.append({**fields, "at": record.created})

    @property
    def names(self) -> list[str]:
        return [e["event"] for e in self.events]

    def named(self, event: str) -> list[dict]:
        return [e for e in self.events if e["event"] == event]


@pytest.fixture
def worker_events():
    """Collects the `orbit.worker` logger's events (INFO and up) during the test."""
    handler = WorkerEvents()
    logger = logging.getLogger("orbit.worker")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(previous)
