"""Schedule management: create, read, list, configure, retire and the run records
over HTTP and through both SDK clients, on SQLite and MariaDB; and a queue that a live schedule
targets cannot retire.

Generation is not tested here: run records are inserted directly, and the cursor the scheduler
would move is set on the row. Schedules are created with long intervals or daily crons (or
paused, or retired at the end) so that no scheduler in the same database finds them due.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import given
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection
from sqlalchemy import func, insert, select, update

from orbit import (
    APIError,
    AsyncClient,
    Client,
    ConfigureScheduleRequest,
    CreateScheduleRequest,
    MisfirePolicy,
    Schedule,
    TaskTemplate,
)
from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.core.ids import new_id
from orbit.server.store.tables import audit_records, event_batches, idempotency_records, schedule_runs, schedules

from .conftest import make_tenant
from .queue_helpers import (
    DECIMAL,
    HEX32,
    TIMESTAMP,
    assert_error,
    audit_rows,
    event_rows,
    envelope,
    idempotency_count,
    ok,
    post_raw,
    unique_name,
)
from .test_openapi import CHECKS, FUZZ, cases, checks_after_send, negative_parts, send
from .test_queues_create import INVALID_NAMES, MALFORMED, VALID_NAMES
from .worker_client import serve

pytestmark = pytest.mark.anyio

BASE = "/v1/schedules"
FIELDS = {"id", "namespace_id", "queue_id", "name", "paused", "cron", "interval_seconds", "timezone", "start_at",
          "end_at", "misfire", "overlap", "task", "next_trigger_at", "last_trigger_at", "revision", "retired_at",
          "created_at", "updated_at"}
TASK_FIELDS = {"payload", "priority", "max_attempts", "retry", "on_lease_lost", "resource_keys", "deadline_seconds",
               "start_deadline_seconds"}
DEFAULT_RETRY = {"initial_backoff_ms": 1000, "max_backoff_ms": 60000, "multiplier": 2.0, "jitter": 0.2}
DAY = 86_400


# ---------------------------------------------------------------- helpers


def path(s: dict[str, Any] | str, action: str = "") -> str:
    return f"{BASE}/{s if isinstance(s, str) else s['id']}{action}"


def create_body(queue: dict[str, Any] | str, name: str | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": unique_name("sched") if name is None else name,
                            "queue_id": queue if isinstance(queue, str) else queue["id"],
                            "interval_seconds": DAY, "task": {"payload": {"report": "nightly"}}}
    body.update(fields)
    return body


def configure_body(revision: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"expected_revision": revision, "reason": "move to the night", "paused": False,
                            "cron": "0 4 * * *", "timezone": "Europe/Berlin", "task": {"payload": {"v": 2}}}
    body.update(fields)
    return body


def retire_body(revision: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"expected_revision": revision, "reason": "report discontinued"}
    body.update(fields)
    return body


def ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def wire(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def create(tenant, queue, name: str | None = None, **fields: Any) -> dict[str, Any]:
    return ok(await tenant.post(BASE, create_body(queue, name, **fields)), 201)["schedule"]


def assert_schedule_object(s: dict[str, Any]) -> None:
    """Every field of the schedule object, with its wire types."""
    assert set(s) == FIELDS, sorted(s)
    for f in ("id", "namespace_id", "queue_id"):
        assert HEX32.match(s[f]), (f, s[f])
    assert isinstance(s["name"], str) and isinstance(s["paused"], bool) and isinstance(s["timezone"], str)
    assert (s["cron"] is None) != (s["interval_seconds"] is None), s
    assert s["cron"] is None or isinstance(s["cron"], str)
    assert s["interval_seconds"] is None or type(s["interval_seconds"]) is int
    assert set(s["misfire"]) == {"policy", "catch_up_window_seconds"} and s["misfire"]["policy"] in (
        "catch_up", "latest") and type(s["misfire"]["catch_up_window_seconds"]) is int
    assert s["overlap"] in ("allow", "skip")
    assert set(s["task"]) == TASK_FIELDS, sorted(s["task"])
    assert set(s["task"]["retry"]) == set(DEFAULT_RETRY)
    assert isinstance(s["revision"], str) and DECIMAL.match(s["revision"]) and int(s["revision"]) >= 1
    for f in ("created_at", "updated_at"):
        assert isinstance(s[f], str) and TIMESTAMP.match(s[f]), (f, s[f])
    for f in ("start_at", "end_at", "next_trigger_at", "last_trigger_at", "retired_at"):
        assert s[f] is None or TIMESTAMP.match(s[f]), (f, s[f])


async def row(db, schedule_id: str) -> dict[str, Any]:
    """The stored row, with its hidden columns (anchor, due time, application)."""

    async def read(tx):
        return dict(await tx.one_or_none(select(schedules).where(schedules.c.id == schedule_id)))

    return await db.core_read(read)


async def set_row(db, schedule_id: str, **values: Any) -> None:
    """What the scheduler would write (its cursor)."""

    async def write(tx):
        await tx.execute(update(schedules).where(schedules.c.id == schedule_id).values(**values))

    await db.core_transaction(write)


def naive(moment: str | None) -> datetime | None:
    return None if moment is None else ts(moment).replace(tzinfo=None)


async def state(db, namespace_id: str) -> dict[str, Any]:
    """Row counts of everything a write touches, plus every schedule's columns."""

    async def read(tx):
        counts = {}
        for t in (idempotency_records, audit_records, event_batches):
            counts[t.name] = await tx.scalar(
                select(func.count()).select_from(t).where(t.c.namespace_id == namespace_id))
        rows = await tx.all(select(schedules).where(schedules.c.namespace_id == namespace_id)
                            .order_by(schedules.c.id))
        return {"counts": counts, "schedules": [tuple(r.values()) for r in rows]}

    return await db.core_read(read)


async def rejected(tenant, db, target: str, bodies: list[tuple[Any, str | None]]) -> None:
    """Each body gets 400 INVALID_ARGUMENT naming the field, and nothing is written."""
    before = await state(db, tenant.namespace_id)
    for body, field in bodies:
        r = await tenant.post(target, body)
        try:
            assert_error(r, 400, "INVALID_ARGUMENT", field)
        except AssertionError as exc:
            raise AssertionError(f"body {body!r}: {exc}") from None
    assert await state(db, tenant.namespace_id) == before


async def resource_key(tenant, name: str | None = None) -> dict[str, Any]:
    body = {"name": name or unique_name("rk"), "max_concurrency": 2}
    return ok(await tenant.post("/v1/resource-keys", body), 201)["resource_key"]


# ---------------------------------------------------------------- create


async def test_create_an_interval_schedule(tenant, db):
    queue = await tenant.create_queue()
    key = tenant.key()
    body = create_body(queue, interval_seconds=60)
    r = await tenant.post(BASE, body, key=key)
    data = ok(r, 201)
    assert set(data) == {"deduplicated", "schedule"} and data["deduplicated"] is False
    s = data["schedule"]
    assert_schedule_object(s)
    assert (s["namespace_id"], s["queue_id"], s["name"]) == (tenant.namespace_id, queue["id"], body["name"])
    assert (s["paused"], s["cron"], s["interval_seconds"], s["timezone"]) == (False, None, 60, "UTC")
    assert (s["start_at"], s["end_at"], s["last_trigger_at"], s["retired_at"]) == (None, None, None, None)
    assert s["misfire"] == {"policy": "catch_up", "catch_up_window_seconds": 60} and s["overlap"] == "allow"
    assert s["task"] == {"payload": {"report": "nightly"}, "priority": 5, "max_attempts": 3, "retry": DEFAULT_RETRY,
                         "on_lease_lost": "review", "resource_keys": [], "deadline_seconds": None,
                         "start_deadline_seconds": None}
    assert s["revision"] == "1" and s["created_at"] == s["updated_at"]
    # Without start_at, an interval's first point is one interval after the creation.
    assert ts(s["next_trigger_at"]) == ts(s["created_at"]) + timedelta(seconds=60)
    assert ok(await tenant.get(path(s))) == s

    stored = await row(db, s["id"])
    assert stored["anchor_at"] == naive(s["created_at"]) and stored["due_at"] == naive(s["next_trigger_at"])
    assert stored["application_id"] == tenant.application["id"] and stored["last_task_id"] is None
    assert (stored["misfire_policy"], stored["catch_up_window_seconds"], stored["overlap"]) == ("catch_up", 60, "allow")
    assert orjson.loads(stored["task"]) == s["task"]

    (audit,) = await audit_rows(db, s["id"])
    assert (audit["action"], audit["resource_type"], audit["namespace_id"]) == \
        ("schedule.create", "schedule", tenant.namespace_id)
    assert audit["actor_credential_id"] == tenant.credential_id
    assert audit["request_id"] == r.headers["x-request-id"] and audit["idempotency_key"] == key
    assert audit["before"] is None and orjson.loads(audit["after"]) == s
    (event,) = await event_rows(db, s["id"])
    assert (event["type"], event["namespace_id"], event["resource_type"]) == \
        ("schedule.created", tenant.namespace_id, "schedule")
    assert orjson.loads(event["data"]) == {"schedule": s}
    ok(await tenant.post(path(s, ":retire"), retire_body("1")))  # nothing left due for a scheduler


async def test_create_a_cron_schedule_with_every_field(tenant, db):
    queue = await tenant.create_queue()
    keys = [(await resource_key(tenant))["name"] for _ in range(2)]
    task = {"payload": [1, "two", {"3": None}], "priority": 9, "max_attempts": 7,
            "retry": {"initial_backoff_ms": 500, "max_backoff_ms": 9000, "multiplier": 3, "jitter": 0},
            "on_lease_lost": "retry", "resource_keys": keys, "deadline_seconds": 600, "start_deadline_seconds": 30}
    body = create_body(queue, cron="0 4 * * *", timezone="Europe/Berlin", interval_seconds=None,
                       misfire={"policy": "latest", "catch_up_window_seconds": 3600}, overlap="skip", task=task,
                       start_at="2020-01-01T00:00:00+01:00", end_at="2999-12-31T23:59:59.5Z", paused=False)
    s = ok(await tenant.post(BASE, body), 201)["schedule"]
    assert_schedule_object(s)
    assert (s["cron"], s["interval_seconds"], s["timezone"], s["overlap"]) == ("0 4 * * *", None, "Europe/Berlin",
                                                                               "skip")
    assert (s["start_at"], s["end_at"]) == ("2019-12-31T23:00:00.000000Z", "2999-12-31T23:59:59.500000Z")
    assert s["misfire"] == {"policy": "latest", "catch_up_window_seconds": 3600}
    assert s["task"] == {**task, "retry": {**task["retry"], "multiplier": 3.0, "jitter": 0.0}}

    # The first 04:00 in Berlin after the creation.
    created = ts(s["created_at"])
    berlin = ZoneInfo("Europe/Berlin")
    day = created.astimezone(berlin).date()
    points = [datetime(d.year, d.month, d.day, 4, tzinfo=berlin) for d in (day, day + timedelta(days=1))]
    assert ts(s["next_trigger_at"]) == next(p for p in points if p > created)
    assert (await row(db, s["id"]))["due_at"] == naive(s["next_trigger_at"])


async def test_first_trigger_points_and_bounds(tenant, db):
    queue = await tenant.create_queue()
    later = (datetime.now(timezone.utc) + timedelta(hours=2)).replace(microsecond=0)

    # A future start_at is an interval's first point, and bounds a cron.
    s = await create(tenant, queue, interval_seconds=600, start_at=wire(later))
    assert s["next_trigger_at"] == s["start_at"] == wire(later)
    assert (await row(db, s["id"]))["anchor_at"] == later.replace(tzinfo=None)
    s = await create(tenant, queue, cron="*/15 * * * *", interval_seconds=None,
                     start_at=later.astimezone(timezone(timedelta(hours=-5))).isoformat())
    assert s["start_at"] == wire(later)
    first = ts(s["next_trigger_at"])
    assert first >= later and first.minute % 15 == 0 and first - later < timedelta(minutes=15)

    # An interval from a start_at in the past runs on its grid from the first point after now.
    start = datetime.now(timezone.utc) - timedelta(seconds=1000, microseconds=500_000)
    s = await create(tenant, queue, interval_seconds=DAY // 24, start_at=wire(start))
    created, point = ts(s["created_at"]), ts(s["next_trigger_at"])
    assert (point - start) % timedelta(hours=1) == timedelta(0)
    assert created < point <= created + timedelta(hours=1)

    # No point before end_at: no cursor, nothing due.
    s = await create(tenant, queue, interval_seconds=DAY, end_at=wire(datetime.now(timezone.utc) + timedelta(hours=1)))
    assert s["next_trigger_at"] is None and (await row(db, s["id"]))["due_at"] is None

    # A paused schedule has its cursor but is not due.
    s = await create(tenant, queue, paused=True)
    assert s["paused"] is True and ts(s["next_trigger_at"]) == ts(s["created_at"]) + timedelta(days=1)
    assert (await row(db, s["id"]))["due_at"] is None


async def test_create_is_idempotent(tenant, db):
    queue = await tenant.create_queue()
    key = tenant.key()
    body = create_body(queue)
    first = ok(await tenant.post(BASE, body, key=key), 201)["schedule"]
    before = await state(db, tenant.namespace_id)
    assert ok(await tenant.post(BASE, body, key=key)) == {"deduplicated": True, "schedule": first}
    for other in (create_body(queue, body["name"], interval_seconds=DAY + 1), create_body(queue)):
        assert_error(await tenant.post(BASE, other, key=key), 409, "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before
    assert await idempotency_count(db, tenant.namespace_id, key) == 1


async def test_writes_require_an_idempotency_key(tenant, db):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    before = await state(db, tenant.namespace_id)
    for target, body in ((BASE, create_body(queue)), (path(s, ":configure"), configure_body("1")),
                         (path(s, ":retire"), retire_body("1"))):
        for extra in ({}, {"Idempotency-Key": ""}, {"Idempotency-Key": "a b"}, {"Idempotency-Key": "x" * 129}):
            r = await post_raw(tenant.http, target, orjson.dumps(body), token=tenant.token, extra=extra)
            assert_error(r, 400, "INVALID_ARGUMENT", "Idempotency-Key")
    assert await state(db, tenant.namespace_id) == before


async def test_names_follow_the_queue_name_rules_and_are_unique_in_the_namespace(tenant, db, http):
    queue = await tenant.create_queue()
    for name in VALID_NAMES:
        assert (await create(tenant, queue, name))["name"] == name
    await rejected(tenant, db, BASE, [(create_body(queue, name), "name") for name in INVALID_NAMES])
    await rejected(tenant, db, BASE, [(create_body(queue) | {"name": v}, "name") for v in (None, 5, ["a"])])

    name = unique_name("nightly")
    s = await create(tenant, queue, name)
    elsewhere = await tenant.create_queue()
    before = await state(db, tenant.namespace_id)
    err = assert_error(await tenant.post(BASE, create_body(elsewhere, name)), 409, "STATE_CONFLICT")
    assert name in err["message"] and err["details"] == {"name": name}
    assert await state(db, tenant.namespace_id) == before
    # The name stays taken after retirement; it is free in another namespace.
    ok(await tenant.post(path(s, ":retire"), retire_body("1")))
    assert_error(await tenant.post(BASE, create_body(queue, name)), 409, "STATE_CONFLICT")
    other = await make_tenant(db, http)
    assert (await create(other, await other.create_queue(), name))["namespace_id"] == other.namespace_id


async def test_the_queue_must_exist_in_the_namespace_and_not_be_retired(tenant, db, http):
    other = await make_tenant(db, http)
    foreign = await other.create_queue()
    retired = await tenant.create_queue()
    ok(await tenant.post(f"/v1/queues/{retired['id']}:retire", {"expected_revision": "1", "reason": "gone"}))
    before = await state(db, tenant.namespace_id)
    for queue_id in (new_id(), foreign["id"]):
        err = assert_error(await tenant.post(BASE, create_body(queue_id)), 404, "NOT_FOUND")
        assert "queue" in err["message"]
    err = assert_error(await tenant.post(BASE, create_body(retired)), 409, "STATE_CONFLICT")
    assert "retired" in err["message"] and set(err["details"]) == {"retired_at"}
    assert await state(db, tenant.namespace_id) == before


def _invalid_settings(queue_id: str) -> list[tuple[dict[str, Any], str | None]]:
    """Bodies (create) breaking one rule of the fields a configure shares, with the field named."""
    base = create_body(queue_id)
    cron = {**base, "interval_seconds": None}
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({**base, "interval_seconds": None}, "cron"),
        ({k: v for k, v in base.items() if k != "interval_seconds"}, "cron"),
        ({**base, "cron": "0 2 * * *"}, "interval_seconds"),
    ]
    for expr in ("0 0 * * * *", "* * * *", "0 0 L * *", "0 0 1W * *", "0 0 ? * *", "0 0 * * 1#2", "@daily",
                 "60 * * * *", "* 24 * * *", "H * * * *", "0 0 31 2 *", "", "0 2 * * *\u20030", "x" * 65, 5,
                 ["0 2 * * *"]):
        cases.append(({**cron, "cron": expr}, "cron"))
    cases += [({**base, "interval_seconds": v}, "interval_seconds") for v in (0, -1, 31_622_401, 60.0, "60", True)]
    cases += [({**base, "timezone": v}, "timezone")
              for v in ("Mars/Olympus", "utc", "Europe/Berlin ", "../etc/passwd", "", 1, "x" * 65)]
    # An optional field given as null is omitted (tests/integration/test_null_fields.py): not here.
    cases += [({**base, "misfire": {"policy": "catch_up", "catch_up_window_seconds": v}},
               "misfire.catch_up_window_seconds") for v in (-1, 604_801, 1.5, "60")]
    cases += [({**base, "misfire": {"policy": v}}, "misfire.policy") for v in ("all", "", "LATEST")]
    cases += [({**base, "misfire": {"policy": "latest", "window": 5}}, "misfire.window"),
              ({**base, "misfire": "latest"}, "misfire")]
    cases += [({**base, "overlap": v}, "overlap") for v in ("forbid", "", True)]
    cases += [({**base, "start_at": v}, "start_at") for v in ("2026-01-01", "2026-01-01T00:00:00", "tomorrow", 5,
                                                            "9999-12-31T23:59:59-23:59")]
    cases += [({**base, "end_at": "2026-13-01T00:00:00Z"}, "end_at"),
              ({**base, "start_at": "2030-01-01T00:00:00Z", "end_at": "2030-01-01T00:00:00Z"}, "end_at"),
              ({**base, "start_at": "2030-01-01T01:00:00+01:00", "end_at": "2029-12-31T23:59:59Z"}, "end_at"),
              ({**cron, "cron": "0 0 1 1 *", "start_at": "9999-12-31T00:00:00Z"}, "cron")]
    task = base["task"]
    cases += [({**base, "task": None}, "task"), ({k: v for k, v in base.items() if k != "task"}, "task"),
              ({**base, "task": {}}, "task.payload"), ({**base, "task": {"payload": None}}, "task.payload"),
              ({**base, "task": [task]}, "task")]
    for field, values in (("priority", (-1, 10, 5.0, "5")), ("max_attempts", (0, 101)),
                          ("on_lease_lost", ("never",)), ("deadline_seconds", (0, 31_622_401, "60")),
                          ("start_deadline_seconds", (0, 31_622_401, 1.5)),
                          ("resource_keys", (["a"] * 2, ["a", "b", "c", "d", "e"], ["-bad"], "a", [None])),
                          ("available_at", ("2030-01-01T00:00:00Z",)), ("deadline_at", ("2030-01-01T00:00:00Z",))):
        for v in values:
            field_name = "task.resource_keys.0" if v in (["-bad"], [None]) else f"task.{field}"
            cases.append(({**base, "task": {**task, field: v}}, field_name))
    cases += [({**base, "task": {**task, "retry": {"initial_backoff_ms": 2000, "max_backoff_ms": 1000}}},
               "task.retry.max_backoff_ms"),
              ({**base, "task": {**task, "retry": {"initial_backoff_ms": 0}}}, "task.retry.initial_backoff_ms"),
              ({**base, "task": {**task, "retry": {"jitter": 2}}}, "task.retry.jitter")]
    return cases


async def test_create_body_rules(tenant, db):
    queue = await tenant.create_queue()
    retired_key = await resource_key(tenant)
    ok(await tenant.post(f"/v1/resource-keys/{retired_key['id']}:retire", {"expected_revision": "1", "reason": "x"}))
    base = create_body(queue)
    cases = _invalid_settings(queue["id"])
    cases += [({**base, "task": {**base["task"], "resource_keys": names}}, "task.resource_keys")
              for names in (["no-such-key"], [retired_key["name"]], [(await resource_key(tenant))["name"], "nope"])]
    cases += [({**base, "queue_id": v}, "queue_id") for v in (None, "", queue["id"].upper(), queue["id"][:-1], 5)]
    cases += [({k: v for k, v in base.items() if k != f}, f) for f in ("name", "queue_id")]
    cases += [({**base, "paused": v}, "paused") for v in ("false", 0)]  # optional at create: null is omitted
    cases += [({**base, f: 1}, f) for f in ("id", "revision", "reason", "expected_revision", "next_trigger_at",
                                            "retired_at", "namespace_id")]
    cases += [({}, None)]
    await rejected(tenant, db, BASE, cases)
    before = await state(db, tenant.namespace_id)
    for raw in MALFORMED:
        r = await post_raw(tenant.http, BASE, raw, token=tenant.token, key=tenant.key())
        assert_error(r, 400, "INVALID_ARGUMENT")
    r = await post_raw(tenant.http, BASE, orjson.dumps(base), token=tenant.token, key=tenant.key(),
                       content_type="text/plain")
    assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    assert await state(db, tenant.namespace_id) == before


async def test_range_limits_are_accepted(tenant):
    queue = await tenant.create_queue()
    for fields in ({"interval_seconds": 1, "paused": True}, {"interval_seconds": 31_622_400},
                   {"misfire": {"policy": "catch_up", "catch_up_window_seconds": 0}},
                   {"misfire": {"policy": "latest", "catch_up_window_seconds": 604_800}},
                   {"misfire": {"catch_up_window_seconds": 5}},
                   {"task": {"payload": 0, "priority": 0, "max_attempts": 100, "deadline_seconds": 31_622_400,
                             "start_deadline_seconds": 1}},
                   {"cron": "0 2 * * MON-FRI", "interval_seconds": None, "timezone": "America/New_York",
                    "paused": True},
                   {"cron": "*/5 1,2,3 1-15 jan,JUL *", "interval_seconds": None, "timezone": "Etc/UTC",
                    "paused": True}):
        s = await create(tenant, queue, **fields)
        assert_schedule_object(s)
        for f, v in fields.items():
            if f == "misfire":
                assert s["misfire"] == {"policy": "catch_up", "catch_up_window_seconds": 60} | v
            elif f == "task":
                assert {k: s["task"][k] for k in v} == v
            else:
                assert s[f] == v, f
    payload = {"blob": "x" * (256 * 1024)}
    err = assert_error(await tenant.post(BASE, create_body(queue, task={"payload": payload})), 400,
                       "INVALID_ARGUMENT", "task.payload")
    assert "limit" in err["message"]


# ---------------------------------------------------------------- read, list, scope


async def test_get_of_a_missing_malformed_or_foreign_schedule_is_404(tenant, db, http):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    other = await make_tenant(db, http)
    foreign = await create(other, await other.create_queue())
    ids = ["0" * 32, new_id(), s["id"].upper(), s["id"][:-1], s["id"] + "0", "not-a-schedule", foreign["id"],
           queue["id"]]
    errors = [assert_error(await tenant.get(path(i)), 404, "NOT_FOUND") for i in ids]
    assert all(e == errors[0] for e in errors), errors
    errors = [assert_error(await tenant.get(path(i, "/runs")), 404, "NOT_FOUND") for i in ids]
    assert all(e == errors[0] for e in errors), errors
    before = await state(db, other.namespace_id)
    for action, body in ((":configure", configure_body("1")), (":retire", retire_body("1"))):
        for target in (foreign, "nope", new_id()):
            assert_error(await tenant.post(path(target, action), body), 404, "NOT_FOUND")
    assert await state(db, other.namespace_id) == before
    assert ok(await other.get(path(foreign))) == foreign


async def _list_all(tenant, token: str | None = None, **params) -> list[dict]:
    items: list[dict] = []
    cursor = None
    while True:
        page = ok(await tenant.get(BASE, token=token, params={**params, **({"cursor": cursor} if cursor else {})}))
        assert set(page) == {"items", "next_cursor"}
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
        assert isinstance(cursor, str) and cursor


async def test_list_paginates_and_filters(tenant, db, http):
    q1, q2 = await tenant.create_queue(), await tenant.create_queue()
    created = [await create(tenant, q) for q in (q1, q2, q1, q2, q1)]
    other = await make_tenant(db, http)
    await create(other, await other.create_queue())
    ids = [s["id"] for s in created]
    for limit in (1, 2, 5, 1000):
        assert [i["id"] for i in await _list_all(tenant, limit=limit)] == ids, limit
    first = ok(await tenant.get(BASE, params={"limit": 2}))
    assert len(first["items"]) == 2 and first["next_cursor"]
    rest = ok(await tenant.get(BASE, params={"limit": 3, "cursor": first["next_cursor"]}))
    assert [i["id"] for i in rest["items"]] == ids[2:] and rest["next_cursor"] is None
    assert ok(await tenant.get(BASE)) == {"items": created, "next_cursor": None}
    assert [i["id"] for i in await _list_all(tenant, queue_id=q1["id"], limit=1)] == ids[0::2]
    assert [i["id"] for i in await _list_all(tenant, queue_id=q2["id"])] == ids[1::2]
    assert await _list_all(tenant, queue_id=new_id()) == []
    assert [i["id"] for i in await _list_all(tenant, name=created[3]["name"])] == [ids[3]]
    assert await _list_all(tenant, name=created[3]["name"], queue_id=q1["id"]) == []
    # Retired schedules are listed only when asked.
    retired = ok(await tenant.post(path(created[0], ":retire"), retire_body("1")))["schedule"]
    assert [i["id"] for i in await _list_all(tenant)] == ids[1:]
    assert (await _list_all(tenant, include_retired="true"))[0] == retired
    assert await _list_all(tenant, name=retired["name"]) == []


async def test_list_rejects_invalid_parameters(tenant):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    bad_cursors = ["!!!", "abc", base64.urlsafe_b64encode(b'{"after": 5}').decode(),
                   base64.urlsafe_b64encode(b"[]").decode()]
    cases = [({"limit": v}, "limit") for v in ("0", "1001", "-1", "abc", "1.5", "")]
    cases += [({"cursor": c}, "cursor") for c in bad_cursors]
    cases += [({"include_retired": "maybe"}, "include_retired"), ({"name": "a" * 129}, "name"),
              ({"queue_id": "a" * 65}, "queue_id")]
    for target in (BASE, path(s, "/runs")):
        for params, field in cases:
            if target != BASE and field not in ("limit", "cursor"):
                continue
            try:
                assert_error(await tenant.get(target, params=params), 400, "INVALID_ARGUMENT", field)
            except AssertionError as exc:
                raise AssertionError(f"{target} params {params!r}: {exc}") from None
    for cursor in (base64.urlsafe_b64encode(b'{"after": "yesterday"}').decode(),
                   base64.urlsafe_b64encode(b'{"after": "2026-01-01"}').decode()):
        assert_error(await tenant.get(path(s, "/runs"), params={"cursor": cursor}), 400, "INVALID_ARGUMENT",
                     "cursor")


async def test_permissions(tenant):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    reader = await tenant.credential(["schedules:read"])
    manager = await tenant.credential(["schedules:manage"])
    nobody = await tenant.credential(["queues:read", "queues:manage", "tasks:submit", "tasks:read"])
    for token in (reader, nobody):
        for target, body in ((BASE, create_body(queue)), (path(s, ":configure"), configure_body("1")),
                             (path(s, ":retire"), retire_body("1"))):
            assert_error(await tenant.post(target, body, token=token), 403, "PERMISSION_DENIED")
    for target in (BASE, path(s), path(new_id()), path(s, "/runs")):
        assert_error(await tenant.get(target, token=nobody), 403, "PERMISSION_DENIED")
        assert_error(await tenant.get(target, token=manager), 403, "PERMISSION_DENIED")
    assert ok(await tenant.get(path(s), token=reader)) == s
    assert ok(await tenant.get(BASE, token=reader))["items"] == [s]
    made = ok(await tenant.post(BASE, create_body(queue), token=manager), 201)["schedule"]
    assert ok(await tenant.post(path(made, ":configure"), configure_body("1"), token=manager))
    # Permissions are checked on replays too.
    key = tenant.key()
    body = create_body(queue)
    ok(await tenant.post(BASE, body, key=key), 201)
    assert_error(await tenant.post(BASE, body, key=key, token=reader), 403, "PERMISSION_DENIED")
    assert_error(await tenant.http.get(BASE), 401, "UNAUTHENTICATED")


async def test_a_schedule_outside_the_queue_scope_is_invisible(tenant, db):
    inside, outside = await tenant.create_queue(), await tenant.create_queue()
    hidden = await create(tenant, outside)
    scoped = await tenant.credential(["schedules:read", "schedules:manage"], queue_scope=[inside["id"]])
    before = await state(db, tenant.namespace_id)
    err = assert_error(await tenant.post(BASE, create_body(outside), token=scoped), 404, "NOT_FOUND")
    assert "queue" in err["message"]
    missing = assert_error(await tenant.get(path(new_id()), token=scoped), 404, "NOT_FOUND")
    assert assert_error(await tenant.get(path(hidden), token=scoped), 404, "NOT_FOUND") == missing
    assert_error(await tenant.get(path(hidden, "/runs"), token=scoped), 404, "NOT_FOUND")
    assert_error(await tenant.post(path(hidden, ":configure"), configure_body("1"), token=scoped), 404, "NOT_FOUND")
    assert_error(await tenant.post(path(hidden, ":retire"), retire_body("1"), token=scoped), 404, "NOT_FOUND")
    assert await state(db, tenant.namespace_id) == before

    mine = ok(await tenant.post(BASE, create_body(inside), token=scoped), 201)["schedule"]
    assert ok(await tenant.get(path(mine), token=scoped)) == mine
    assert ok(await tenant.get(BASE, token=scoped))["items"] == [mine]
    assert ok(await tenant.get(BASE, token=scoped, params={"queue_id": outside["id"]}))["items"] == []
    assert [i["id"] for i in ok(await tenant.get(BASE))["items"]] == [hidden["id"], mine["id"]]
    configured = ok(await tenant.post(path(mine, ":configure"), configure_body("1"), token=scoped))["schedule"]
    assert ok(await tenant.post(path(mine, ":retire"), retire_body(configured["revision"]), token=scoped))
    nothing = await tenant.credential(["schedules:read"], queue_scope=[])
    assert ok(await tenant.get(BASE, token=nothing))["items"] == []


# ---------------------------------------------------------------- configure


async def test_configure_replaces_every_field_and_is_idempotent(tenant, db):
    queue = await tenant.create_queue()
    keyed = await resource_key(tenant)
    s = await create(tenant, queue, misfire={"policy": "latest", "catch_up_window_seconds": 10}, overlap="skip",
                     task={"payload": 1, "priority": 1, "resource_keys": [keyed["name"]]})
    key = tenant.key()
    body = configure_body("1", task={"payload": {"v": 2}, "resource_keys": [keyed["name"]], "deadline_seconds": 60})
    r = await tenant.post(path(s, ":configure"), body, key=key)
    data = ok(r)
    assert data["deduplicated"] is False
    after = data["schedule"]
    assert_schedule_object(after)
    # Fields left out take their defaults: a configure replaces everything.
    assert (after["cron"], after["interval_seconds"], after["timezone"]) == ("0 4 * * *", None, "Europe/Berlin")
    assert after["misfire"] == {"policy": "catch_up", "catch_up_window_seconds": 60} and after["overlap"] == "allow"
    assert after["task"] == {"payload": {"v": 2}, "priority": 5, "max_attempts": 3, "retry": DEFAULT_RETRY,
                             "on_lease_lost": "review", "resource_keys": [keyed["name"]], "deadline_seconds": 60,
                             "start_deadline_seconds": None}
    assert after["revision"] == "2" and after["updated_at"] >= s["updated_at"]
    for f in ("id", "namespace_id", "queue_id", "name", "created_at", "last_trigger_at", "retired_at", "paused"):
        assert after[f] == s[f], f
    assert ok(await tenant.get(path(s))) == after

    (audit,) = [a for a in await audit_rows(db, s["id"]) if a["action"] == "schedule.configure"]
    assert (audit["reason"], audit["idempotency_key"], audit["request_id"]) == \
        ("move to the night", key, r.headers["x-request-id"])
    assert orjson.loads(audit["before"]) == s and orjson.loads(audit["after"]) == after
    event = (await event_rows(db, s["id"]))[-1]
    assert event["type"] == "schedule.configured"
    assert orjson.loads(event["data"]) == {"schedule": after, "reason": "move to the night"}

    later = ok(await tenant.post(path(s, ":configure"), configure_body("2", paused=True)))["schedule"]
    before = await state(db, tenant.namespace_id)
    assert ok(await tenant.post(path(s, ":configure"), body, key=key)) == {"deduplicated": True, "schedule": after}
    for other in (configure_body("1"), {**body, "reason": "other"}):
        assert_error(await tenant.post(path(s, ":configure"), other, key=key), 409, "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before
    assert ok(await tenant.get(path(s)))["revision"] == later["revision"] == "3"


async def test_configure_moves_the_cursor_only_when_the_timing_changes(tenant, db):
    queue = await tenant.create_queue()
    s = await create(tenant, queue, interval_seconds=DAY)
    # The scheduler has moved the cursor meanwhile.
    cursor = naive(s["next_trigger_at"]) + timedelta(days=3)
    last = naive(s["next_trigger_at"]) + timedelta(days=2)
    await set_row(db, s["id"], next_trigger_at=cursor, due_at=cursor, last_trigger_at=last)
    same_timing = {"cron": None, "interval_seconds": DAY, "timezone": "UTC"}

    # Pausing keeps the cursor and takes the schedule off the scheduler's index.
    paused = ok(await tenant.post(path(s, ":configure"), configure_body("1", paused=True, **same_timing)))["schedule"]
    assert (paused["paused"], paused["next_trigger_at"], paused["last_trigger_at"]) == \
        (True, wire(cursor.replace(tzinfo=timezone.utc)), wire(last.replace(tzinfo=timezone.utc)))
    stored = await row(db, s["id"])
    assert (stored["due_at"], stored["next_trigger_at"], stored["anchor_at"]) == \
        (None, cursor, naive(s["created_at"]))
    # Resuming (and changing anything but the timing) brings the same cursor back.
    resumed = ok(await tenant.post(path(s, ":configure"), configure_body(
        "2", **same_timing, overlap="skip", task={"payload": "new"})))["schedule"]
    assert (resumed["paused"], resumed["next_trigger_at"]) == (False, paused["next_trigger_at"])
    assert (await row(db, s["id"]))["due_at"] == cursor

    # A new interval restarts from the configure: one interval after it, the anchor moved there.
    moved = ok(await tenant.post(path(s, ":configure"), configure_body(
        "3", cron=None, interval_seconds=7200, timezone="UTC", task={"payload": "new"})))["schedule"]
    assert ts(moved["next_trigger_at"]) == ts(moved["updated_at"]) + timedelta(hours=2)
    assert moved["last_trigger_at"] == resumed["last_trigger_at"]
    stored = await row(db, s["id"])
    assert stored["anchor_at"] == naive(moved["updated_at"]) and stored["due_at"] == naive(moved["next_trigger_at"])

    # A new cron: its first point strictly after the configure; paused, so not due.
    cron = ok(await tenant.post(path(s, ":configure"), configure_body(
        "4", paused=True, cron="0 */6 * * *", timezone="UTC", task={"payload": "new"})))["schedule"]
    updated, point = ts(cron["updated_at"]), ts(cron["next_trigger_at"])
    assert updated < point <= updated + timedelta(hours=6) and point.hour % 6 == 0 and point.minute == 0
    assert (await row(db, s["id"]))["due_at"] is None

    # A future start_at on an interval is its first point; an end_at before any point ends it.
    start = (datetime.now(timezone.utc) + timedelta(days=2)).replace(microsecond=0)
    bounded = ok(await tenant.post(path(s, ":configure"), configure_body(
        "5", cron=None, interval_seconds=600, start_at=wire(start), task={"payload": "new"})))["schedule"]
    assert bounded["next_trigger_at"] == bounded["start_at"] == wire(start)
    assert (await row(db, s["id"]))["anchor_at"] == start.replace(tzinfo=None)
    ended = ok(await tenant.post(path(s, ":configure"), configure_body(
        "6", end_at=wire(datetime.now(timezone.utc) - timedelta(minutes=1)), task={"payload": "new"})))["schedule"]
    assert ended["next_trigger_at"] is None and (await row(db, s["id"]))["due_at"] is None


async def test_configure_with_a_stale_revision_is_a_state_conflict(tenant, db):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    ok(await tenant.post(path(s, ":configure"), configure_body("1")))
    before = await state(db, tenant.namespace_id)
    for rev in ("1", "3", "18446744073709551615"):
        key = tenant.key()
        err = assert_error(await tenant.post(path(s, ":configure"), configure_body(rev), key=key), 409,
                           "STATE_CONFLICT")
        assert err["details"] == {"current_revision": "2"}, err
        assert await idempotency_count(db, tenant.namespace_id, key) == 0
    assert await state(db, tenant.namespace_id) == before
    assert ok(await tenant.post(path(s, ":configure"), configure_body("2"), key=key))["schedule"]["revision"] == "3"


async def test_configure_body_rules(tenant, db):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    target = path(s, ":configure")
    cases: list[tuple[Any, str | None]] = [({}, None)]
    for field in ("expected_revision", "reason", "paused", "task"):
        body = configure_body("1")
        del body[field]
        cases.append((body, field))
    cases += [(configure_body("1", paused=v), "paused") for v in (None, "true", 1)]
    cases += [(configure_body(v), "expected_revision") for v in ("0", "01", 1, None, "18446744073709551616", "x")]
    cases += [(configure_body("1", reason=v), "reason") for v in ("", "  \n", None, 7, "x" * 1025)]
    cases += [(configure_body("1") | {f: v}, f) for f, v in (("name", "other"), ("queue_id", queue["id"]),
                                                             ("revision", "1"), ("next_trigger_at", None))]
    for body, field in _invalid_settings(queue["id"]):
        fields = {k: v for k, v in body.items() if k not in ("name", "queue_id")}
        cases.append(({"expected_revision": "1", "reason": "r", "paused": False, **fields}, field))
    cases.append((configure_body("1", task={"payload": 1, "resource_keys": ["no-such-key"]}), "task.resource_keys"))
    await rejected(tenant, db, target, cases)
    assert ok(await tenant.post(target, configure_body("1", reason="é" * 1024)))["schedule"]["revision"] == "2"


# ---------------------------------------------------------------- retire


async def test_retire_lifecycle(tenant, db):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    configure_key = tenant.key()
    configured = ok(await tenant.post(path(s, ":configure"), configure_body("1"), key=configure_key))
    key = tenant.key()
    r = await tenant.post(path(s, ":retire"), retire_body("2"), key=key)
    data = ok(r)
    assert set(data) == {"deduplicated", "schedule"} and data["deduplicated"] is False
    retired = data["schedule"]
    assert_schedule_object(retired)
    assert retired["revision"] == "3" and retired["retired_at"] is not None
    assert retired["updated_at"] == retired["retired_at"] >= s["created_at"]
    for field in FIELDS - {"revision", "retired_at", "updated_at"}:
        assert retired[field] == configured["schedule"][field], field
    stored = await row(db, s["id"])
    assert stored["due_at"] is None and stored["next_trigger_at"] == naive(retired["next_trigger_at"])

    (audit,) = [a for a in await audit_rows(db, s["id"]) if a["action"] == "schedule.retire"]
    assert (audit["reason"], audit["idempotency_key"], audit["request_id"]) == \
        ("report discontinued", key, r.headers["x-request-id"])
    assert orjson.loads(audit["before"]) == configured["schedule"] and orjson.loads(audit["after"]) == retired
    event = (await event_rows(db, s["id"]))[-1]
    assert event["type"] == "schedule.retired"
    assert orjson.loads(event["data"]) == {"schedule": retired, "reason": "report discontinued"}

    # Still readable; it keeps its name and takes no change.
    assert ok(await tenant.get(path(s))) == retired
    before = await state(db, tenant.namespace_id)
    assert_error(await tenant.post(BASE, create_body(queue, s["name"])), 409, "STATE_CONFLICT")
    err = assert_error(await tenant.post(path(s, ":configure"), configure_body("3")), 409, "STATE_CONFLICT")
    assert err["details"] == {"retired_at": retired["retired_at"]}
    assert_error(await tenant.post(path(s, ":retire"), retire_body("3")), 409, "STATE_CONFLICT")
    assert await state(db, tenant.namespace_id) == before

    # Replays answer with their original snapshots and change nothing; other content conflicts.
    assert ok(await tenant.post(path(s, ":retire"), retire_body("2"), key=key)) == \
        {"deduplicated": True, "schedule": retired}
    replayed = ok(await tenant.post(path(s, ":configure"), configure_body("1"), key=configure_key))
    assert replayed == {"deduplicated": True, "schedule": configured["schedule"]}
    assert_error(await tenant.post(path(s, ":retire"), retire_body("2", reason="other"), key=key), 409,
                 "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before


async def test_retire_with_a_stale_revision_and_body_rules(tenant, db):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    before = await state(db, tenant.namespace_id)
    for rev in ("2", "18446744073709551615"):
        err = assert_error(await tenant.post(path(s, ":retire"), retire_body(rev)), 409, "STATE_CONFLICT")
        assert err["details"] == {"current_revision": "1"}
    assert await state(db, tenant.namespace_id) == before
    cases: list[tuple[Any, str | None]] = [
        ({}, None), ({"reason": "x"}, "expected_revision"), ({"expected_revision": "1"}, "reason"),
        (retire_body("1", reason="  "), "reason"), (retire_body("1", reason="x" * 1025), "reason"),
        (retire_body("0"), "expected_revision"), (retire_body(1), "expected_revision"),
        (retire_body("1", paused=True), "paused"), (retire_body("1", retired_at=None), "retired_at"),
    ]
    await rejected(tenant, db, path(s, ":retire"), cases)


async def test_concurrent_retires_of_one_schedule_retire_it_once(tenant, db):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    answers = await asyncio.gather(*[tenant.post(path(s, ":retire"), retire_body("1")) for _ in range(4)])
    assert sorted(r.status_code for r in answers) == [200, 409, 409, 409]
    assert [a["action"] for a in await audit_rows(db, s["id"])] == ["schedule.create", "schedule.retire"]


async def test_a_live_schedule_keeps_its_queue_from_retiring(tenant, db):
    queue = await tenant.create_queue()
    first = await create(tenant, queue)
    second = await create(tenant, queue, paused=True)
    retire_queue = f"/v1/queues/{queue['id']}:retire"
    key = tenant.key()
    before = await state(db, tenant.namespace_id)
    err = assert_error(await tenant.post(retire_queue, {"expected_revision": "1", "reason": "gone"}, key=key), 409,
                       "STATE_CONFLICT")
    assert err["details"] == {"blocker": "schedule", "schedule_id": first["id"], "schedule_name": first["name"]}
    assert first["name"] in err["message"]
    assert await state(db, tenant.namespace_id) == before
    assert await idempotency_count(db, tenant.namespace_id, key) == 0

    ok(await tenant.post(path(first, ":retire"), retire_body("1")))
    err = assert_error(await tenant.post(retire_queue, {"expected_revision": "1", "reason": "gone"}, key=key), 409,
                       "STATE_CONFLICT")
    assert err["details"]["schedule_id"] == second["id"]  # a paused schedule still targets the queue
    ok(await tenant.post(path(second, ":retire"), retire_body("1")))
    retired = ok(await tenant.post(retire_queue, {"expected_revision": "1", "reason": "gone"}, key=key))["queue"]
    assert retired["retired_at"] is not None
    # The schedules stay readable; no new schedule targets the retired queue.
    assert ok(await tenant.get(path(first)))["retired_at"] is not None
    assert_error(await tenant.post(BASE, create_body(queue)), 409, "STATE_CONFLICT")


async def test_a_schedule_created_while_its_queue_retires_is_seen_by_one_of_them(tenant, db):
    """The create share-locks the queue row that the retire locks: either the schedule exists and
    blocks the retire, or the queue is retired and refuses the schedule."""
    for _ in range(4):
        queue = await tenant.create_queue()
        created, retired = await asyncio.gather(
            tenant.post(BASE, create_body(queue)),
            tenant.post(f"/v1/queues/{queue['id']}:retire", {"expected_revision": "1", "reason": "gone"}))
        assert (created.status_code, retired.status_code) in ((201, 409), (409, 200)), (created.text, retired.text)
        if created.status_code == 201:
            assert envelope(retired)["error"]["details"]["blocker"] == "schedule"
            ok(await tenant.post(path(ok(created, 201)["schedule"], ":retire"), retire_body("1")))


async def test_concurrent_creates_of_one_name_create_it_once(tenant, db):
    queue = await tenant.create_queue()
    name = unique_name("race")
    answers = await asyncio.gather(*[tenant.post(BASE, create_body(queue, name)) for _ in range(4)])
    assert sorted(r.status_code for r in answers) == [201, 409, 409, 409]
    assert [s["name"] for s in ok(await tenant.get(BASE))["items"]] == [name]


# ---------------------------------------------------------------- runs


async def add_runs(db, schedule_id: str, runs: list[dict[str, Any]]) -> None:
    """What the scheduler would record, one row per trigger point handled."""

    async def write(tx):
        await tx.execute(insert(schedule_runs), [{"schedule_id": schedule_id, **r} for r in runs])

    await db.core_transaction(write)


async def test_runs_are_listed_oldest_first_in_pages(tenant, db):
    queue = await tenant.create_queue()
    s = await create(tenant, queue)
    other = await create(tenant, queue)
    assert ok(await tenant.get(path(s, "/runs"))) == {"items": [], "next_cursor": None}
    t0 = datetime(2026, 3, 1, 2, 0, 0, 123456)
    handled = t0 + timedelta(hours=5)
    runs = [{"trigger_at": t0 + timedelta(hours=i), "outcome": "SUBMITTED" if i % 2 else "SKIPPED",
             "task_id": new_id() if i % 2 else None, "reason": None if i % 2 else ("MISFIRE", "OVERLAP")[i % 4 // 2],
             "created_at": handled} for i in (3, 0, 4, 1, 2)]
    await add_runs(db, s["id"], runs)
    await add_runs(db, other["id"], [{"trigger_at": t0, "outcome": "SUBMITTED", "task_id": new_id(), "reason": None,
                                      "created_at": handled}])
    expected = [{"trigger_at": wire(r["trigger_at"].replace(tzinfo=timezone.utc)), "outcome": r["outcome"],
                 "task_id": r["task_id"], "reason": r["reason"],
                 "created_at": wire(handled.replace(tzinfo=timezone.utc))}
                for r in sorted(runs, key=lambda r: r["trigger_at"])]
    assert ok(await tenant.get(path(s, "/runs"))) == {"items": expected, "next_cursor": None}
    for limit in (1, 2, 4, 5):
        items, cursor = [], None
        while True:
            page = ok(await tenant.get(path(s, "/runs"), params={"limit": limit, **({"cursor": cursor} if cursor
                                                                                  else {})}))
            assert len(page["items"]) <= limit
            items += page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert items == expected, limit
    assert len(ok(await tenant.get(path(other, "/runs")))["items"]) == 1
    # Retirement keeps the history readable.
    ok(await tenant.post(path(s, ":retire"), retire_body("1")))
    assert ok(await tenant.get(path(s, "/runs")))["items"] == expected


# ---------------------------------------------------------------- OpenAPI


ROUTES = {
    "/v1/schedules": ({"get", "post"}, "CreateScheduleRequest"),
    "/v1/schedules/{schedule_id}": ({"get"}, None),
    "/v1/schedules/{schedule_id}/runs": ({"get"}, None),
    "/v1/schedules/{schedule_id}:configure": ({"post"}, "ConfigureScheduleRequest"),
    "/v1/schedules/{schedule_id}:retire": ({"post"}, "RetireScheduleRequest"),
}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_openapi_describes_the_schedule_api(http):
    r = await http.get("/openapi.json")
    assert r.status_code == 200, r.text
    doc = r.json()
    schemas = doc["components"]["schemas"]
    for route, (methods, request) in ROUTES.items():
        assert methods <= set(doc["paths"][route]), route
        if request is None:
            continue
        op = doc["paths"][route]["post"]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{request}"}
        assert [p for p in op["parameters"] if p["name"] == "Idempotency-Key"][0]["required"] is True
        assert {"400", "401", "403", "404", "409"} <= set(op["responses"]) and "422" not in op["responses"]
        assert schemas[request]["additionalProperties"] is False
    assert set(schemas["CreateScheduleRequest"]["required"]) == {"name", "queue_id", "task"}
    assert set(schemas["ConfigureScheduleRequest"]["required"]) == {"expected_revision", "reason", "paused", "task"}
    assert set(schemas["ConfigureScheduleRequest"]["properties"]) == \
        set(schemas["CreateScheduleRequest"]["properties"]) - {"name", "queue_id"} | {"expected_revision", "reason"}
    window = schemas["MisfirePolicy"]["properties"]["catch_up_window_seconds"]
    assert window["anyOf"][1] == {"type": "null"}  # optional: null is the same as omitted
    assert (window["anyOf"][0]["minimum"], window["anyOf"][0]["maximum"]) == (0, 604_800)
    assert set(schemas["TaskTemplate"]["properties"]) == TASK_FIELDS
    assert set(schemas["Schedule"]["properties"]) == FIELDS
    assert set(schemas["ScheduleRun"]["properties"]) == {"trigger_at", "outcome", "task_id", "reason", "created_at"}
    assert "201" in doc["paths"]["/v1/schedules"]["post"]["responses"]


def _schedule_operations() -> list[Any]:
    """The schedule operations of the app's own document, built without touching a database."""
    unused = os.path.join(tempfile.gettempdir(), "orbit-openapi-never-opened.db")
    document = create_app(Settings(database_url=f"sqlite:///{unused}", background_loops=False)).openapi()
    ops = [r.ok() for r in schemathesis.openapi.from_dict(document).get_all_operations()]
    ops = [op for op in ops if op.path in ROUTES and op.method.lower() in ROUTES[op.path][0]]
    assert len(ops) == sum(len(m) for m, _ in ROUTES.values())
    return ops


SCHEDULE_OPERATIONS = _schedule_operations()


async def check_case(tenant, http, case, existing: bool, checks: list[Any], *, positive: bool = False) -> None:
    """Send a generated case, aimed at an existing schedule when `existing`; a positive create is
    then aimed at an existing queue, paused (a scheduler sharing the database must not find it
    due). The answer must match the document and carry the envelope."""
    if not hasattr(tenant, "fuzz_schedule"):
        tenant.fuzz_schedule = await create(tenant, await tenant.create_queue(), paused=True)
    negative = negative_parts(case)
    # A path id drawn to be invalid stays so: aiming it at the schedule would make the case valid.
    if existing and "path" not in negative and "schedule_id" in (case.path_parameters or {}):
        case.path_parameters["schedule_id"] = tenant.fuzz_schedule["id"]
    if existing and positive and isinstance(case.body, dict) and "queue_id" in case.body:
        case.body.update(queue_id=tenant.fuzz_schedule["queue_id"], paused=True)
    r = await send(http, case, tenant.token)
    checks = checks_after_send(case, negative, checks)
    try:
        case.validate_response(r, checks=checks)
    except BaseExceptionGroup as failures:
        raise AssertionError(str(failures)) from None
    if r.status_code < 300:
        ok(r, r.status_code)
    else:
        envelope(r)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@FUZZ
@given(drawn=cases(GenerationMode.POSITIVE, SCHEDULE_OPERATIONS))
async def test_schemathesis_positive(tenant, http, drawn):
    await check_case(tenant, http, *drawn, CHECKS, positive=True)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@FUZZ
@given(drawn=cases(GenerationMode.NEGATIVE, SCHEDULE_OPERATIONS))
async def test_schemathesis_negative(tenant, http, drawn):
    await check_case(tenant, http, *drawn, [*CHECKS, negative_data_rejection])


# ---------------------------------------------------------------- SDK


def new_key() -> str:
    return f"sdk-{uuid.uuid4().hex}"


async def test_sdk_async_client_round_trip(tenant, app, db):
    queue = await tenant.create_queue()
    await resource_key(tenant, "sdk-db")
    async with AsyncClient("http://orbit.test", token=tenant.token, transport=httpx.ASGITransport(app=app)) as c:
        key = new_key()
        request = CreateScheduleRequest(
            name=unique_name("sdk"), queue_id=queue["id"], cron="0 4 * * *", timezone="Europe/Berlin",
            misfire=MisfirePolicy(policy="latest", catch_up_window_seconds=3600),
            task=TaskTemplate(payload={"n": 1}, priority=7, resource_keys=["sdk-db"], deadline_seconds=600))
        created = await c.create_schedule(key, request)
        s = created.schedule
        assert created.deduplicated is False and isinstance(s, Schedule)
        assert (s.name, s.queue_id, s.cron, s.interval_seconds, s.timezone, s.revision) == \
            (request.name, queue["id"], "0 4 * * *", None, "Europe/Berlin", 1)
        assert s.misfire == MisfirePolicy(policy="latest", catch_up_window_seconds=3600)
        assert (s.task.payload, s.task.priority, s.task.resource_keys, s.task.retry.max_backoff_ms) == \
            ({"n": 1}, 7, ["sdk-db"], 60000)
        assert s.next_trigger_at.tzinfo is not None and s.next_trigger_at > s.created_at and s.retired_at is None
        assert (await c.create_schedule(key, request)).deduplicated is True
        with pytest.raises(APIError) as exc:
            await c.create_schedule(new_key(), {"name": request.name, "queue_id": queue["id"],
                                                "interval_seconds": DAY, "task": {"payload": 1}})
        assert (exc.value.status_code, exc.value.code) == (409, "STATE_CONFLICT")
        assert await c.get_schedule(s.id) == s

        others = [(await c.create_schedule(new_key(), {"name": unique_name("sdk"), "queue_id": queue["id"],
                                                       "interval_seconds": DAY, "task": {"payload": i}})).schedule
                  for i in range(2)]
        assert [x.id async for x in c.list_schedules(page_size=1)] == [s.id] + [o.id for o in others]
        assert [x.id async for x in c.list_schedules(queue_id=queue["id"], name=others[1].name)] == [others[1].id]
        assert [x.id async for x in c.list_schedules(queue_id=new_id())] == []
        page = await c.list_schedules_page(page_size=2)
        assert [x.id for x in page.items] == [s.id, others[0].id] and page.next_cursor

        # A configure built from the schedule read back: its task template goes back as it is.
        ckey = new_key()
        fields = ConfigureScheduleRequest(expected_revision=s.revision, reason="pause it", paused=True, cron=s.cron,
                                          timezone=s.timezone, misfire=s.misfire, overlap="skip", task=s.task)
        configured = await c.configure_schedule(s.id, ckey, fields)
        assert (configured.deduplicated, configured.schedule.revision, configured.schedule.paused) == (False, 2, True)
        assert configured.schedule.task == s.task and configured.schedule.next_trigger_at == s.next_trigger_at
        again = await c.configure_schedule(s.id, ckey, fields.model_dump(exclude_unset=True))
        assert again.deduplicated is True and again.schedule == configured.schedule
        with pytest.raises(APIError) as exc:
            await c.configure_schedule(s.id, new_key(), fields)
        assert (exc.value.code, exc.value.details) == ("STATE_CONFLICT", {"current_revision": "2"})

        await add_runs(db, s.id, [{"trigger_at": datetime(2026, 1, 1, 3, i), "outcome": "SUBMITTED",
                                   "task_id": new_id(), "reason": None, "created_at": datetime(2026, 1, 1, 3, 9)}
                                  for i in range(3)])
        runs = [r async for r in c.list_schedule_runs(s.id, page_size=2)]
        assert [r.trigger_at for r in runs] == [datetime(2026, 1, 1, 3, i, tzinfo=timezone.utc) for i in range(3)]
        assert runs[0].outcome == "SUBMITTED" and runs[0].reason is None and runs[0].task_id
        page = await c.list_schedule_runs_page(s.id, page_size=2)
        assert len(page.items) == 2 and page.next_cursor
        assert (await c.list_schedule_runs_page(s.id, cursor=page.next_cursor)).items == runs[2:]

        retired = await c.retire_schedule(s.id, new_key(), 2, "done")
        assert retired.schedule.revision == 3 and retired.schedule.retired_at.tzinfo is not None
        assert [x.id async for x in c.list_schedules()] == [o.id for o in others]
        assert [x.id async for x in c.list_schedules(include_retired=True)][0] == s.id
        for o in others:
            await c.retire_schedule(o.id, new_key(), o.revision, "done")
        with pytest.raises(APIError) as exc:
            await c.get_schedule(new_id())
        assert (exc.value.status_code, exc.value.code) == (404, "NOT_FOUND")
        with pytest.raises(ValueError):
            await c.get_schedule("not/an id")
        with pytest.raises(ValueError):
            c.list_schedules(page_size=0)
        with pytest.raises(ValueError):
            c.list_schedule_runs(s.id, page_size=1001)


def sync_scenario(base: str, token: str, queue_id: str) -> None:
    with Client(base, token=token) as c:
        name = unique_name("sync")
        key = new_key()
        s = c.create_schedule(key, CreateScheduleRequest(name=name, queue_id=queue_id, interval_seconds=DAY,
                                                         task=TaskTemplate(payload=[1]))).schedule
        assert c.create_schedule(key, {"name": name, "queue_id": queue_id, "interval_seconds": DAY,
                                       "task": {"payload": [1]}}).deduplicated is True
        assert c.get_schedule(s.id) == s and s.interval_seconds == DAY and s.task.payload == [1]
        assert [x.id for x in c.list_schedules(queue_id=queue_id)] == [s.id]
        assert c.list_schedules_page(page_size=1).items == [s]
        assert list(c.list_schedule_runs(s.id)) == [] and c.list_schedule_runs_page(s.id).items == []
        configured = c.configure_schedule(s.id, new_key(), {
            "expected_revision": s.revision, "reason": "hourly", "paused": False, "interval_seconds": 3600,
            "task": {"payload": [2]}}).schedule
        assert (configured.interval_seconds, configured.revision, configured.task.payload) == (3600, 2, [2])
        with pytest.raises(APIError) as exc:
            c.retire_schedule(s.id, new_key(), 1, "stale")
        assert (exc.value.status_code, exc.value.code) == (409, "STATE_CONFLICT")
        retired = c.retire_schedule(s.id, new_key(), configured.revision, "all done").schedule
        assert retired.retired_at is not None and c.get_schedule(s.id).retired_at == retired.retired_at
        assert list(c.list_schedules()) == []
        assert [x.id for x in c.list_schedules(include_retired=True)] == [s.id]


async def test_sdk_sync_client_against_a_real_server(app, tenant):
    queue = await tenant.create_queue()
    async with serve(app) as base:
        await asyncio.to_thread(sync_scenario, base, tenant.token, queue["id"])


async def test_a_template_names_live_keys_of_the_namespace(tenant, db, http):
    """The names are kept as given; a key the template names is not retired under it, and a
    configure refuses a retired key or one of another namespace."""
    queue = await tenant.create_queue()
    a, b, c = await resource_key(tenant), await resource_key(tenant), await resource_key(tenant)
    s = await create(tenant, queue, task={"payload": 1, "resource_keys": [b["name"], a["name"]]})
    assert s["task"]["resource_keys"] == [b["name"], a["name"]]
    other = await make_tenant(db, http)
    foreign = await resource_key(other)
    err = assert_error(await tenant.post(f"/v1/resource-keys/{a['id']}:retire",
                                         {"expected_revision": "1", "reason": "x"}), 409, "STATE_CONFLICT")
    assert err["details"]["schedule_id"] == s["id"]
    ok(await tenant.post(f"/v1/resource-keys/{c['id']}:retire", {"expected_revision": "1", "reason": "x"}))
    for names, word in (([c["name"]], "retired"), ([foreign["name"]], "unknown")):
        err = assert_error(await tenant.post(path(s, ":configure"), configure_body(
            "1", task={"payload": 1, "resource_keys": names})), 400, "INVALID_ARGUMENT", "task.resource_keys")
        assert word in err["message"]
    assert ok(await tenant.get(path(s))) == s
