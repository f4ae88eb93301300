"""An unknown field is reported first and by name, whatever else is wrong with the body: a
misspelt field is why its correct spelling is then missing (`{"max_concurency": 8}` used to
answer "max_concurrency: is required"). Every body of every route, nested objects and batch
items included."""

from __future__ import annotations

import re

import pytest

from orbit import models
from orbit.server.errors import describe_validation_error

from .queue_helpers import assert_error, state

pytestmark = pytest.mark.anyio

ID = "0" * 32


async def body_routes(http) -> list[str]:
    doc = (await http.get("/openapi.json")).json()
    return [path for path, ops in doc["paths"].items() if "requestBody" in ops.get("post", {})]


def concrete(path: str) -> str:
    return re.sub(r"{[a-z_]+}", ID, path)


async def test_every_body_names_its_unknown_field_first(tenant, db):
    paths = await body_routes(tenant.http)
    assert len(paths) >= 13, paths
    before = await state(db, tenant.namespace_id)
    for path in paths:
        for body in ({"zz_unknown": 1}, {"zz_unknown": None}, {"zz_unknown": {"a": [1]}}):
            r = await tenant.post(concrete(path), body)
            try:
                err = assert_error(r, 400, "INVALID_ARGUMENT", "zz_unknown")
            except AssertionError as exc:
                raise AssertionError(f"{path} {body}: {exc}") from None
            assert err["message"].startswith("zz_unknown: "), err
    assert await state(db, tenant.namespace_id) == before


async def test_a_misspelt_field_is_named_not_its_missing_spelling(tenant):
    q = await tenant.create_queue()
    cases = [
        ("/v1/queues", {"name": "q-typo", "max_concurency": 8, "rate_per_second": 1}, "max_concurency"),
        (f"/v1/queues/{q['id']}:configure", {"expected_revision": "1", "reason": "r", "pasued": False,
                                             "max_concurrency": 1, "rate_per_second": 1,
                                             "max_unfinished_tasks": 1}, "pasued"),
        (f"/v1/queues/{q['id']}/tasks", {"payload": 1, "retry": {"initial_backof_ms": 5}}, "retry.initial_backof_ms"),
        (f"/v1/queues/{q['id']}/tasks", {"paylaod": 1}, "paylaod"),
        ("/v1/schedules", {"name": "s-typo", "queue_id": q["id"], "interval_seconds": 60,
                           "task": {"payload": 1, "priorty": 3}, "misfire": {"policy": "never"}}, "task.priorty"),
        ("/v1/resource-keys", {"nmae": "k", "max_concurrency": 1}, "nmae"),
    ]
    for path, body, field in cases:
        err = assert_error(await tenant.post(path, body), 400, "INVALID_ARGUMENT", field)
        assert err["message"].startswith(f"{field}: is not a known field"), (path, err)


async def test_a_batch_item_names_its_unknown_field(tenant):
    q = await tenant.create_queue()
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks:batch",
                          {"tasks": [{"idempotency_key": "a", "payload": 1, "priorty": "x"},
                                     {"idempotency_key": "b", "max_atempts": 2}]})
    results = r.json()["data"]["results"]
    assert results[0]["error"]["message"].startswith("tasks[0].priorty: is not a known field"), results[0]
    assert results[1]["error"]["message"].startswith("tasks[1].max_atempts: is not a known field"), results[1]


def test_every_request_model_reports_an_unknown_field_first():
    strict = [m for m in vars(models).values()
              if isinstance(m, type) and issubclass(m, models.StrictRequest) and m is not models.StrictRequest]
    assert len(strict) >= 15
    for model in strict:
        with pytest.raises(Exception) as raised:
            model.model_validate({"zz": 1, **{f: None for f in model.model_fields}}, context={"wire": True})
        err = describe_validation_error(raised.value)
        assert err.details == {"field": "zz"}, (model.__name__, err.message)
