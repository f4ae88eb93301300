"""The authorization matrix: every endpoint × each permission × in and out of the queue scope ×
another namespace × another application × revoked, malformed and missing tokens.

Only the documented outcomes: the permission the endpoint names lets the call through, any other
is 403; the all-queues scope is needed by creating a queue and by lists spanning queues (403
with a narrower scope), a single queue outside the scope is 404 as if it did not exist; another
namespace's or application's resources are 404 and never appear in a list; a bad token is 401.
Refused calls change nothing. The endpoints come from `/openapi.json`, so a new endpoint without
a row here fails `test_every_endpoint_is_in_the_matrix`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from orbit.server.core.permissions import ALL_PERMISSIONS
from orbit.server.services import tenancy

from .conftest import Tenant, make_tenant
from .queue_helpers import assert_error, configure_body, create_body, retire_body
from .worker_client import Worker


ALL, QUEUE, NAMESPACE, NONE = "all queues", "queue", "namespace", "none"
NOT_IN_MATRIX = {("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}  # no credential at all


@dataclass
class World:
    """One namespace's resources, built with a full token: the targets of the matrix."""

    tenant: Tenant
    queue: dict[str, Any]
    other_queue: dict[str, Any]
    task: dict[str, Any]
    key: dict[str, Any]
    schedule: dict[str, Any]
    secret: str  # a word in every name here: it must never appear in a response to another tenant
    ids: list[str] = field(default_factory=list)

    @property
    def app_id(self) -> str:
        return self.tenant.application["id"]


async def _data(r: httpx.Response, status: int = 200) -> dict[str, Any]:
    assert r.status_code in (status, 200, 201), r.text
    return r.json()["data"]


async def build_world(t: Tenant) -> World:
    secret = f"s{uuid.uuid4().hex[:10]}"
    q = (await _data(await t.post("/v1/queues", create_body(f"{secret}-q", max_concurrency=1)), 201))["queue"]
    q2 = (await _data(await t.post("/v1/queues", create_body(f"{secret}-q2")), 201))["queue"]
    task = (await _data(await t.post(f"/v1/queues/{q['id']}/tasks", {"payload": {"secret": secret}}), 201))["task"]
    key = (await _data(await t.post("/v1/resource-keys", {"name": f"{secret}-k", "max_concurrency": 1}), 201))[
        "resource_key"]
    sched = (await _data(await t.post("/v1/schedules", {"name": f"{secret}-s", "queue_id": q["id"], "paused": True,
                                                       "interval_seconds": 3600, "task": {"payload": 1}}), 201))[
        "schedule"]
    w = World(t, q, q2, task, key, sched, secret)
    w.ids = [q["id"], q2["id"], task["id"], key["id"], sched["id"]]
    return w


async def other_namespace(home: Tenant) -> Tenant:
    """The same application, another namespace, with its own full token."""

    async def body(tx):
        ns = await tenancy.ensure_namespace(tx, home.application["id"], f"ns-{uuid.uuid4().hex[:8]}", "development")
        issued = await tenancy.issue_credential(tx, application=home.application, namespace=ns,
                                                permissions=list(ALL_PERMISSIONS), queue_scope="*")
        return ns, issued

    ns, issued = await home.db.transaction(body)
    return Tenant(home.db, home.http, home.application, ns, issued.token, issued.credential_id)


# ---------------------------------------------------------------- the endpoints

Call = Callable[[Tenant, World, str | None], Awaitable[httpx.Response]]


@dataclass
class Endpoint:
    method: str
    path: str  # the OpenAPI template
    permission: str | None
    scope: str  # ALL, QUEUE (the target's queue must be in scope), NAMESPACE (scope plays no part), NONE
    call: Call  # (caller, target world, token) -> response
    lists: bool = False  # a list: another tenant's resources must be absent, not 404
    fresh: bool = False  # an allowed call changes its target: give it one of its own


def _get(path: Callable[[World], str], params: dict[str, Any] | None = None) -> Call:
    async def run(caller: Tenant, w: World, token: str | None):
        return await caller.http.get(path(w), params=params, headers=_headers(token))
    return run


def _post(path: Callable[[World], str], body: Callable[[World], Any]) -> Call:
    async def run(caller: Tenant, w: World, token: str | None):
        return await caller.http.post(path(w), json=body(w), headers=_headers(token, key=uuid.uuid4().hex))
    return run


def _headers(token: str | None, key: str | None = None) -> dict[str, str]:
    h = {} if token is None else {"Authorization": f"Bearer {token}"}
    if key:
        h["Idempotency-Key"] = key
    return h


def _schedule_configure(w: World) -> dict[str, Any]:
    s = w.schedule
    return {"expected_revision": s["revision"], "reason": "matrix", "paused": True, "interval_seconds": 1800,
            "timezone": s["timezone"], "misfire": s["misfire"], "overlap": s["overlap"], "task": {"payload": 2}}


ENDPOINTS: list[Endpoint] = [
    Endpoint("POST", "/v1/queues", "queues:manage", ALL,
             _post(lambda w: "/v1/queues", lambda w: create_body())),
    Endpoint("GET", "/v1/queues", "queues:read", ALL, _get(lambda w: "/v1/queues"), lists=True),
    Endpoint("GET", "/v1/queues/{queue_id}", "queues:read", QUEUE, _get(lambda w: f"/v1/queues/{w.queue['id']}")),
    Endpoint("GET", "/v1/queues/{queue_id}/usage", "queues:read", QUEUE,
             _get(lambda w: f"/v1/queues/{w.queue['id']}/usage")),
    Endpoint("GET", "/v1/queues/{queue_id}/throughput", "queues:read", QUEUE,
             _get(lambda w: f"/v1/queues/{w.queue['id']}/throughput")),
    Endpoint("POST", "/v1/queues/{queue_id}:configure", "queues:manage", QUEUE,
             _post(lambda w: f"/v1/queues/{w.queue['id']}:configure",
                   lambda w: configure_body(w.queue["revision"], max_concurrency=1)), fresh=True),
    Endpoint("POST", "/v1/queues/{queue_id}:retire", "queues:manage", QUEUE,
             _post(lambda w: f"/v1/queues/{w.other_queue['id']}:retire",
                   lambda w: retire_body(w.other_queue["revision"])), fresh=True),
    Endpoint("POST", "/v1/queues/{queue_id}/tasks", "tasks:submit", QUEUE,
             _post(lambda w: f"/v1/queues/{w.queue['id']}/tasks", lambda w: {"payload": 1}), fresh=True),
    Endpoint("POST", "/v1/queues/{queue_id}/tasks:batch", "tasks:submit", QUEUE,
             _post(lambda w: f"/v1/queues/{w.queue['id']}/tasks:batch",
                   lambda w: {"tasks": [{"idempotency_key": uuid.uuid4().hex, "payload": 1}]}), fresh=True),
    Endpoint("GET", "/v1/queues/{queue_id}/tasks", "tasks:read", QUEUE,
             _get(lambda w: f"/v1/queues/{w.queue['id']}/tasks")),
    Endpoint("GET", "/v1/tasks/{task_id}", "tasks:read", QUEUE, _get(lambda w: f"/v1/tasks/{w.task['id']}")),
    Endpoint("GET", "/v1/tasks/{task_id}/blockers", "tasks:read", QUEUE,
             _get(lambda w: f"/v1/tasks/{w.task['id']}/blockers")),
    Endpoint("GET", "/v1/tasks/{task_id}/attempts", "tasks:read", QUEUE,
             _get(lambda w: f"/v1/tasks/{w.task['id']}/attempts")),
    Endpoint("POST", "/v1/tasks/{task_id}:cancel", "tasks:cancel", QUEUE,
             _post(lambda w: f"/v1/tasks/{w.task['id']}:cancel", lambda w: {"reason": "matrix"}), fresh=True),
    # Allowed, a WAITING task cannot be reviewed: 409 is the answer past authorization.
    Endpoint("POST", "/v1/tasks/{task_id}:review", "tasks:review", QUEUE,
             _post(lambda w: f"/v1/tasks/{w.task['id']}:review",
                   lambda w: {"resolution": "RETRY", "reason": "matrix"})),
    Endpoint("GET", "/v1/applications/{application_id}", "applications:read", NAMESPACE,
             _get(lambda w: f"/v1/applications/{w.app_id}")),
    Endpoint("POST", "/v1/applications/{application_id}:configure", "applications:manage", NAMESPACE,
             _post(lambda w: f"/v1/applications/{w.app_id}:configure",
                   lambda w: {"expected_revision": "999999", "reason": "matrix", "paused": False,
                              "max_concurrency": 10, "rate_per_second": 10, "max_unfinished_tasks": 10})),
    Endpoint("POST", "/v1/resource-keys", "resource_keys:manage", NAMESPACE,
             _post(lambda w: "/v1/resource-keys", lambda w: {"name": f"k-{uuid.uuid4().hex[:8]}", "max_concurrency": 1})),
    Endpoint("GET", "/v1/resource-keys", "resource_keys:read", NAMESPACE, _get(lambda w: "/v1/resource-keys"),
             lists=True),
    Endpoint("GET", "/v1/resource-keys/{resource_key_id}", "resource_keys:read", NAMESPACE,
             _get(lambda w: f"/v1/resource-keys/{w.key['id']}")),
    Endpoint("POST", "/v1/resource-keys/{resource_key_id}:configure", "resource_keys:manage", NAMESPACE,
             _post(lambda w: f"/v1/resource-keys/{w.key['id']}:configure",
                   lambda w: {"expected_revision": w.key["revision"], "reason": "matrix", "max_concurrency": 2}),
             fresh=True),
    Endpoint("POST", "/v1/resource-keys/{resource_key_id}:retire", "resource_keys:manage", NAMESPACE,
             _post(lambda w: f"/v1/resource-keys/{w.key['id']}:retire",
                   lambda w: {"expected_revision": w.key["revision"], "reason": "matrix"}), fresh=True),
    Endpoint("POST", "/v1/schedules", "schedules:manage", QUEUE,
             _post(lambda w: "/v1/schedules",
                   lambda w: {"name": f"s-{uuid.uuid4().hex[:8]}", "queue_id": w.queue["id"], "paused": True,
                              "interval_seconds": 60, "task": {"payload": 1}})),
    Endpoint("GET", "/v1/schedules", "schedules:read", NAMESPACE, _get(lambda w: "/v1/schedules"), lists=True),
    Endpoint("GET", "/v1/schedules/{schedule_id}", "schedules:read", QUEUE,
             _get(lambda w: f"/v1/schedules/{w.schedule['id']}")),
    Endpoint("GET", "/v1/schedules/{schedule_id}/runs", "schedules:read", QUEUE,
             _get(lambda w: f"/v1/schedules/{w.schedule['id']}/runs")),
    Endpoint("POST", "/v1/schedules/{schedule_id}:configure", "schedules:manage", QUEUE,
             _post(lambda w: f"/v1/schedules/{w.schedule['id']}:configure", _schedule_configure), fresh=True),
    Endpoint("POST", "/v1/schedules/{schedule_id}:retire", "schedules:manage", QUEUE,
             _post(lambda w: f"/v1/schedules/{w.schedule['id']}:retire",
                   lambda w: {"expected_revision": w.schedule["revision"], "reason": "matrix"}), fresh=True),
    Endpoint("GET", "/v1/audit-records", "audit:read", ALL, _get(lambda w: "/v1/audit-records"), lists=True),
    Endpoint("GET", "/v1/events", "events:read", ALL, _get(lambda w: "/v1/events"), lists=True),
    Endpoint("GET", "/v1/credential", None, NONE, _get(lambda w: "/v1/credential")),
]
ALLOWED_STATUS = {("POST", "/v1/tasks/{task_id}:review"): 409,
                  ("POST", "/v1/applications/{application_id}:configure"): 409}


def _id(e: Endpoint) -> str:
    return f"{e.method} {e.path}"


def assert_allowed(e: Endpoint, r: httpx.Response) -> None:
    expected = ALLOWED_STATUS.get((e.method, e.path))
    if expected is not None:
        assert r.status_code == expected, (e.path, r.status_code, r.text)
    else:
        assert r.status_code in (200, 201), (e.path, r.status_code, r.text)


def assert_nothing_of(w: World, r: httpx.Response) -> None:
    """Another tenant's ids and names never appear in an answer."""
    text = r.text
    assert w.secret not in text, (r.request.url, text[:300])
    for i in w.ids:
        assert i not in text, (r.request.url, i, text[:300])


async def snapshot(w: World) -> list[Any]:
    t = w.tenant
    out = []
    for path in (f"/v1/queues/{w.queue['id']}", f"/v1/queues/{w.other_queue['id']}", f"/v1/tasks/{w.task['id']}",
                 f"/v1/resource-keys/{w.key['id']}", f"/v1/schedules/{w.schedule['id']}",
                 f"/v1/applications/{w.app_id}"):
        d = (await t.get(path)).json()["data"]
        out.append({k: d.get(k) for k in ("revision", "state", "paused", "retired_at", "max_concurrency", "unfinished_tasks")})
    out.append(len((await t.get(f"/v1/queues/{w.queue['id']}/tasks")).json()["data"]["items"]))
    return out


# ---------------------------------------------------------------- the matrix


def test_every_endpoint_is_in_the_matrix(tmp_path):
    from orbit.server.app import create_app
    from orbit.server.config import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/unused.db", background_loops=False))
    documented = {(m.upper(), p) for p, ops in app.openapi()["paths"].items() for m in ops}
    in_matrix = {(e.method, e.path) for e in ENDPOINTS}
    assert documented - NOT_IN_MATRIX == in_matrix


@pytest.fixture
async def worlds(db, http):  # noqa: D103
    home = await make_tenant(db, http)
    return {
        "home": await build_world(home),
        "other_application": await build_world(await make_tenant(db, http)),
        "other_namespace": await build_world(await other_namespace(home)),
    }


@pytest.mark.anyio
async def test_each_permission_lets_only_its_endpoints_through(worlds):
    w = worlds["home"]
    t = w.tenant
    before = await snapshot(w)
    tokens = {p: await t.credential([p]) for p in ALL_PERMISSIONS}
    for e in ENDPOINTS:
        for p, token in tokens.items():
            if e.permission is None or p == e.permission:
                continue
            r = await e.call(t, w, token)
            assert_error(r, 403, "PERMISSION_DENIED")
    assert await snapshot(w) == before  # refusals changed nothing
    for e in ENDPOINTS:
        target = await build_world(t) if e.fresh else w
        token = tokens[e.permission] if e.permission else t.token
        assert_allowed(e, await e.call(t, target, token))


@pytest.mark.anyio
async def test_the_queue_scope(worlds):
    w = worlds["home"]
    t = w.tenant
    before = await snapshot(w)
    narrow = await t.credential(ALL_PERMISSIONS, queue_scope=[w.other_queue["id"]])
    for e in ENDPOINTS:
        if e.scope == QUEUE and e.path.startswith("/v1/queues/{queue_id}:retire"):
            continue  # retire targets the other queue, which is the one in scope: covered below
        if e.scope in (NAMESPACE, NONE) and not e.lists:
            continue
        r = await e.call(t, w, narrow)
        if e.scope == ALL:
            assert_error(r, 403, "PERMISSION_DENIED")
        elif e.scope == QUEUE:
            assert_error(r, 404, "NOT_FOUND")
            assert w.secret not in r.text
        elif e.lists:
            assert r.status_code == 200, r.text
            for resource in (w.queue, w.task, w.schedule):
                assert resource["id"] not in r.text or e.path == "/v1/resource-keys", (e.path, r.text[:300])

    inside = await t.credential(ALL_PERMISSIONS, queue_scope=[w.queue["id"]])
    for e in ENDPOINTS:
        if e.scope not in (QUEUE, NAMESPACE, NONE) or e.path.endswith(":retire") and "queue_id" in e.path:
            continue
        target = await build_world(t) if e.fresh else w
        if target is not w:
            inside_target = await t.credential(ALL_PERMISSIONS, queue_scope=[target.queue["id"], target.other_queue["id"]])
            assert_allowed(e, await e.call(t, target, inside_target))
        else:
            assert_allowed(e, await e.call(t, w, inside))


@pytest.mark.anyio
@pytest.mark.parametrize("stranger", ["other_application", "other_namespace"])
async def test_another_tenants_resources_are_not_found_and_never_listed(worlds, stranger):
    home, other = worlds["home"], worlds[stranger]
    before = await snapshot(other)
    for e in ENDPOINTS:
        if e.lists or e.scope == NONE:
            r = await e.call(home.tenant, other, home.tenant.token)
            assert r.status_code == 200, (e.path, r.text)
            assert_nothing_of(other, r)
            continue
        if "{" not in e.path:
            continue  # a create in the caller's own namespace: no target of the other tenant
        if e.path.startswith("/v1/applications/") and stranger == "other_namespace":
            # One application spans its namespaces: its quotas are shared and readable from each.
            r = await e.call(home.tenant, other, home.tenant.token)
            assert r.status_code in (200, 409), r.text
            continue
        r = await e.call(home.tenant, other, home.tenant.token)
        assert_error(r, 404, "NOT_FOUND")
        assert_nothing_of(other, r)
    # A schedule of the caller's namespace cannot target another tenant's queue.
    r = await home.tenant.post("/v1/schedules", {"name": f"x-{uuid.uuid4().hex[:6]}", "queue_id": other.queue["id"],
                                                 "interval_seconds": 60, "task": {"payload": 1}})
    assert_error(r, 404, "NOT_FOUND")
    assert await snapshot(other) == before


@pytest.mark.anyio
async def test_revoked_malformed_and_missing_tokens_are_401_everywhere(worlds):
    w = worlds["home"]
    t = w.tenant
    before = await snapshot(w)
    revoked = await t.credential(ALL_PERMISSIONS)
    cred_id = revoked[len("orb_"):len("orb_") + 32]

    async def revoke(tx):
        await tenancy.revoke_credential(tx, cred_id, "matrix")

    await t.db.transaction(revoke)
    bad = [revoked, "orb_" + "0" * 32 + "_nope", "not-a-token", t.token[:-2] + "xx", "", None]
    for e in ENDPOINTS:
        for token in bad:
            r = await e.call(t, w, token)
            assert_error(r, 401, "UNAUTHENTICATED")
            assert w.secret not in r.text
    assert await snapshot(w) == before


# ---------------------------------------------------------------- the worker protocol


@pytest.mark.anyio
@pytest.mark.parametrize("stranger", ["other_application", "other_namespace"])
async def test_worker_commands_never_reach_another_tenant_or_a_queue_out_of_scope(worlds, base, stranger):
    home, other = worlds["home"], worlds[stranger]
    foreign_q, foreign_task = other.queue["id"], other.task["id"]
    async with Worker.connect(base, other.tenant.token) as theirs:
        await theirs.hello(foreign_q, node_id="their-host")
        (lease,) = (await theirs.call("claim", queue_id=foreign_q, max_tasks=1, lease_ms=30_000))["tasks"]
        assert (await theirs.call("start", lease_id=lease["lease_id"]))["ok"]
        async with Worker.connect(base, home.tenant.token) as mine:
            r = await mine.call("hello", node_id="my-host", queues=[foreign_q], sdk="tests")
            assert r.get("error", {}).get("code") == "NOT_FOUND", r
            await mine.hello(home.queue["id"], node_id="my-host")
            r = await mine.call("claim", queue_id=foreign_q, max_tasks=1)
            assert r.get("error", {}).get("code") == "NOT_FOUND", r
            for command, fields in (("start", {}), ("renew", {}), ("complete", {"outcome": "succeeded", "result": 1})):
                r = await mine.call(command, lease_id=lease["lease_id"], **fields)
                assert r.get("error", {}).get("code") == "NOT_FOUND", (command, r)
                assert other.secret not in str(r)
        state = (await other.tenant.get(f"/v1/tasks/{foreign_task}")).json()["data"]
        assert (state["state"], state["attempts"]) == ("RUNNING", 1)  # untouched by the stranger


@pytest.mark.anyio
async def test_a_worker_scoped_to_one_queue_reaches_no_other(worlds, base):
    w = worlds["home"]
    scoped = await w.tenant.credential(["worker"], queue_scope=[w.other_queue["id"]])
    async with Worker.connect(base, scoped) as mine:
        r = await mine.call("hello", node_id="my-host", queues=[w.queue["id"]], sdk="tests")
        assert r.get("error", {}).get("code") == "NOT_FOUND", r
        await mine.hello(w.other_queue["id"], node_id="my-host")
        r = await mine.call("claim", queue_id=w.queue["id"], max_tasks=1)
        assert r.get("error", {}).get("code") == "NOT_FOUND", r
    assert (await w.tenant.get(f"/v1/tasks/{w.task['id']}")).json()["data"]["state"] == "WAITING"
