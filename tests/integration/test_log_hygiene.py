"""Logs never carry a token or the application's data: a realistic flow with every logger at
DEBUG, unique markers in a payload, a result, a handler's error message and the parameters of
failing statements (in a background loop, a request and a worker frame); no log line holds the
token or any marker, while the lines that describe the flow are there."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import traceback
import uuid

import pytest
import structlog
from sqlalchemy import text

from orbit.cli.logs import configure_logging
from orbit.server.loops import BackgroundLoops
from orbit.server.services import dispatch
from orbit.server.services import tasks as task_service
from orbit.server.store.tx import Stmt

from .queue_helpers import ok
from .worker_client import Worker

pytestmark = pytest.mark.anyio


@pytest.fixture
def log_lines():
    """Everything the server's loggers write at DEBUG, configured as `orbit server` does, and
    restored afterwards."""
    out = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    configure_logging("debug", stream=out, cache=False)
    yield lambda: out.getvalue().splitlines()
    for h in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(h)
    root.setLevel(level)
    structlog.reset_defaults()


def _bad_sql(marker: str):
    """A failing statement whose text, once the driver inlines its parameter, quotes `marker`."""
    return Stmt("SELECT id FROM tasks WHERE WHERE id = ?", (marker,))


async def _bad_raw(db, marker: str) -> None:
    await db.transaction(lambda tx: tx.rows(_bad_sql(marker)))


async def _bad_core(db, marker: str) -> None:
    await db.core_transaction(lambda tx: tx.execute(text("SELECT id FROM tasks WHERE WHERE id = :v"), {"v": marker}))


async def test_no_token_or_data_in_any_log_line(tenant, base, db, db_url, log_lines, monkeypatch):
    m = {name: f"MARK{name.upper()}{uuid.uuid4().hex}" for name in
         ("payload", "batch", "result", "error", "raw_sql", "core_sql", "route_sql", "frame_sql", "bad_token")}
    secret = tenant.token[len("orb_") + 33:]  # the secret may itself contain "_"

    # The markers would be there if nothing kept them out: the drivers quote them.
    for fail, marker in ((_bad_raw, m["raw_sql"]), (_bad_core, m["core_sql"])):
        with pytest.raises(Exception) as raised:
            await fail(db, marker)
        quoted = marker in "".join(traceback.format_exception(raised.value))
        assert quoted or db_url.startswith("sqlite") or fail is _bad_core  # MariaDB's raw path quotes it

    q = await tenant.create_queue(max_concurrency=5, rate_per_second=100)
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": {"note": m["payload"]}, "max_attempts": 1})
    assert r.status_code == 201, r.text
    ok(await tenant.post(f"/v1/queues/{q['id']}/tasks:batch",
                         {"tasks": [{"idempotency_key": tenant.key(), "payload": {"note": m["batch"]}}]}))
    assert (await tenant.get("/v1/queues", token=f"orb_{m['bad_token']}_{m['bad_token']}")).status_code == 401
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        leases = (await w.call("claim", queue_id=q["id"], max_tasks=2))["tasks"]
        assert len(leases) == 2
        for lease in leases:
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        assert (await w.call("renew", lease_id=leases[0]["lease_id"], lease_ms=30_000))["ok"]
        assert (await w.call("complete", lease_id=leases[0]["lease_id"], outcome="succeeded",
                             result={"answer": m["result"]}))["ok"]
        assert (await w.call("complete", lease_id=leases[1]["lease_id"], outcome="failed",
                             error={"message": m["error"], "retryable": False}))["ok"]
        assert (await w.call("bogus", payload=m["payload"]))["error"]["code"] == "INVALID_ARGUMENT"

        # A worker command whose transaction fails on a statement quoting a marker.
        async def failing_complete(db_, commands):
            await _bad_raw(db_, m["frame_sql"])

        monkeypatch.setattr(dispatch, "complete", failing_complete)
        assert (await w.call("release", lease_id=leases[0]["lease_id"]))["error"]["code"] == "UNAVAILABLE"
    done = ok(await tenant.get(f"/v1/tasks/{leases[0]['task_id']}"))
    assert done["result"] == {"answer": m["result"]}

    # A request whose service fails the same way.
    async def failing_get_task(db_, principal, task_id):
        await _bad_core(db_, m["route_sql"])

    monkeypatch.setattr(task_service, "get_task", failing_get_task)
    # A syntax error is a bug on both backends (500), never an outage (503).
    assert (await tenant.get(f"/v1/tasks/{leases[0]['task_id']}")).status_code == 500

    # Background loops that fail on such statements.
    loops = BackgroundLoops()
    loops.every(60, "bad_raw", lambda: _bad_raw(db, m["raw_sql"]))
    loops.every(60, "bad_core", lambda: _bad_core(db, m["core_sql"]))
    await asyncio.sleep(0.3)
    await loops.stop()

    lines = log_lines()
    leaked = [line for line in lines if tenant.token in line or secret in line or any(v in line for v in m.values())]
    assert not leaked, "\n".join(leaked)

    events = [json.loads(line) for line in lines if line.startswith("{")]
    requests = [e for e in events if e["event"] == "request"]
    submit = [e for e in requests if e["route"] == "/v1/queues/{queue_id}/tasks" and e["method"] == "POST"]
    assert submit and submit[0]["status"] == 201 and submit[0]["credential_id"] == tenant.credential_id
    assert set(submit[0]) >= {"request_id", "route", "method", "status", "latency_ms", "credential_id"}
    assert [e["credential_id"] for e in requests if e["status"] == 401] == [None]
    frames = {(e["type"], e["code"]) for e in events if e["event"] == "frame"}
    assert {("hello", "OK"), ("claim", "OK"), ("start", "OK"), ("renew", "OK"), ("complete", "OK"),
            ("unknown", "INVALID_ARGUMENT"), ("release", "UNAVAILABLE")} <= frames
    assert all(e["msg_id"] and e["latency_ms"] >= 0 for e in events if e["event"] == "frame")
    failed = [e for e in events if e["event"] == "background_loop_failed"]
    assert {e["loop"] for e in failed} == {"bad_raw", "bad_core"}
    assert all("message withheld" in e["exception"] for e in failed)
    assert [e for e in events if e["event"] == "internal_error" and "message withheld" in e["exception"]]
    assert [e for e in events if e["event"] == "frame_failed" and "message withheld" in e["exception"]]
