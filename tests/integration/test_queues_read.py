"""GET /v1/queues/{queue_id} and GET /v1/queues, with pagination."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest

from .conftest import make_tenant
from .queue_helpers import (
    assert_error,
    assert_queue_object,
    create_body,
    ok,
    retire_body,
    unique_name,
)

pytestmark = pytest.mark.anyio


def _parse(ts: str) -> datetime:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ")


async def test_get_returns_the_queue_object_itself(tenant):
    created = await tenant.create_queue(max_concurrency=3, rate_per_second=7, max_unfinished_tasks=11)
    q = ok(await tenant.get(f"/v1/queues/{created['id']}"))
    assert_queue_object(q)
    assert q == created
    assert (q["max_concurrency"], q["rate_per_second"], q["max_unfinished_tasks"]) == (3, 7, 11)
    assert q["unfinished_tasks"] == "0" and q["revision"] == "1"
    # The database clock is UTC; allow generous skew between it and this process.
    assert abs(_parse(q["created_at"]) - datetime.now(UTC).replace(tzinfo=None)) < timedelta(minutes=10)


async def test_get_of_a_missing_malformed_or_foreign_queue_is_404(tenant, db, http):
    q = await tenant.create_queue()
    other = await make_tenant(db, http)
    foreign = await other.create_queue()
    ids = [
        "0" * 32,
        "f" * 32,
        q["id"][:-1] + ("0" if q["id"][-1] != "0" else "1"),
        q["id"].upper(),
        q["id"][:-1],
        q["id"] + "0",
        "abc",
        "not-a-queue",
        q["id"] + "%0A",
        "%20" + q["id"],
        foreign["id"],
    ]
    bodies = []
    for qid in ids:
        r = await tenant.get(f"/v1/queues/{qid}")
        err = assert_error(r, 404, "NOT_FOUND")
        bodies.append(err)
    # Never reveal existence: a foreign queue answers exactly like a missing one.
    assert all(b == bodies[0] for b in bodies), bodies
    assert ok(await other.get(f"/v1/queues/{foreign['id']}"))["id"] == foreign["id"]


async def _list_all(tenant, **params) -> list[dict]:
    items: list[dict] = []
    cursor = None
    pages = 0
    while True:
        p = dict(params)
        if cursor is not None:
            p["cursor"] = cursor
        page = ok(await tenant.get("/v1/queues", params=p))
        assert set(page) == {"items", "next_cursor"}
        pages += 1
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
        assert isinstance(cursor, str) and cursor
        assert page["items"], "a page with a next_cursor must not be empty"
        assert pages < 50


async def test_list_paginates_in_creation_order_without_gaps_or_duplicates(tenant):
    created = [await tenant.create_queue() for _ in range(7)]
    ids = [q["id"] for q in created]
    for limit in (1, 2, 3, 7, 1000):
        items = await _list_all(tenant, limit=limit)
        assert [i["id"] for i in items] == ids, limit
    first = ok(await tenant.get("/v1/queues", params={"limit": 3}))
    assert len(first["items"]) == 3 and first["next_cursor"] is not None
    # Exactly `limit` items remain: the last page says so instead of pointing at an empty page.
    second = ok(await tenant.get("/v1/queues", params={"limit": 4, "cursor": first["next_cursor"]}))
    assert [i["id"] for i in second["items"]] == ids[3:] and second["next_cursor"] is None
    everything = ok(await tenant.get("/v1/queues"))
    assert everything["next_cursor"] is None and everything["items"] == created


# 101 creates over HTTP take seconds on MariaDB; the paging code is the same on both backends
# and the explicit-limit paging above runs on both.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_list_default_limit_is_100(tenant):
    for _ in range(101):
        r = await tenant.post("/v1/queues", create_body())
        assert r.status_code == 201, r.text
    page = ok(await tenant.get("/v1/queues"))
    assert len(page["items"]) == 100 and page["next_cursor"] is not None
    rest = ok(await tenant.get("/v1/queues", params={"cursor": page["next_cursor"]}))
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None


async def test_list_items_are_full_queue_objects_of_this_namespace_only(tenant, db, http):
    mine = await tenant.create_queue()
    other = await make_tenant(db, http)
    await other.create_queue()
    items = ok(await tenant.get("/v1/queues"))["items"]
    assert items == [mine]
    for item in items:
        assert_queue_object(item)
        assert item["namespace_id"] == tenant.namespace_id


async def test_list_rejects_invalid_parameters(tenant):
    await tenant.create_queue()
    bad_cursors = [
        "!!!",
        "abc",
        base64.urlsafe_b64encode(b"not json").decode(),
        base64.urlsafe_b64encode(b'{"after": 5}').decode(),
        base64.urlsafe_b64encode(b'{"before": "x"}').decode(),
        base64.urlsafe_b64encode(b"[]").decode(),
    ]
    cases = [({"limit": v}, "limit") for v in ("0", "1001", "-1", "abc", "1.5", "", "1e2", "99999999999999999999")]
    cases += [({"cursor": c}, "cursor") for c in bad_cursors]
    cases += [({"include_retired": v}, "include_retired") for v in ("maybe", "2", "")]
    cases += [({"name": "a" * 129}, "name")]
    for params, field in cases:
        r = await tenant.get("/v1/queues", params=params)
        try:
            assert_error(r, 400, "INVALID_ARGUMENT", field)
        except AssertionError as exc:
            raise AssertionError(f"params {params!r}: {exc}") from None
    assert len(ok(await tenant.get("/v1/queues", params={"limit": "1000"}))["items"]) == 1
    assert len(ok(await tenant.get("/v1/queues", params={"limit": "1"}))["items"]) == 1


async def test_list_filters_by_exact_name(tenant):
    name = unique_name("images")
    q = await tenant.create_queue(name)
    await tenant.create_queue(name + "-2")
    await tenant.create_queue("x" + name)
    assert ok(await tenant.get("/v1/queues", params={"name": name}))["items"] == [q]
    assert ok(await tenant.get("/v1/queues", params={"name": name[:-1]}))["items"] == []
    assert ok(await tenant.get("/v1/queues", params={"name": name.upper()}))["items"] == []
    assert ok(await tenant.get("/v1/queues", params={"name": "nope"}))["items"] == []


async def test_list_hides_retired_queues_unless_asked(tenant):
    keep = await tenant.create_queue()
    gone = await tenant.create_queue()
    retired = ok(await tenant.post(f"/v1/queues/{gone['id']}:retire", retire_body("1")))["queue"]

    def ids(page):
        return [i["id"] for i in page["items"]]

    assert ids(ok(await tenant.get("/v1/queues"))) == [keep["id"]]
    assert ids(ok(await tenant.get("/v1/queues", params={"include_retired": "false"}))) == [keep["id"]]
    with_retired = ok(await tenant.get("/v1/queues", params={"include_retired": "true"}))
    assert ids(with_retired) == [keep["id"], gone["id"]]
    assert with_retired["items"][1] == retired
    assert ok(await tenant.get("/v1/queues", params={"name": gone["name"]}))["items"] == []
    named = ok(await tenant.get("/v1/queues", params={"name": gone["name"], "include_retired": "true"}))
    assert ids(named) == [gone["id"]]
    paged = await _list_all(tenant, limit=1, include_retired="true")
    assert [i["id"] for i in paged] == [keep["id"], gone["id"]]
