"""Query parameters of every list route are validated like the body fields they filter on, before
anything reaches the database; and a value the database refuses anyway is the request's fault
(400 INVALID_ARGUMENT), never an outage (503 UNAVAILABLE, which tells a client to retry forever).

On MariaDB a queue name is an ASCII column: `GET /v1/queues?name=%C3%A9` used to reach it and
come back as 503."""

from __future__ import annotations

import base64

import orjson
import pytest
from sqlalchemy import text

from orbit.server.errors import ValueRefused
from orbit.server.services import queues as queue_service
from orbit.server.store.tx import Stmt

from .queue_helpers import assert_error, ok, state
from .test_schedules_api import create as create_schedule

pytestmark = pytest.mark.anyio

NON_ASCII = ["é", "名前", "\u00a0", "a\u0301", "\U0001f600"]
ID = "0" * 32


def cursor_of(position: str) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"after": position})).decode().rstrip("=")


async def routes(tenant) -> dict[str, str]:
    q = await tenant.create_queue()
    task = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}), 201)["task"]
    schedule = await create_schedule(tenant, q, paused=True)
    return {
        "queues": "/v1/queues",
        "resource_keys": "/v1/resource-keys",
        "schedules": "/v1/schedules",
        "runs": f"/v1/schedules/{schedule['id']}/runs",
        "tasks": f"/v1/queues/{q['id']}/tasks",
        "attempts": f"/v1/tasks/{task['id']}/attempts",
        "audit": "/v1/audit-records",
        "events": "/v1/events",
    }


# (route, parameter) -> values the parameter's rule refuses: the body field's rule where there is one.
NAMES_REFUSED = [*NON_ASCII, "", "-a", "a b", "a/b", "a\n", "a" * 129, "a%"]
IDS_REFUSED = [*NON_ASCII, "", "x" * 32, ID.upper().replace("0", "A"), ID + "0", ID[:-1], ID + "\n"]
STAMPS_REFUSED = [*NON_ASCII, "", "2026-13-01T00:00:00Z", "2026-01-01", "2026-01-01T00:00:00",
                  "9999-12-31T23:59:59-23:59", "2026-01-01T00:00:00+0100"]
INTEGERS_REFUSED = ["", "8.0", "1e2", "+8", " 8", "８", "x", "0", "1001", "-1", "9" * 30]
FLAGS_REFUSED = ["", "yes", "1", "on", "True", "é"]
CURSORS_REFUSED = ["", *NON_ASCII, "not-a-cursor", cursor_of("é"), cursor_of("x" * 65), cursor_of("a b")]
REFUSED: dict[tuple[str, str], list[str]] = {
    ("queues", "name"): NAMES_REFUSED,
    ("resource_keys", "name"): NAMES_REFUSED,
    ("schedules", "name"): NAMES_REFUSED,
    ("schedules", "queue_id"): IDS_REFUSED,
    ("tasks", "schedule_id"): IDS_REFUSED,
    ("tasks", "state"): [*NON_ASCII, "", "waiting", "DONE"],
    ("tasks", "created_after"): STAMPS_REFUSED,
    ("tasks", "created_before"): STAMPS_REFUSED,
    ("audit", "resource_id"): IDS_REFUSED,
    ("audit", "after"): IDS_REFUSED,
    ("audit", "action"): [*NON_ASCII, "", "queue", "Queue.create", "queue.create\n", "q." + "a" * 63],
    ("events", "after"): [*NON_ASCII, "", "-1", "01", "1.0", "٣", str(2**64), "9" * 21],
    ("events", "type"): [*NON_ASCII, "", "task", "Task.x", "task.*.x", "task.a,,task.b", "task.a\ttask.b"],
    ("events", "wait_ms"): ["", "1.0", "-1", "30001"],
    **{(route, "limit"): INTEGERS_REFUSED for route in
       ("queues", "resource_keys", "schedules", "runs", "tasks", "attempts", "audit", "events")},
    **{(route, "cursor"): CURSORS_REFUSED for route in
       ("queues", "resource_keys", "schedules", "runs", "tasks", "attempts")},
    **{(route, "include_retired"): FLAGS_REFUSED for route in ("queues", "resource_keys", "schedules")},
    ("events", "tail"): FLAGS_REFUSED,
}
ACCEPTED: dict[tuple[str, str], list[str]] = {
    ("queues", "name"): ["a", "A.b:c-d_e", "a" * 128],
    ("schedules", "queue_id"): [ID],
    ("tasks", "state"): ["WAITING", "NEEDS_REVIEW"],
    ("tasks", "created_after"): ["2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5+05:30", "0001-01-01T00:00:00Z"],
    ("audit", "action"): ["queue.create", "a.b_c.d1"],
    ("events", "after"): ["0", "7", str(2**64 - 1)],
    ("events", "type"): ["task.succeeded", "schedule.*", "task.a,queue.*", "task.a , queue.b"],
    ("queues", "limit"): ["1", "1000"],
    ("queues", "include_retired"): ["true", "false"],
    ("events", "tail"): ["true", "false"],
}


async def test_every_list_filter_refuses_what_its_field_refuses(tenant, db):
    paths = await routes(tenant)
    before = await state(db, tenant.namespace_id)
    for (route, param), values in REFUSED.items():
        for value in values:
            r = await tenant.get(paths[route], params={param: value})
            try:
                assert_error(r, 400, "INVALID_ARGUMENT", param)
            except AssertionError as exc:
                raise AssertionError(f"{route} ?{param}={value!r}: {exc}") from None
    assert await state(db, tenant.namespace_id) == before


async def test_valid_filters_are_accepted(tenant):
    paths = await routes(tenant)
    for (route, param), values in ACCEPTED.items():
        for value in values:
            r = await tenant.get(paths[route], params={param: value})
            assert r.status_code == 200, (route, param, value, r.text)


async def test_a_name_filter_finds_the_exact_name(tenant):
    q = await tenant.create_queue()
    page = ok(await tenant.get("/v1/queues", params={"name": q["name"]}))
    assert [x["id"] for x in page["items"]] == [q["id"]]
    assert ok(await tenant.get("/v1/queues", params={"name": q["name"] + "x"}))["items"] == []


# ---------------------------------------------------------------- a value the database refuses


def refused_statement(db_url: str) -> Stmt:
    """A statement the database refuses for its value: on MariaDB a character the ASCII `name`
    column cannot be compared with (an illegal mix of collations); on SQLite an integer beyond
    64 bits, which the driver refuses to bind."""
    if db_url.startswith("sqlite"):
        return Stmt("SELECT id FROM queues WHERE max_concurrency = ?", (2**64,))
    return Stmt("SELECT id FROM queues WHERE name = ?", ("é",))


async def test_a_value_the_database_refuses_is_invalid_argument_not_unavailable(tenant, db, db_url, monkeypatch):
    stmt = refused_statement(db_url)
    for run in (lambda: db.read(lambda tx: tx.rows(stmt)), lambda: db.transaction(lambda tx: tx.rows(stmt))):
        with pytest.raises(ValueRefused) as raised:
            await run()
        assert raised.value.code == "INVALID_ARGUMENT"
    if db_url.startswith("sqlite"):
        core = (text("SELECT id FROM queues WHERE max_concurrency = :v"), {"v": 2**64})
    else:
        core = (text("SELECT id FROM queues WHERE name = :v"), {"v": "é"})
    with pytest.raises(ValueRefused):
        await db.core_read(lambda tx: tx.execute(*core))
    with pytest.raises(ValueRefused):
        await db.core_transaction(lambda tx: tx.execute(*core))

    # Through HTTP: a filter that validation would let through reaches the database.
    async def list_queues(db_, principal, **_):
        await db_.read(lambda tx: tx.rows(stmt))

    monkeypatch.setattr(queue_service, "list_queues", list_queues)
    r = await tenant.get("/v1/queues")
    err = assert_error(r, 400, "INVALID_ARGUMENT")
    assert "retry-after" not in r.headers and "unavailable" not in err["message"]


async def test_a_statement_the_database_refuses_is_internal_not_unavailable(tenant, db, monkeypatch):
    """A wrong statement is a bug: 500 INTERNAL on both backends, not a retryable outage."""

    async def list_queues(db_, principal, **_):
        await db_.read(lambda tx: tx.rows(Stmt("SELECT no_such_column FROM queues")))

    monkeypatch.setattr(queue_service, "list_queues", list_queues)
    r = await tenant.get("/v1/queues")
    assert_error(r, 500, "INTERNAL")
    assert "retry-after" not in r.headers
