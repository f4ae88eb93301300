"""POST /v1/queues/{queue_id}/tasks:batch — many tasks, each admitted on its own."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest

from .task_helpers import (
    PAYLOAD_LIMIT,
    QUEUE_FULL_ERROR,
    assert_error,
    assert_fresh_task,
    batch_path,
    cancel,
    counter_invariant,
    event_rows,
    fmt,
    idempotency_records_for,
    ok,
    post_raw,
    retire,
    snapshot,
    submit,
    tasks_path,
    utcnow,
)

pytestmark = pytest.mark.anyio


async def batch(tenant, q, items: list[Any], *, key: str | None = None, status: int = 200) -> dict[str, Any]:
    data = ok(await tenant.post(batch_path(q), {"tasks": items}, key=key), status)
    assert set(data) == {"deduplicated", "results"}, data
    assert len(data["results"]) == len(items), data
    return data


def error_of(result: dict[str, Any]) -> str | None:
    if "error" in result:
        assert set(result) == {"error"} and set(result["error"]) == {"code", "message"}, result
        return result["error"]["code"]
    assert set(result) == {"deduplicated", "task"}, result
    return None


async def test_batch_admits_every_valid_item_in_order(tenant):
    q = await tenant.create_queue()
    items = [
        {"idempotency_key": "b-0", "payload": {"n": 0}},
        {"idempotency_key": "b-1", "payload": [1], "priority": 9, "max_attempts": 1, "on_lease_lost": "retry"},
        {"idempotency_key": "b-2", "payload": "two", "retry": {"multiplier": 2.5}, "deadline_seconds": 86400},
    ]
    data = await batch(tenant, q, items)
    assert data["deduplicated"] is False
    tasks = []
    for item, result in zip(items, data["results"], strict=True):
        assert error_of(result) is None and result["deduplicated"] is False, result
        t = result["task"]
        assert_fresh_task(t, q)
        assert t["payload"] == item["payload"]
        assert ok(await tenant.get(f"/v1/tasks/{t['id']}")) == t
        [record] = await idempotency_records_for(tenant, item["idempotency_key"])
        assert record["operation"] == "tasks.submit" and record["resource_id"] == t["id"]
        assert [e["type"] for e in await event_rows(tenant, t["id"])] == ["task.submitted"]
        tasks.append(t)
    assert len({t["id"] for t in tasks}) == 3
    assert (tasks[1]["priority"], tasks[1]["max_attempts"], tasks[1]["on_lease_lost"]) == (9, 1, "retry")
    assert tasks[2]["retry"]["multiplier"] == 2.5 and tasks[2]["deadline_at"] is not None
    assert await counter_invariant(tenant, q["id"]) == 3


async def test_batch_size_and_envelope_are_validated(tenant):
    q = await tenant.create_queue()
    before = await snapshot(tenant, q["id"])
    item = {"idempotency_key": "x", "payload": 1}
    for body in (
        {"tasks": []},
        {"tasks": [dict(item, idempotency_key=f"x-{i}") for i in range(501)]},
        {},
        {"tasks": None},
        {"tasks": item},
        {"tasks": "many"},
        {"tasks": [item], "atomic": True},
    ):
        assert_error(await tenant.post(batch_path(q), body), 400, "INVALID_ARGUMENT")
    r = await tenant.post(batch_path(q), {"tasks": [item], "atomic": True})
    assert_error(r, 400, "INVALID_ARGUMENT", "atomic")
    assert_error(await tenant.post(batch_path(q), {"tasks": []}), 400, "INVALID_ARGUMENT", "tasks")
    assert_error(await post_raw(tenant, batch_path(q), b"[]", key=tenant.key()), 400, "INVALID_ARGUMENT")
    r = await post_raw(tenant, batch_path(q), b'{"tasks": []}', key=tenant.key(), content_type="text/plain")
    assert_error(r, 415, "UNSUPPORTED_MEDIA_TYPE")
    # The header key is required and checked.
    auth_only = {"Authorization": f"Bearer {tenant.token}"}
    r = await tenant.http.post(batch_path(q), json={"tasks": [item]}, headers=auth_only)
    assert_error(r, 400, "INVALID_ARGUMENT", "Idempotency-Key")
    r = await tenant.post(batch_path(q), {"tasks": [item]}, key="has space")
    assert_error(r, 400, "INVALID_ARGUMENT", "Idempotency-Key")
    assert await snapshot(tenant, q["id"]) == before
    # A refused batch leaves no record: its header key is free for a valid batch.
    assert_error(await tenant.post(batch_path(q), {"tasks": []}, key="batch-key"), 400, "INVALID_ARGUMENT")
    assert (await batch(tenant, q, [item], key="batch-key"))["deduplicated"] is False


async def test_batch_of_500_items_is_accepted(tenant):
    q = await tenant.create_queue()
    items = [{"idempotency_key": f"big-{i}", "payload": i} for i in range(500)]
    data = await batch(tenant, q, items)
    assert [r["task"]["payload"] for r in data["results"]] == list(range(500))
    assert all(r["deduplicated"] is False for r in data["results"])
    assert await counter_invariant(tenant, q["id"]) == 500


async def test_each_item_is_validated_on_its_own(tenant):
    q = await tenant.create_queue()
    past = fmt(utcnow() - timedelta(hours=1))
    cases = [
        ({"idempotency_key": "ok-0", "payload": 0}, None),
        ({"payload": 1}, "idempotency_key"),
        ({"idempotency_key": "", "payload": 1}, "idempotency_key"),
        ({"idempotency_key": "has space", "payload": 1}, "idempotency_key"),
        ({"idempotency_key": "k" * 129, "payload": 1}, "idempotency_key"),
        ({"idempotency_key": 7, "payload": 1}, "idempotency_key"),
        ({"idempotency_key": "bad-null", "payload": None}, "payload"),
        ({"idempotency_key": "bad-missing"}, "payload"),
        ({"idempotency_key": "bad-prio", "payload": 1, "priority": 12}, "priority"),
        ({"idempotency_key": "bad-float", "payload": 1, "max_attempts": 2.0}, "max_attempts"),
        ({"idempotency_key": "bad-field", "payload": 1, "colour": "red"}, "colour"),
        ({"idempotency_key": "bad-retry", "payload": 1, "retry": {"multiplier": 11}}, "multiplier"),
        ({"idempotency_key": "bad-backoff", "payload": 1, "retry": {"max_backoff_ms": 10}}, "max_backoff_ms"),
        ({"idempotency_key": "bad-big", "payload": "x" * (PAYLOAD_LIMIT - 1)}, "payload"),
        ({"idempotency_key": "bad-avail", "payload": 1, "available_at": past}, "available_at"),
        ({"idempotency_key": "bad-start", "payload": 1, "start_deadline_at": past}, "start_deadline_at"),
        ({"idempotency_key": "bad-dl", "payload": 1, "deadline_at": past}, "deadline_at"),
        ({"idempotency_key": "bad-both", "payload": 1, "deadline_at": fmt(utcnow() + timedelta(hours=1)),
          "deadline_seconds": 5}, "deadline"),
        ({"idempotency_key": "bad-rk", "payload": 1, "resource_keys": ["db-primary"]}, "resource_keys"),
        ({"idempotency_key": "bad-rk-dup", "payload": 1, "resource_keys": ["a", "a"]}, "resource_keys"),
        ({"idempotency_key": "bad-rk-many", "payload": 1, "resource_keys": ["a", "b", "c", "d", "e"]}, "resource_keys"),
        ({"idempotency_key": "ok-1", "payload": "x" * (PAYLOAD_LIMIT - 2)}, None),
        ({"idempotency_key": "ok-2", "payload": 2, "priority": 0}, None),
    ]
    data = await batch(tenant, q, [item for item, _ in cases])
    accepted = 0
    for i, ((item, field), result) in enumerate(zip(cases, data["results"], strict=True)):
        if field is None:
            assert error_of(result) is None and result["deduplicated"] is False, (i, result)
            assert result["task"]["payload"] == item["payload"]
            accepted += 1
        else:
            assert error_of(result) == "INVALID_ARGUMENT", (i, item, result)
            assert field in result["error"]["message"], (i, field, result)
            key = item.get("idempotency_key")
            if isinstance(key, str) and key:
                assert await idempotency_records_for(tenant, key) == [], key
    assert await counter_invariant(tenant, q["id"]) == accepted == 3


async def test_a_non_object_item_is_a_per_item_error(tenant):
    q = await tenant.create_queue()
    items = [{"idempotency_key": "a", "payload": 1}, 5, "task", None, [], {"idempotency_key": "b", "payload": 2}]
    data = await batch(tenant, q, items)
    codes = [error_of(r) for r in data["results"]]
    assert codes == [None, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT", None]
    for i in (1, 2, 3, 4):
        assert f"tasks[{i}]" in data["results"][i]["error"]["message"]
    assert await counter_invariant(tenant, q["id"]) == 2


async def test_duplicate_keys_inside_one_batch(tenant):
    q = await tenant.create_queue()
    items = [
        {"idempotency_key": "dup", "payload": {"v": 1}},
        {"idempotency_key": "dup", "payload": {"v": 1}},  # same content: the first one's task
        {"idempotency_key": "dup", "payload": {"v": 2}},  # different content: conflict
        {"idempotency_key": "dup", "payload": {"v": 1}, "priority": 5},  # explicit default: different digest
        {"idempotency_key": "other", "payload": {"v": 1}},
    ]
    data = await batch(tenant, q, items)
    r = data["results"]
    assert [error_of(x) for x in r] == [None, None, "IDEMPOTENCY_CONFLICT", "IDEMPOTENCY_CONFLICT", None]
    assert r[0]["deduplicated"] is False and r[1]["deduplicated"] is True
    assert r[1]["task"] == r[0]["task"]
    assert r[4]["task"]["id"] != r[0]["task"]["id"]
    assert len(await idempotency_records_for(tenant, "dup")) == 1
    assert await counter_invariant(tenant, q["id"]) == 2


async def test_queue_full_stops_new_items_but_not_replays(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=4)
    earlier = await submit(tenant, q, {"payload": "earlier"}, key="earlier")
    items = [
        {"idempotency_key": "n-1", "payload": 1},
        {"idempotency_key": "n-2", "payload": 2},
        {"idempotency_key": "n-3", "payload": 3},
        {"idempotency_key": "n-4", "payload": 4},  # the fifth slot: full
        {"idempotency_key": "earlier", "payload": "earlier"},  # replay of an accepted single submit
        {"idempotency_key": "n-5", "payload": 5, "priority": 9},  # no reordering past a full queue
        {"idempotency_key": "n-1", "payload": 1},  # replay of an item accepted above
        {"idempotency_key": "n-4", "payload": 4},  # same identity as the refused item: refused too
        {"idempotency_key": "bad", "payload": None},
    ]
    data = await batch(tenant, q, items)
    r = data["results"]
    assert [error_of(x) for x in r] == [
        None, None, None, "QUEUE_FULL", None, "QUEUE_FULL", None, "QUEUE_FULL", "INVALID_ARGUMENT"
    ]
    for i in (3, 5, 7):
        assert r[i] == {"error": QUEUE_FULL_ERROR}
    assert r[4] == {"deduplicated": True, "task": earlier}
    assert r[6] == {"deduplicated": True, "task": r[0]["task"]}
    for key in ("n-4", "n-5", "bad"):
        assert await idempotency_records_for(tenant, key) == []
    assert await counter_invariant(tenant, q["id"]) == 4

    # A fully refused batch of new items changes nothing but its own batch record.
    before = await snapshot(tenant, q["id"])
    data = await batch(tenant, q, [{"idempotency_key": "n-6", "payload": 6}, {"idempotency_key": "n-1", "payload": 1}])
    assert [error_of(x) for x in data["results"]] == ["QUEUE_FULL", None]
    after = await snapshot(tenant, q["id"])
    assert after["tasks"] == before["tasks"] and after["usage"] == before["usage"]
    assert after["counts"]["event_batches"] == before["counts"]["event_batches"]

    # Once space frees up, the refused identities are accepted, alone or in a batch.
    assert (await cancel(tenant, earlier["id"])).status_code == 200
    assert (await cancel(tenant, r[0]["task"]["id"])).status_code == 200
    await submit(tenant, q, {"payload": 4}, key="n-4")
    data = await batch(tenant, q, [{"idempotency_key": "n-5", "payload": 5, "priority": 9}])
    assert data["results"][0]["deduplicated"] is False and data["results"][0]["task"]["priority"] == 9
    assert await counter_invariant(tenant, q["id"]) == 4


async def test_whole_batch_replay_returns_the_original_results(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=2)
    items = [
        {"idempotency_key": "r-1", "payload": {"big": "y" * 1000}},
        {"idempotency_key": "r-2", "payload": 2, "priority": 1},
        {"idempotency_key": "r-3", "payload": 3},  # full
        {"idempotency_key": "r-4", "payload": None},  # invalid
    ]
    first = await batch(tenant, q, items, key="batch-1")
    assert [error_of(x) for x in first["results"]] == [None, None, "QUEUE_FULL", "INVALID_ARGUMENT"]
    before = await snapshot(tenant, q["id"])

    again = await batch(tenant, q, items, key="batch-1")
    assert again == {"deduplicated": True, "results": first["results"]}
    assert again["results"][0]["task"]["payload"] == {"big": "y" * 1000}
    assert await snapshot(tenant, q["id"]) == before
    # The same body under a new header key is a new batch: item identities replay, the full item stays full.
    fresh = await batch(tenant, q, items, key="batch-2")
    assert fresh["deduplicated"] is False
    assert [error_of(x) for x in fresh["results"]] == [None, None, "QUEUE_FULL", "INVALID_ARGUMENT"]
    assert [x.get("deduplicated") for x in fresh["results"][:2]] == [True, True]
    assert [x["task"] for x in fresh["results"][:2]] == [x["task"] for x in first["results"][:2]]

    # The same header key with another body conflicts.
    before = await snapshot(tenant, q["id"])
    others = (items[:3], items + [{"idempotency_key": "r-5", "payload": 5}], [dict(items[0], payload=1)] + items[1:])
    for other in others:
        r = await tenant.post(batch_path(q), {"tasks": other}, key="batch-1")
        assert_error(r, 409, "IDEMPOTENCY_CONFLICT")
    assert await snapshot(tenant, q["id"]) == before

    # Even after the tasks changed and the queue got retired, the replay is the original.
    for x in first["results"][:2]:
        assert (await cancel(tenant, x["task"]["id"])).status_code == 200
    await retire(tenant, q["id"])
    assert await batch(tenant, q, items, key="batch-1") == {"deduplicated": True, "results": first["results"]}


async def test_batch_item_identity_is_the_single_submit_identity(tenant):
    q = await tenant.create_queue()
    single = await submit(tenant, q, {"payload": "s", "priority": 3}, key="single")
    data = await batch(tenant, q, [
        {"idempotency_key": "single", "priority": 3, "payload": "s"},
        {"idempotency_key": "single", "payload": "s"},
        {"idempotency_key": "item", "payload": {"i": 1}, "max_attempts": 7},
    ])
    r = data["results"]
    assert r[0] == {"deduplicated": True, "task": single}
    assert error_of(r[1]) == "IDEMPOTENCY_CONFLICT"
    item_task = r[2]["task"]
    before = await snapshot(tenant, q["id"])
    replay = ok(await tenant.post(tasks_path(q), {"max_attempts": 7, "payload": {"i": 1}}, key="item"))
    assert replay == {"deduplicated": True, "task": item_task}
    assert_error(await tenant.post(tasks_path(q), {"payload": {"i": 1}}, key="item"), 409, "IDEMPOTENCY_CONFLICT")
    # The identity includes the queue.
    other = await tenant.create_queue()
    data = await batch(tenant, other, [{"idempotency_key": "item", "payload": {"i": 1}, "max_attempts": 7}])
    assert error_of(data["results"][0]) == "IDEMPOTENCY_CONFLICT"
    after = await snapshot(tenant, q["id"])
    assert after["tasks"] == before["tasks"]


async def test_retired_queue_refuses_new_items_but_replays_old_ones(tenant):
    q = await tenant.create_queue()
    data = await batch(tenant, q, [{"idempotency_key": "old", "payload": 1}])
    old = data["results"][0]["task"]
    assert (await cancel(tenant, old["id"])).status_code == 200
    await retire(tenant, q["id"])
    before = await snapshot(tenant, q["id"])
    r = await tenant.post(batch_path(q), {"tasks": [{"idempotency_key": "old", "payload": 1},
                                                    {"idempotency_key": "new", "payload": 2}]})
    if r.status_code == 200:
        results = ok(r)["results"]
        assert results[0] == {"deduplicated": True, "task": old}
        assert error_of(results[1]) == "STATE_CONFLICT"
    else:
        assert_error(r, 409, "STATE_CONFLICT")
    after = await snapshot(tenant, q["id"])
    assert after["tasks"] == before["tasks"] and after["counts"]["event_batches"] == before["counts"]["event_batches"]
    assert await idempotency_records_for(tenant, "new") == []


async def test_batch_authorization(tenant):
    q = await tenant.create_queue()
    other = await tenant.create_queue()
    reader = await tenant.credential(["tasks:read"])
    scoped = await tenant.credential(["tasks:submit"], queue_scope=[other["id"]])
    before = await snapshot(tenant, q["id"])
    body = {"tasks": [{"idempotency_key": "a", "payload": 1}]}
    assert_error(await tenant.post(batch_path(q), body, token=reader), 403, "PERMISSION_DENIED")
    assert_error(await tenant.post(batch_path(q), body, token=scoped), 404, "NOT_FOUND")
    assert_error(await tenant.post(batch_path("0" * 32), body), 404, "NOT_FOUND")
    assert_error(await tenant.post(batch_path("nope"), body), 404, "NOT_FOUND")
    assert await snapshot(tenant, q["id"]) == before
    data = ok(await tenant.post(batch_path(other), body, token=scoped))
    assert data["results"][0]["task"]["queue_id"] == other["id"]


async def test_batch_payloads_round_trip_exactly(tenant):
    q = await tenant.create_queue()
    payloads = [{"a": [1, 2.5, None, True]}, "ünïcødé ✓", 0, False, [], {"nested": {"x": {"y": "z"}}}]
    items = [{"idempotency_key": f"p-{i}", "payload": p} for i, p in enumerate(payloads)]
    data = await batch(tenant, q, items)
    for p, res in zip(payloads, data["results"], strict=True):
        assert res["task"]["payload"] == p
        assert orjson.dumps(ok(await tenant.get(f"/v1/tasks/{res['task']['id']}"))["payload"]) == orjson.dumps(p)


async def test_a_refused_item_leaves_its_key_free_for_a_later_item(tenant):
    """A rejected item leaves no record, so a later item of the batch may use its key again."""
    q = await tenant.create_queue(max_unfinished_tasks=2)
    past = fmt(utcnow() - timedelta(hours=1))
    items = [
        {"idempotency_key": "k-null", "payload": None},  # invalid shape
        {"idempotency_key": "k-null", "payload": "fixed"},
        {"idempotency_key": "k-past", "payload": 1, "available_at": past},  # invalid by a time rule
        {"idempotency_key": "k-past", "payload": 1},
        {"idempotency_key": "k-full", "payload": 3},  # the queue is full by now
        {"idempotency_key": "k-full", "payload": 4},  # a new item after a full queue: full too
        {"idempotency_key": "k-full", "payload": 3},
    ]
    data = await batch(tenant, q, items)
    r = data["results"]
    assert [error_of(x) for x in r] == [
        "INVALID_ARGUMENT", None, "INVALID_ARGUMENT", None, "QUEUE_FULL", "QUEUE_FULL", "QUEUE_FULL"
    ]
    assert r[1]["deduplicated"] is False and r[1]["task"]["payload"] == "fixed"
    assert r[3]["deduplicated"] is False and r[3]["task"]["payload"] == 1
    assert await idempotency_records_for(tenant, "k-full") == []
    assert await counter_invariant(tenant, q["id"]) == 2


async def test_a_batch_record_refers_to_its_items_receipts(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=2)
    items = [
        {"idempotency_key": "c-1", "payload": {"big": "z" * 2000}},
        {"idempotency_key": "c-1", "payload": {"big": "z" * 2000}},  # the same key again: a replay of item 0
        {"idempotency_key": "c-2", "payload": 2},
        {"idempotency_key": "c-3", "payload": 3},  # full
    ]
    first = await batch(tenant, q, items, key="compact")
    assert [error_of(x) for x in first["results"]] == [None, None, None, "QUEUE_FULL"]
    [record] = await idempotency_records_for(tenant, "compact")
    stored = orjson.loads(record["response"])["results"]
    assert stored[:3] == [{"deduplicated": False, "ref": "c-1"}, {"deduplicated": True, "ref": "c-1"},
                          {"deduplicated": False, "ref": "c-2"}]
    assert stored[3]["error"]["code"] == "QUEUE_FULL"
    assert len(record["response"]) < 300  # no task snapshot, no payload
    assert await batch(tenant, q, items, key="compact") == {"deduplicated": True, "results": first["results"]}


async def test_a_batch_whose_item_receipts_were_pruned_runs_as_new(tenant):
    from sqlalchemy import delete

    from orbit.server.store.tables import idempotency_records as records

    q = await tenant.create_queue()
    items = [{"idempotency_key": "p-1", "payload": 1}, {"idempotency_key": "p-2", "payload": 2}]
    first = await batch(tenant, q, items, key="pruned-batch")

    async def prune_items(tx):
        await tx.execute(delete(records).where(records.c.namespace_id == tenant.namespace_id,
                                               records.c.idem_key.in_(["p-1", "p-2"])))

    await tenant.db.core_transaction(prune_items)
    again = await batch(tenant, q, items, key="pruned-batch")
    assert again["deduplicated"] is False
    assert [x["deduplicated"] for x in again["results"]] == [False, False]
    assert {x["task"]["id"] for x in again["results"]}.isdisjoint({x["task"]["id"] for x in first["results"]})
    assert await batch(tenant, q, items, key="pruned-batch") == {"deduplicated": True, "results": again["results"]}
    assert await counter_invariant(tenant, q["id"]) == 4
