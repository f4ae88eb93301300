"""A transaction whose deadlocks or lock waits outlast the retries is a clean UNAVAILABLE (503 with
Retry-After; a worker command's error with retry_after_ms) and one log line, never a traceback.

The conflicts are injected at the COMMIT (where MariaDB reports a deadlock on deferred writes),
on MariaDB, whose error codes (1213, 1205) are what the store retries on.
"""

from __future__ import annotations

import asyncmy.errors
import pytest
import structlog

from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.store import db as db_module
from orbit.server.store.tx import Tx

from .worker_client import Worker, serve

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)]


@pytest.fixture
def conflicts(monkeypatch):
    """Every COMMIT of deferred writes fails with the given MySQL error from now on."""
    monkeypatch.setattr(db_module.random, "uniform", lambda a, b: 0.0)  # no jitter sleeps: a fast test

    def start(code: int) -> None:
        async def refuse(self: Tx) -> bool:
            if not self._deferred:
                return False
            self._deferred = []
            raise asyncmy.errors.OperationalError(code, "Deadlock found when trying to get lock; 'secret'")

        monkeypatch.setattr(Tx, "commit_deferred", refuse)

    return start


def _gave_up_lines(events: list[dict]) -> list[tuple[str, int]]:
    """(error, attempts) of every line but the access log's, after checking that each one is a
    `transaction_gave_up` without a traceback. The node's own loops (the event sequencer) may
    give up beside the request under test: their failures are the same one line, never more."""
    lines = [e for e in events if e["event"] != "request"]
    assert lines and all(e["event"] == "transaction_gave_up" and "exc_info" not in e for e in lines), lines
    return [(e["error"], e["attempts"]) for e in lines]


@pytest.mark.parametrize(("code", "attempts"), [(1213, db_module.MAX_ATTEMPTS),
                                                (1205, db_module.MAX_LOCK_WAIT_RETRIES + 1)])
async def test_a_write_that_keeps_conflicting_answers_503_and_logs_one_line(tenant, conflicts, code, attempts):
    conflicts(code)
    with structlog.testing.capture_logs() as events:
        r = await tenant.post("/v1/queues", {"name": "conflicted", "max_concurrency": 1, "rate_per_second": 10})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "UNAVAILABLE" and int(r.headers["retry-after"]) >= 1
    assert (f"OperationalError {code}", attempts) in _gave_up_lines(events)
    assert "secret" not in str(events)


async def test_a_claim_that_keeps_conflicting_is_answered_unavailable_with_retry_after(tenant, db, db_url,
                                                                                       conflicts):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=100)
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1})
    assert r.status_code == 201, r.text
    app = create_app(Settings(database_url=db_url, node_id="t", background_loops=False), db)
    async with serve(app) as base, Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        conflicts(1213)
        with structlog.testing.capture_logs() as events:
            reply = await w.call("claim", queue_id=q["id"], max_tasks=1)
        assert not reply["ok"] and reply["error"]["code"] == "UNAVAILABLE"
        assert reply["error"]["retry_after_ms"] >= 1000
        assert ("OperationalError 1213", db_module.MAX_ATTEMPTS) in _gave_up_lines(events)
