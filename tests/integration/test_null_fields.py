"""One rule for `null`: an optional field given as null is the same as omitting it (it takes its
default) and is digested as omitted, so the same key with null and without the field is a replay,
not IDEMPOTENCY_CONFLICT. A required field given as null is refused (configure's `paused` must be
explicit). Every optional field of every body, nested ones and batch items included: the fields
come from the models, so a new one is covered."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from orbit import models
from orbit.server.services import dispatch

from .queue_helpers import assert_error, ok
from .worker_client import Worker, serve

pytestmark = pytest.mark.anyio

Make = Callable[[], Awaitable[tuple[str, dict[str, Any]]]]


def optional_paths(model: type[models.StrictRequest], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every optional field of a body, as a path (nested request objects followed)."""
    out = []
    for name, field in model.model_fields.items():
        inner = model.nested(name)
        if not field.is_required():
            out.append((*prefix, name))
        if inner is not None and model is not models.BatchSubmitRequest:
            out.extend(optional_paths(inner, (*prefix, name)))
    return out


def required_paths(model: type[models.StrictRequest]) -> list[str]:
    return [name for name, field in model.model_fields.items() if field.is_required()]


def with_value(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """`body` with `path` set to `value` (None: null) or, with `value` ..., removed."""
    out = copy.deepcopy(body)
    node = out
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[int(part)]
    if value is ...:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return out


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


POLICY = ("priority", "max_attempts", "retry", "on_lease_lost", "resource_keys", "start_deadline_at",
          "deadline_at", "state")
SCHEDULE = ("paused", "cron", "interval_seconds", "timezone", "start_at", "end_at", "misfire", "overlap", "task")


def compared(data: dict[str, Any]) -> dict[str, Any]:
    """What a null must leave as its default: the resource's settings, not its identity or times."""
    (kind, obj), = [(k, v) for k, v in data.items() if k != "deduplicated"]
    keep = {"queue": ("paused", "max_concurrency", "rate_per_second", "max_unfinished_tasks"),
            "task": POLICY, "schedule": SCHEDULE}[kind]
    return {k: obj[k] for k in keep}


async def null_is_omitted(tenant, make: Make, path: tuple[str, ...], created: int) -> None:
    """Null, then the same key without the field: a replay of the original. And the defaults a null
    leaves are those an omission leaves (on a fresh resource: a second request of each)."""
    label = ".".join(path)
    url, body = await make()
    omitted_url, omitted = await make()
    r = await tenant.post(omitted_url, with_value(omitted, path, ...))
    if r.status_code >= 400:  # omitting it is refused (e.g. neither cron nor interval): so is null
        err = r.json()["error"]
        null = assert_error(await tenant.post(url, with_value(body, path, None)), r.status_code, err["code"])
        assert null["message"] == err["message"], (label, null, err)
        return
    expected = compared(ok(r, created))
    key = tenant.key()
    first = ok(await tenant.post(url, with_value(body, path, None), key=key), created)
    assert compared(first) == expected, (label, compared(first), expected)
    replay = ok(await tenant.post(url, with_value(body, path, ...), key=key), 200)
    assert replay["deduplicated"] is True, label
    assert {k: v for k, v in replay.items() if k != "deduplicated"} == \
        {k: v for k, v in first.items() if k != "deduplicated"}, label
    # And the other way round: omitted first, null replays it.
    url, body = await make()
    key = tenant.key()
    ok(await tenant.post(url, with_value(body, path, ...), key=key), created)
    assert ok(await tenant.post(url, with_value(body, path, None), key=key), 200)["deduplicated"] is True, label


async def routes(tenant) -> dict[str, tuple[type[models.StrictRequest], Make, int]]:
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=100)

    async def queue():
        return "/v1/queues", {"name": unique("q"), "max_concurrency": 2, "rate_per_second": 5}

    async def submit():
        return f"/v1/queues/{q['id']}/tasks", {"payload": {"n": 1}, "retry": {}}

    async def schedule():
        return "/v1/schedules", {"name": unique("s"), "queue_id": q["id"], "interval_seconds": 3600,
                                 "paused": True, "misfire": {}, "task": {"payload": 1, "retry": {}}}

    async def configure_schedule():
        s = ok(await tenant.post("/v1/schedules", {"name": unique("s"), "queue_id": q["id"], "cron": "0 4 * * *",
                                                   "paused": True, "task": {"payload": 0}}), 201)["schedule"]
        return f"/v1/schedules/{s['id']}:configure", {
            "expected_revision": "1", "reason": "r", "paused": True, "interval_seconds": 3600, "misfire": {},
            "task": {"payload": 1, "retry": {}}}

    return {
        "queue": (models.CreateQueueRequest, queue, 201),
        "submit": (models.SubmitTaskRequest, submit, 201),
        "schedule": (models.CreateScheduleRequest, schedule, 201),
        "configure_schedule": (models.ConfigureScheduleRequest, configure_schedule, 200),
    }


@pytest.mark.parametrize("route", ["queue", "submit", "schedule", "configure_schedule"])
async def test_an_optional_field_given_as_null_is_omitted(tenant, route):
    model, make, created = (await routes(tenant))[route]
    paths = optional_paths(model)
    assert paths, model
    for path in paths:
        await null_is_omitted(tenant, make, path, created)


async def test_the_cron_or_interval_left_null_is_the_one_not_given(tenant):
    """`cron` null beside an interval is no cron; both null is neither, refused like both omitted."""
    q = await tenant.create_queue()

    async def by_cron():
        return "/v1/schedules", {"name": unique("s"), "queue_id": q["id"], "cron": "0 4 * * *", "paused": True,
                                 "task": {"payload": 1}}

    await null_is_omitted(tenant, by_cron, ("interval_seconds",), 201)
    await null_is_omitted(tenant, by_cron, ("cron",), 201)  # neither: 400 both ways


async def test_a_batch_item_field_given_as_null_is_omitted(tenant):
    """Item by item (its own key) and for the whole batch (the request's key)."""
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=100)
    url = f"/v1/queues/{q['id']}/tasks:batch"
    for path in optional_paths(models.SubmitTaskRequest):
        item = {"idempotency_key": unique("item"), "payload": 1, "retry": {}}
        batch_key = tenant.key()
        first = ok(await tenant.post(url, {"tasks": [with_value(item, path, None)]}, key=batch_key))
        assert first["results"][0].get("deduplicated") is False, (path, first)
        replay = ok(await tenant.post(url, {"tasks": [with_value(item, path, ...)]}, key=batch_key))
        assert replay["deduplicated"] is True and replay["results"] == first["results"], path
        again = ok(await tenant.post(url, {"tasks": [with_value(item, path, ...)]}))  # a new batch, same item
        assert again["results"][0]["deduplicated"] is True, (path, again)
        assert again["results"][0]["task"]["id"] == first["results"][0]["task"]["id"]
        # The same item submitted alone is the same task.
        single = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", with_value(
            {k: v for k, v in item.items() if k != "idempotency_key"}, path, None), key=item["idempotency_key"]))
        assert single["deduplicated"] is True and single["task"]["id"] == first["results"][0]["task"]["id"]


async def test_review_evidence_given_as_null_is_omitted(tenant, db, app):
    q = await tenant.create_queue()
    tasks = [ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": i, "max_attempts": 2}), 201)["task"]
             for i in range(2)]
    async with serve(app) as base:
        async with Worker.connect(base, tenant.token) as w:
            await w.hello(q["id"])
            leases = (await w.call("claim", queue_id=q["id"], max_tasks=2, lease_ms=1000))["tasks"]
            for lease in leases:
                assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        await asyncio.sleep(1.1)  # the leases of the RUNNING attempts expire: NEEDS_REVIEW
        for _ in range(20):
            if await dispatch.recover_expired_leases(db) == 0:
                break
        body = {"resolution": "FAILED", "reason": "checked the ledger"}
        key = tenant.key()
        first = ok(await tenant.post(f"/v1/tasks/{tasks[0]['id']}:review", {**body, "evidence": None}, key=key))
        replay = ok(await tenant.post(f"/v1/tasks/{tasks[0]['id']}:review", body, key=key))
        assert replay["deduplicated"] is True and replay["task"] == first["task"]
        omitted = ok(await tenant.post(f"/v1/tasks/{tasks[1]['id']}:review", body))
        assert first["task"]["state"] == omitted["task"]["state"] == "FAILED"


NULL_REFUSED = {
    "/v1/queues": ({"name": "q-null", "max_concurrency": 1, "rate_per_second": 1}, models.CreateQueueRequest),
    "/v1/queues/{queue}:configure": ({"expected_revision": "1", "reason": "r", "paused": False, "max_concurrency": 1,
                                      "rate_per_second": 1, "max_unfinished_tasks": 1}, models.ConfigureQueueRequest),
    "/v1/queues/{queue}:retire": ({"expected_revision": "1", "reason": "r"}, models.RetireQueueRequest),
    "/v1/queues/{queue}/tasks": ({"payload": 1}, models.SubmitTaskRequest),
    "/v1/applications/{application}:configure": (
        {"expected_revision": "1", "reason": "r", "paused": False, "max_concurrency": 1, "rate_per_second": 1,
         "max_unfinished_tasks": 1}, models.ConfigureApplicationRequest),
    "/v1/resource-keys": ({"name": "k-null", "max_concurrency": 1}, models.CreateResourceKeyRequest),
    "/v1/schedules/{schedule}:configure": ({"expected_revision": "1", "reason": "r", "paused": False,
                                            "interval_seconds": 60, "task": {"payload": 1}},
                                           models.ConfigureScheduleRequest),
    "/v1/tasks/{task}:cancel": ({"reason": "r"}, models.CancelTaskRequest),
}


async def test_a_required_field_given_as_null_is_refused(tenant):
    q = await tenant.create_queue()
    ids = {"queue": q["id"], "application": tenant.application["id"], "schedule": "0" * 32, "task": "0" * 32}
    for template, (body, model) in NULL_REFUSED.items():
        url = template.format(**ids)
        for name in required_paths(model):
            err = assert_error(await tenant.post(url, {**body, name: None}), 400, "INVALID_ARGUMENT", name)
            assert err["message"] == f"{name}: must not be null", (url, err)
    task = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1, "retry": {"jitter": None},
                                                                 "on_lease_lost": None}), 201)["task"]
    assert (task["retry"]["jitter"], task["on_lease_lost"]) == (0.2, "review")
