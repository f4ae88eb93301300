"""A method a path does not have is 405 with the error envelope and an `Allow` header naming the
methods of every route of that path; action endpoints (`/v1/queues/{id}:configure`) included,
whose path a plain `/{queue_id}` route must not swallow (`GET /v1/queues/x:configure` used to
answer 404 "queue not found", `OPTIONS` on it `Allow: GET`)."""

from __future__ import annotations

import re

import pytest

from .queue_helpers import assert_error, state

pytestmark = pytest.mark.anyio

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD")


async def documented_routes(http) -> dict[str, set[str]]:
    doc = (await http.get("/openapi.json")).json()
    return {path: {m.upper() for m in ops if m.upper() in METHODS} for path, ops in doc["paths"].items()}


def concrete(path: str, value: str) -> str:
    return re.sub(r"{[a-z_]+}", value, path)


async def test_every_route_answers_other_methods_405_with_its_allow_header(tenant, db):
    q = await tenant.create_queue()
    routes = await documented_routes(tenant.http)
    assert "/v1/queues/{queue_id}:configure" in routes and "/v1/tasks/{task_id}:cancel" in routes
    before = await state(db, tenant.namespace_id)
    checked = 0
    for path, methods in routes.items():
        for value in (q["id"], "0" * 32):
            url = concrete(path, value)
            for method in METHODS:
                if method in methods:
                    continue
                r = await tenant.http.request(method, url, headers=tenant.headers(key=tenant.key()),
                                              content=b"{}" if method in ("PUT", "PATCH", "DELETE") else None)
                label = f"{method} {url}"
                assert r.status_code == 405, (label, r.status_code, r.text)
                assert r.headers.get("allow") == ", ".join(sorted(methods)), (label, r.headers.get("allow"))
                if method != "HEAD":
                    assert_error(r, 405, "INVALID_ARGUMENT")
                checked += 1
    assert checked > 100
    assert await state(db, tenant.namespace_id) == before


async def test_action_routes_are_not_taken_for_a_resource_id(tenant, db):
    q = await tenant.create_queue()
    task = (await tenant.post(f"/v1/queues/{q['id']}/tasks", {"payload": 1})).json()["data"]["task"]
    before = await state(db, tenant.namespace_id)
    for method, path, allowed in (
        ("GET", f"/v1/queues/{q['id']}:configure", "POST"),
        ("GET", f"/v1/queues/{q['id']}:retire", "POST"),
        ("OPTIONS", f"/v1/queues/{q['id']}:configure", "POST"),
        ("DELETE", f"/v1/queues/{q['id']}:configure", "POST"),
        ("GET", f"/v1/queues/{q['id']}/tasks:batch", "POST"),
        ("GET", f"/v1/tasks/{task['id']}:cancel", "POST"),
        ("GET", f"/v1/tasks/{task['id']}:review", "POST"),
        ("GET", "/v1/schedules/" + "0" * 32 + ":configure", "POST"),
        ("GET", "/v1/resource-keys/" + "0" * 32 + ":retire", "POST"),
        ("GET", "/v1/applications/" + tenant.application["id"] + ":configure", "POST"),
        ("OPTIONS", "/v1/queues", "GET, POST"),
        ("DELETE", "/v1/queues", "GET, POST"),
        ("OPTIONS", f"/v1/queues/{q['id']}/tasks", "GET, POST"),
        ("POST", f"/v1/queues/{q['id']}", "GET"),
    ):
        r = await tenant.http.request(method, path, headers=tenant.headers(key=tenant.key()))
        err = assert_error(r, 405, "INVALID_ARGUMENT")
        assert r.headers["allow"] == allowed, (method, path, r.headers["allow"])
        assert method in err["message"], err
    assert await state(db, tenant.namespace_id) == before


async def test_an_unknown_action_is_no_such_route(tenant):
    q = await tenant.create_queue()
    for method in ("GET", "POST"):
        r = await tenant.http.request(method, f"/v1/queues/{q['id']}:nothing", headers=tenant.headers(key="k"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "NOT_FOUND", (method, r.text)


async def test_the_right_method_still_reaches_its_route(tenant):
    q = await tenant.create_queue()
    r = await tenant.post(f"/v1/queues/{q['id']}:configure", {
        "expected_revision": "1", "reason": "r", "paused": True, "max_concurrency": 1, "rate_per_second": 1,
        "max_unfinished_tasks": 5})
    assert r.status_code == 200, r.text
    assert (await tenant.get(f"/v1/queues/{q['id']}")).json()["data"]["paused"] is True
