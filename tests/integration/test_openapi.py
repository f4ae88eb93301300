"""/openapi.json: a valid OpenAPI 3.1 document describing the API, bounded schemathesis runs of
the in-process app against it (no 5xx, documented statuses, content types and response
schemas), and the document is exact: what it admits is not refused as malformed, what it does
not admit is refused (fuzzed over every operation on both backends, and checked at the edges of
every body field and query parameter)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any

import jsonschema
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from orbit.server.app import create_app
from orbit.server.config import Settings

from .queue_helpers import envelope, ok, unique_name

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
    an omitted one (a negative case) stays omitted. The token is written into the case itself, so
    that a negative case whose only invalid parts were replaced here (this header, and the queue
    id in `check_case`) is judged as the valid request it became."""
    for name in [k for k in case.headers or {} if k.lower() == "authorization"]:
        case.headers[name] = f"Bearer {token}"
    kwargs = case.as_transport_kwargs(base_url="http://orbit.test")
    content = _encode(kwargs["json"]) if "json" in kwargs else kwargs.get("data")
    return await http.request(
        kwargs["method"], kwargs["url"], headers=kwargs["headers"], params=kwargs.get("params") or None,
        content=content,
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


# ---------------------------------------------------------------- the document is exact
#
# Every operation of the API, on both backends: a case the document says is valid must not be
# refused as malformed (400), and a case it says is invalid must be (400; 404 or 405 when only
# a path id is off, 401 when the token was left out). The rules the document cannot state are
# named in its description and listed here by the field the server names.

STRICT_CONFIG = SchemathesisConfig.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": ["400"]}}})
CONTEXT_RULES: dict[str, set[str]] = {
    # timestamps within windows of the request's time; deadline_at or deadline_seconds; keys that
    # exist in the namespace; the payload's size; max_backoff_ms >= initial_backoff_ms
    "submit": {"available_at", "start_deadline_at", "deadline_at", "deadline_seconds", "resource_keys", "payload",
               "retry.max_backoff_ms"},
    # a cron expression that matches some time, exactly one of cron and interval_seconds, an IANA
    # zone, start_at before end_at (and a first point before end_at), the template's keys and size
    "schedule": {"cron", "interval_seconds", "timezone", "start_at", "end_at", "task.resource_keys", "task.payload",
                 "task.retry.max_backoff_ms"},
    # a cursor is opaque: only one the server handed out is valid
    "list": {"cursor"},
}


def _strict_operations() -> list[Any]:
    unused = os.path.join(tempfile.gettempdir(), "orbit-openapi-never-opened.db")
    document = create_app(Settings(database_url=f"sqlite:///{unused}", background_loops=False)).openapi()
    schema = schemathesis.openapi.from_dict(document, config=STRICT_CONFIG)
    ops = [r.ok() for r in schema.get_all_operations()]
    return [op for op in ops if op.path.startswith("/v1/")]


ALL_OPERATIONS = _strict_operations()
# CI draws 750 cases per run (3,000 in all); a long run sets ORBIT_FUZZ_EXAMPLES (e.g. 2500: 10,000 cases in all).
MANY = settings(max_examples=int(os.environ.get("ORBIT_FUZZ_EXAMPLES", "750")), deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


def _context_rules(case) -> set[str]:
    path, method = case.operation.path, case.operation.method.lower()
    rules = set(CONTEXT_RULES["list"]) if method == "get" else set()
    if path.endswith("/tasks") and method == "post":
        rules |= CONTEXT_RULES["submit"]
    if path.startswith("/v1/schedules") and method == "post":
        rules |= CONTEXT_RULES["schedule"]
    return rules


async def _aim(tenant, case, existing: bool) -> None:
    """Point a case at the tenant's own resources when `existing` (else its random ids name none);
    keep long polls short and generated schedules paused (a scheduler sharing the database must
    not find them due)."""
    if not hasattr(tenant, "strict_resources"):
        q = await tenant.create_queue()
        task = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}), 201)["task"]
        key = ok(await tenant.post("/v1/resource-keys", {"name": f"k-{q['id'][-12:]}", "max_concurrency": 1}),
                 201)["resource_key"]
        s = ok(await tenant.post("/v1/schedules", {"name": f"s-{q['id'][-12:]}", "queue_id": q["id"],
                                                   "interval_seconds": 3600, "paused": True,
                                                   "task": {"payload": 1}}), 201)["schedule"]
        tenant.strict_resources = {"queue_id": q["id"], "task_id": task["id"], "resource_key_id": key["id"],
                                   "schedule_id": s["id"], "application_id": tenant.application["id"]}
    path_negative = case.meta is not None and any(
        loc.name.lower() == "path" and c.mode.is_negative for loc, c in case.meta.components.items())
    if existing and not path_negative:
        for name in case.path_parameters or {}:
            case.path_parameters[name] = tenant.strict_resources[name]
    if case.query and "wait_ms" in case.query:
        case.query["wait_ms"] = 0
    if isinstance(case.body, dict) and case.operation.path.startswith("/v1/schedules"):
        if "queue_id" in case.body and existing:
            case.body["queue_id"] = tenant.strict_resources["queue_id"]
        if case.operation.path == "/v1/schedules":
            case.body["paused"] = True


def _as_integers(value: Any) -> Any:
    """A generated integral float written as a JSON integer. JSON Schema cannot tell 8 from 8.0, so
    a generator may draw 8.0 for an `integer`; OpenAPI 3.1's integer is a JSON number without a
    fraction part, which is what the server takes (test_the_document_and_the_server_agree_at_the_edges
    checks 8.0 is refused). A `number` takes 8 as well as 8.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {k: _as_integers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_integers(v) for v in value]
    return value


IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,128}\Z")


def _headers_valid(case) -> bool:
    """Whether the headers the document declares (Idempotency-Key) are as it says."""
    declared = [p for p in case.operation.definition.raw.get("parameters", []) if p.get("in") == "header"]
    headers = {k.lower(): v for k, v in (case.headers or {}).items()}
    for p in declared:
        value = headers.get(p["name"].lower())
        if value is None:
            if p.get("required"):
                return False
        elif not isinstance(value, str) or not IDEMPOTENCY_KEY.match(value):
            return False
    return True


def negative_parts(case) -> set[str]:
    """The parts of a generated case drawn invalid ("path", "query", "header", "body")."""
    return set() if case.meta is None else {loc.name.lower() for loc, c in case.meta.components.items()
                                            if c.mode.is_negative}


def checks_after_send(case, negative: set[str], checks: list[Any]) -> list[Any]:
    """`checks` without negative-data rejection when nothing invalid reached the server: the only
    invalid part was the Authorization header, and send() put a valid token in."""
    if "header" in negative and _headers_valid(case):
        negative = negative - {"header"}
    return checks if negative else [c for c in checks if c is not negative_data_rejection]


async def check_strict(tenant, http, case, existing: bool, positive: bool) -> None:
    await _aim(tenant, case, existing)
    negative = negative_parts(case)
    if "body" not in negative:
        case.body = _as_integers(case.body)
    if case.query and "query" not in negative:
        case.query = {k: _as_integers(v) for k, v in case.query.items()}
    r = await send(http, case, tenant.token)
    label = f"{case.operation.method.upper()} {case.operation.path} {r.status_code} {r.text[:300]}"
    if "header" in negative and _headers_valid(case):
        negative.discard("header")  # only the Authorization header was off: send() put a valid token in
    try:
        if positive:
            case.validate_response(r, checks=CHECKS)
            if r.status_code == 400:
                field = (r.json()["error"].get("details") or {}).get("field")
                assert field in _context_rules(case), f"valid by the document, refused: {label}"
            assert r.status_code not in (401, 403, 405, 413, 415, 422), label
        elif r.status_code == 401 and "authorization" not in {k.lower() for k in (case.headers or {})}:
            pass  # the negative case left the token out
        elif "path" in negative:  # a path id no resource has: 404 (never reveal existence), or 400 first
            assert r.status_code in (400, 404, 405), f"a path id no resource has: {label}"
        elif not negative:
            case.validate_response(r, checks=CHECKS)
        else:
            case.validate_response(r, checks=[*CHECKS, negative_data_rejection])
    except BaseExceptionGroup as failures:
        raise AssertionError(f"{label}\n{failures}") from None
    if r.status_code < 300:
        ok(r, r.status_code)
    else:
        envelope(r)


@MANY
@given(drawn=cases(GenerationMode.POSITIVE, ALL_OPERATIONS))
async def test_what_the_document_admits_is_not_refused_as_malformed(tenant, http, drawn):
    await check_strict(tenant, http, *drawn, positive=True)


@MANY
@given(drawn=cases(GenerationMode.NEGATIVE, ALL_OPERATIONS))
async def test_what_the_document_refuses_is_refused(tenant, http, drawn):
    await check_strict(tenant, http, *drawn, positive=False)


# ---------------------------------------------------------------- the document and the server agree

_ECMA_SPACE = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"


def _ecma_pattern(validator, pattern: str, instance: Any, schema: Any):
    """`pattern` as ECMA 262 reads it, which the document's patterns are: `$` is the end of the text
    (Python's also matches before a trailing newline) and `\\s` is ECMA's white space (Python's
    differs: \\x1c-\\x1f, \\x85, not \\ufeff)."""
    python = re.sub(r"\$$", r"\\Z", pattern).replace("\\S", f"[^{_ECMA_SPACE}]").replace("\\s", f"[{_ECMA_SPACE}]")
    if isinstance(instance, str) and not re.search(python, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_OAS = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={"pattern": _ecma_pattern},
    # OpenAPI 3.1's integer: a JSON number without a fraction part (8, not 8.0); JSON Schema's own
    # `integer` takes 8.0, which no JSON Schema keyword can refuse.
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool)),
)
U64_MAX = str(2**64 - 1)
EDGES: dict[str, list[Any]] = {
    "integer": ["min", "max", "below", "above", "float", "string", "bool", None],
    "expected_revision": ["1", U64_MAX, str(2**64), "0", "01", "-1", "1.0", 1, "", None],
    "reason": ["a", " a ", "x" * 1024, "x" * 1025, "", " ", "\x1c", "\u2003", "\u00a0x", "\ufeff", None, 5],
    "name": ["a", "a" * 128, "a" * 129, "-a", "a\n", "é", "a b", None],
    "payload": [None, 0, "", [], {}, {"a": None}],
    "paused": [True, False, None, 0, "true"],
}


def _edge(value: Any, prop: dict[str, Any]) -> Any:
    """An integer edge of a property (`min`, `max`, just outside, as float/string/bool)."""
    branch = next((b for b in prop.get("anyOf", [prop]) if b.get("type") == "integer"), prop)
    low, high = branch.get("minimum", 0), branch.get("maximum", 100)
    return {"min": low, "max": high, "below": low - 1, "above": high + 1, "float": float(low),
            "string": str(low), "bool": True}.get(value, value) if isinstance(value, str) else value


BODIES = {
    "/v1/queues": ("CreateQueueRequest", lambda: {"name": unique_name(), "max_concurrency": 2, "rate_per_second": 3}),
    "/v1/queues/{queue_id}:configure": ("ConfigureQueueRequest", lambda: {
        "expected_revision": "1", "reason": "r", "paused": False, "max_concurrency": 1, "rate_per_second": 1,
        "max_unfinished_tasks": 10}),
    "/v1/queues/{queue_id}/tasks": ("SubmitTaskRequest", lambda: {"payload": 1, "retry": {}}),
    "/v1/resource-keys": ("CreateResourceKeyRequest", lambda: {"name": unique_name("k"), "max_concurrency": 1}),
    "/v1/applications/{application_id}:configure": ("ConfigureApplicationRequest", lambda: {
        "expected_revision": "1", "reason": "r", "paused": False, "max_concurrency": 1, "rate_per_second": 1,
        "max_unfinished_tasks": 10}),
    "/v1/schedules": ("CreateScheduleRequest", lambda: {
        "name": unique_name("s"), "queue_id": "", "interval_seconds": 3600, "paused": True,
        "misfire": {}, "task": {"payload": 1, "retry": {}}}),
}


def _leaves(schema: dict[str, Any], components: dict[str, Any], prefix: tuple[str, ...] = ()):
    """(path, property schema) of every property, following $refs into nested objects."""
    for name, prop in schema.get("properties", {}).items():
        yield (*prefix, name), prop
        for branch in prop.get("anyOf", [prop]):
            if "$ref" in branch:
                yield from _leaves(components[branch["$ref"].rsplit("/", 1)[1]], components, (*prefix, name))


def _set(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(body))
    node = out
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return out


async def test_the_document_and_the_server_agree_at_the_edges(tenant, http, db_url):
    """For every body field of the main routes, edge values (bounds and just past them, 8.0 for an
    integer, revisions at and past uint64, blank reasons, null): the document admits a value
    exactly when the server does not refuse it as malformed."""
    doc = await fetch_openapi(http)
    components = doc["components"]["schemas"]
    q = await tenant.create_queue()
    ids = {"queue_id": q["id"], "application_id": tenant.application["id"]}
    checked = 0
    for route, (schema_name, make) in BODIES.items():
        validator = _OAS({"$ref": f"#/components/schemas/{schema_name}", "components": doc["components"]})
        for path, prop in _leaves(components[schema_name], components):
            kind = path[-1] if path[-1] in EDGES else "integer" if "integer" in json.dumps(prop) else None
            if kind is None:
                continue
            for edge in EDGES[kind]:
                base = make()
                if "queue_id" in base:
                    base["queue_id"] = q["id"]
                body = _set(base, path, _edge(edge, prop) if kind == "integer" else edge)
                admitted = validator.is_valid(body)
                if route.endswith(":configure"):  # a fresh revision 1 to configure
                    fresh = await tenant.create_queue() if "queue_id" in route else None
                    url = route.format(**{**ids, "queue_id": fresh["id"] if fresh else q["id"]})
                else:
                    url = route.format(**ids)
                r = await tenant.post(url, body)
                refused = r.status_code == 400
                field = (r.json().get("error", {}).get("details") or {}).get("field")
                message = r.json()["error"]["message"] if refused else ""
                by_context = not message.endswith("must not be null") and "input should" not in message
                if admitted and refused and by_context and field in CONTEXT_RULES["submit"] | CONTEXT_RULES["schedule"]:
                    continue  # a rule the document names but cannot state (exactly one of cron, interval)
                assert admitted != refused, (route, ".".join(path), repr(edge), admitted, r.status_code, r.text[:300])
                if refused:
                    assert field == ".".join(path), (route, path, edge, r.text[:300])
                checked += 1
    assert checked > 150, checked


QUERY_EDGES = ["", "0", "1", "7", "1000", "1001", "-1", "8.0", "1e3", "é", "true", "false", "yes", "0" * 32,
               "a" * 128, "a" * 129, "-a", "queue.create", "task.*", U64_MAX, str(2**64), "WAITING",
               "2026-01-01T00:00:00Z", "2026-01-01"]


def _query_admits(schema: dict[str, Any], text: str) -> bool:
    """Whether a parameter's schema admits this query text (integers and booleans are written as
    decimal digits and true/false)."""
    if schema.get("type") == "array":
        return _query_admits(schema["items"], text)
    if schema.get("type") == "integer":
        if not re.fullmatch(r"-?[0-9]+", text):
            return False
        value: Any = int(text)
    elif schema.get("type") == "boolean":
        if text not in ("true", "false"):
            return False
        value = text == "true"
    else:
        value = text
    return _OAS(schema, format_checker=_OAS.FORMAT_CHECKER).is_valid(value)


async def test_the_document_and_the_server_agree_on_query_parameters(tenant, http):
    """Every query parameter of every list route, at its edges (an empty cursor, 8.0 for a limit,
    a name no queue can have, a seq past uint64): admitted by the document exactly when the
    server does not refuse it."""
    doc = await fetch_openapi(http)
    q = await tenant.create_queue()
    task = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1}), 201)["task"]
    ids = {"queue_id": q["id"], "task_id": task["id"], "schedule_id": "0" * 32}
    checked = 0
    for path, ops in doc["paths"].items():
        params = [p for p in ops.get("get", {}).get("parameters", []) if p["in"] == "query"]
        if not path.startswith("/v1/") or not params or "{schedule_id}" in path:
            continue
        for param in params:
            for text in QUERY_EDGES:
                admitted = _query_admits(param["schema"], text)
                r = await tenant.get(path.format(**ids), params={param["name"]: text,
                                                                 **({"wait_ms": "0"} if "wait_ms" != param["name"]
                                                                    and path == "/v1/events" else {})})
                if param["name"] == "cursor" and admitted:
                    continue  # a cursor is opaque: only those the server handed out are valid
                assert (r.status_code == 400) != admitted, (path, param["name"], text, admitted, r.text[:300])
                checked += 1
    assert checked > 200, checked
