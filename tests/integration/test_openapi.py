"""/openapi.json: a valid OpenAPI 3.1 document describing the queue API, and a bounded
schemathesis run of the in-process app against it (no 5xx, documented statuses,
content types and response schemas)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from orbit.server.app import create_app
from orbit.server.config import Settings

from .queue_helpers import envelope, ok

pytestmark = pytest.mark.anyio

QUEUE_ROUTES = {
    "/v1/queues": {"get", "post"},
    "/v1/queues/{queue_id}": {"get"},
    "/v1/queues/{queue_id}:configure": {"post"},
    "/v1/queues/{queue_id}:retire": {"post"},
    "/healthz": {"get"},
    "/readyz": {"get"},
}
REQUEST_SCHEMAS = {
    "/v1/queues": "CreateQueueRequest",
    "/v1/queues/{queue_id}:configure": "ConfigureQueueRequest",
    "/v1/queues/{queue_id}:retire": "RetireQueueRequest",
}


async def fetch_openapi(http) -> dict[str, Any]:
    r = await http.get("/openapi.json")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    return r.json()


# The document does not depend on the database: check it once.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_openapi_is_valid_3_1(http):
    validator = pytest.importorskip("openapi_spec_validator")
    doc = await fetch_openapi(http)
    assert doc["openapi"].startswith("3.1")
    validator.validate(doc)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_openapi_describes_the_queue_api(http):
    doc = await fetch_openapi(http)
    paths = doc["paths"]
    for path, methods in QUEUE_ROUTES.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, set(paths[path]))
    schemas = doc["components"]["schemas"]
    for path, name in REQUEST_SCHEMAS.items():
        op = paths[path]["post"]
        body = op["requestBody"]
        assert body["required"] is True
        assert body["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{name}"}
        key = [p for p in op.get("parameters", []) if p["name"] == "Idempotency-Key"]
        assert key and key[0]["in"] == "header" and key[0]["required"] is True
        assert {"400", "401", "403", "409", "413", "415"} <= set(op["responses"])
        assert "422" not in op["responses"]
        assert name in schemas
        assert schemas[name].get("additionalProperties") is False, name
    assert set(schemas["CreateQueueRequest"]["required"]) == {"name", "max_concurrency", "rate_per_second"}
    assert set(schemas["CreateQueueRequest"]["properties"]) == {
        "name", "max_concurrency", "rate_per_second", "max_unfinished_tasks",
    }
    assert set(schemas["ConfigureQueueRequest"]["required"]) == {
        "expected_revision", "reason", "paused", "max_concurrency", "rate_per_second", "max_unfinished_tasks",
    }
    assert set(schemas["RetireQueueRequest"]["required"]) == {"expected_revision", "reason"}
    create = schemas["CreateQueueRequest"]["properties"]
    assert (create["max_concurrency"]["minimum"], create["max_concurrency"]["maximum"]) == (1, 100_000)
    assert (create["rate_per_second"]["minimum"], create["rate_per_second"]["maximum"]) == (1, 1_000_000)
    configure = schemas["ConfigureQueueRequest"]["properties"]
    assert configure["max_unfinished_tasks"]["minimum"] == 1
    assert configure["expected_revision"]["type"] == "string"
    assert "HTTPValidationError" not in schemas
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "201" in paths["/v1/queues"]["post"]["responses"]


def _operations() -> list[Any]:
    """The queue operations of the app's own document, built without touching a database."""
    unused = os.path.join(tempfile.gettempdir(), "orbit-openapi-never-opened.db")
    document = create_app(Settings(database_url=f"sqlite:///{unused}", background_loops=False)).openapi()
    schema = schemathesis.openapi.from_dict(document)
    ops = []
    for result in schema.get_all_operations():
        op = result.ok()
        if op.path in QUEUE_ROUTES and op.method.lower() in QUEUE_ROUTES[op.path]:
            ops.append(op)
    assert len(ops) == sum(len(m) for m in QUEUE_ROUTES.values())
    return ops


OPERATIONS = _operations()


def cases(mode: GenerationMode, ops: list[Any]):
    """A generated case plus whether to aim it at an existing queue.

    Drawn by `@given` outside the coroutine: a draw inside an anyio test that overruns
    raises hypothesis' StopTest through the anyio runner and breaks it."""
    return st.tuples(st.one_of([op.as_strategy(generation_mode=mode) for op in ops]), st.booleans())


def _encode(body: Any) -> bytes:
    """JSON for a generated body; the standard library takes the integers beyond 64 bits
    that schemathesis draws and orjson refuses."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body).encode()


async def send(http, case, token: str):
    """Send a generated case in-process; a generated Authorization header becomes a valid token,
    an omitted one (a negative case) stays omitted."""
    kwargs = case.as_transport_kwargs(base_url="http://orbit.test")
    headers = {k: v for k, v in kwargs["headers"].items() if k.lower() != "authorization"}
    if len(headers) != len(kwargs["headers"]):
        headers["Authorization"] = f"Bearer {token}"
    content = _encode(kwargs["json"]) if "json" in kwargs else kwargs.get("data")
    return await http.request(
        kwargs["method"], kwargs["url"], headers=headers, params=kwargs.get("params") or None, content=content
    )


async def check_case(tenant, http, case, existing: bool, checks: list[Any]) -> None:
    if not hasattr(tenant, "fuzz_queue"):
        tenant.fuzz_queue = await tenant.create_queue()
    if existing and "queue_id" in (case.path_parameters or {}):
        case.path_parameters["queue_id"] = tenant.fuzz_queue["id"]
    r = await send(http, case, tenant.token)
    try:
        case.validate_response(r, checks=checks)
    except BaseExceptionGroup as failures:
        # schemathesis reports an exception group; hypothesis shrinks plain assertion errors best.
        raise AssertionError(str(failures)) from None
    if r.status_code < 300:
        ok(r, r.status_code)
    else:
        envelope(r)


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
FUZZ = settings(max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@FUZZ
@given(drawn=cases(GenerationMode.POSITIVE, OPERATIONS))
async def test_schemathesis_positive(tenant, http, drawn):
    await check_case(tenant, http, *drawn, CHECKS)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@FUZZ
# The document puts the bearer requirement on /healthz and /readyz too, which need none
# (reported); a negative case that drops the header there would be a false alarm.
@given(drawn=cases(GenerationMode.NEGATIVE, [op for op in OPERATIONS if op.path.startswith("/v1/")]))
async def test_schemathesis_negative(tenant, http, drawn):
    await check_case(tenant, http, *drawn, [*CHECKS, negative_data_rejection])
