"""A statement's bound values never reach a log line through a database error, on both backends.

The drivers are made to fail, for real, on the statements that carry a marked payload, result or
value: the statement is swapped, at the driver, for one that names the marker, so that the
driver's own error message quotes it (MySQL quotes values of the statements it refuses; SQLAlchemy
adds "[parameters: …]" unless told `hide_parameters`). The errors then travel every way an error
is logged: a request's 500, a worker command's group commit, a background loop, and a task
nobody awaited (asyncio's report). No line may hold a marker.
"""

from __future__ import annotations

import asyncio
import json
import traceback
import uuid

import aiosqlite
import pytest

from orbit.server.loops import BackgroundLoops
from orbit.server.store.tx import Stmt, Tx

from .test_log_hygiene import log_lines  # noqa: F401
from .test_worker_protocol import submit
from .worker_client import Worker

pytestmark = pytest.mark.anyio


@pytest.fixture
def drivers_refuse(monkeypatch):
    """`refuse(marker)`: from now on both drivers fail every statement carrying `marker` (in its
    text or a parameter) with their own error, quoting the marker."""
    markers: list[str] = []

    def carries(value) -> bool:
        return any(m in str(value) for m in markers)

    def swapped(marker_source) -> str:
        return f"SELECT * FROM no_such_{next(m for m in markers if m in str(marker_source))}"

    real_run_mysql = Tx._run_mysql

    async def run_mysql(self, statements):  # the deferred writes travel in the same text
        self._deferred = [swapped(s) if carries(s) else s for s in self._deferred]
        return await real_run_mysql(self, [swapped(s) if carries(s) else s for s in statements])

    real_execute, real_executemany = aiosqlite.Connection.execute, aiosqlite.Connection.executemany

    async def execute(self, sql, parameters=None):
        if carries(sql) or carries(parameters):
            return await real_execute(self, swapped((sql, parameters)), [])
        return await real_execute(self, sql, parameters)

    async def executemany(self, sql, parameters):
        parameters = list(parameters)
        if carries(sql) or carries(parameters):
            return await real_execute(self, swapped((sql, parameters)), [])
        return await real_executemany(self, sql, parameters)

    monkeypatch.setattr(Tx, "_run_mysql", run_mysql)
    monkeypatch.setattr(aiosqlite.Connection, "execute", execute)
    monkeypatch.setattr(aiosqlite.Connection, "executemany", executemany)
    return markers.append


async def test_no_bound_value_in_any_log_line(tenant, base, db, db_url, log_lines, drivers_refuse):  # noqa: F811
    m = {k: f"MARK{k.upper()}{uuid.uuid4().hex}" for k in ("payload", "result", "loop", "task", "probe")}
    q = await tenant.create_queue()
    [task_id] = await submit(tenant, q["id"], 1)
    for marker in m.values():
        drivers_refuse(marker)

    # The drivers do quote the markers: unless something keeps them out, they would be logged.
    with pytest.raises(Exception) as raised:
        await db.transaction(lambda tx: _read_with(tx, m["probe"]))
    assert m["probe"] in _chain_text(raised.value)

    # A request whose INSERT carries the payload: 500 (or 503 where the error reads as an outage).
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": {"note": m["payload"]}})
    assert r.status_code in (500, 503), r.text
    assert m["payload"] not in r.text

    # A worker's report whose transaction carries the result: UNAVAILABLE, retried by the worker.
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        [lease] = (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
        assert lease["task_id"] == task_id
        assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        done = await w.call("complete", lease_id=lease["lease_id"], outcome="succeeded",
                            result={"answer": m["result"]})
        assert done["error"]["code"] == "UNAVAILABLE", done

    # A background loop failing on such a statement.
    loops = BackgroundLoops()
    loops.every(60, "bad_loop", lambda: db.transaction(lambda tx: _read_with(tx, m["loop"])))
    await asyncio.sleep(0.3)
    await loops.stop()

    # A task nobody awaited, failing the same way, as asyncio reports it when it is collected
    # (the test runner has its own handler, so asyncio's default one is called as it would be).
    loop = asyncio.get_running_loop()
    forgotten = loop.create_task(db.transaction(lambda tx: _read_with(tx, m["task"])))
    await asyncio.wait([forgotten])
    loop.default_exception_handler({"message": "Task exception was never retrieved",
                                    "exception": forgotten.exception(), "future": forgotten})

    lines = log_lines()
    leaked = [line for line in lines if any(v in line for v in m.values())]
    assert not leaked, "\n".join(leaked)
    text = "\n".join(lines)
    assert "Task exception was never retrieved" in text  # asyncio's report was written, without its repr
    events = [json.loads(line) for line in lines if line.startswith("{")]
    named = {e["event"] for e in events}
    assert "background_loop_failed" in named or "background_loop_still_failing" in named
    assert {"internal_error", "database_unavailable"} & named  # the request's failure
    assert "frame_failed" in named or "group_commit_failed" in named  # the report's failure
    with_traceback = [e for e in events if "exception" in e]
    assert with_traceback and all("message withheld" in e["exception"] for e in with_traceback)


async def _read_with(tx: Tx, marker: str):
    return await tx.rows(Stmt("SELECT id FROM tasks WHERE id = ?", (marker,)))


def _chain_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
