"""Task identity (Idempotency-Key) and the backlog limit of a queue."""

from __future__ import annotations

import pytest

from .conftest import make_tenant
from .task_helpers import (
    assert_error,
    assert_fresh_task,
    assert_queue_full,
    cancel,
    configure,
    counter_invariant,
    idempotency_records_for,
    in_seconds,
    ok,
    retire,
    snapshot,
    submit,
    tasks_path,
)

pytestmark = pytest.mark.anyio


async def test_same_key_same_content_replays_the_original_receipt(tenant):
    q = await tenant.create_queue()
    body = {"payload": {"image": "a.png", "sizes": [1, 2]}, "priority": 7, "retry": {"jitter": 0}}
    first = await submit(tenant, q, body, key="img-1")
    before = await snapshot(tenant, q["id"])
    assert before["unfinished"] == 1

    replay = ok(await tenant.post(tasks_path(q), body, key="img-1"))
    assert replay == {"deduplicated": True, "task": first}
    # Canonical JSON: key order and whitespace do not change the identity.
    reordered = {"retry": {"jitter": 0}, "priority": 7, "payload": {"sizes": [1, 2], "image": "a.png"}}
    assert ok(await tenant.post(tasks_path(q), reordered, key="img-1")) == {"deduplicated": True, "task": first}
    assert await snapshot(tenant, q["id"]) == before
    assert len(await idempotency_records_for(tenant, "img-1")) == 1


async def test_same_key_different_content_is_an_idempotency_conflict(tenant):
    q = await tenant.create_queue()
    other = await tenant.create_queue()
    await submit(tenant, q, {"payload": 1}, key="k")
    await submit(tenant, q, {"payload": 1, "priority": 7}, key="k7")
    before = await snapshot(tenant, q["id"])
    for path, body in (
        (tasks_path(q), {"payload": 2}),
        (tasks_path(q), {"payload": "1"}),
        # Omitted optional fields are not filled with defaults before digesting.
        (tasks_path(q), {"payload": 1, "priority": 5}),
        (tasks_path(q), {"payload": 1, "retry": {}}),
        # The queue is part of the identity.
        (tasks_path(other), {"payload": 1}),
    ):
        assert_error(await tenant.post(path, body, key="k"), 409, "IDEMPOTENCY_CONFLICT")
    assert_error(await tenant.post(tasks_path(q), {"payload": 1}, key="k7"), 409, "IDEMPOTENCY_CONFLICT")
    # A conflicting body that is also invalid is still refused, and never half-applied.
    r = await tenant.post(tasks_path(q), {"payload": 1, "priority": 99}, key="k")
    assert r.status_code in (400, 409), r.text
    assert await snapshot(tenant, q["id"]) == before
    assert await counter_invariant(tenant, other["id"]) == 0


async def test_replay_is_the_original_snapshot_not_the_live_task(tenant):
    q = await tenant.create_queue()
    first = await submit(tenant, q, {"payload": {"n": 1}}, key="orig")
    assert (await cancel(tenant, first["id"])).status_code == 200
    live = ok(await tenant.get(f"/v1/tasks/{first['id']}"))
    assert live["state"] == "CANCELLED"
    replay = ok(await tenant.post(tasks_path(q), {"payload": {"n": 1}}, key="orig"))
    assert replay == {"deduplicated": True, "task": first}
    assert replay["task"]["state"] == "WAITING" and replay["task"]["payload"] == {"n": 1}


async def test_replay_after_retries_and_a_result_is_still_the_submitted_snapshot(tenant):
    """The record keeps only what the task row cannot give back; every field that changes
    after submission (state, attempts, available_at, result, error, times) replays as submitted."""
    from datetime import timedelta

    import orjson
    from sqlalchemy import update

    from orbit.server.store.tables import tasks

    q = await tenant.create_queue()
    body = {"payload": {"n": 2}, "available_at": in_seconds(120), "deadline_seconds": 3600, "priority": 4}
    first = await submit(tenant, q, body, key="lived")
    [record] = await idempotency_records_for(tenant, "lived")
    assert len(record["response"]) < 120 and "payload" not in record["response"]

    async def live_a_life(tx):
        now = await tx.now()
        await tx.execute(update(tasks).where(tasks.c.id == first["id"]).values(
            state="SUCCEEDED", attempts=2, available_at=now + timedelta(minutes=9), result=orjson.dumps({"r": 1}).decode(),
            error=orjson.dumps({"code": "HANDLER_ERROR", "message": "m"}).decode(), cancel_requested=True,
            cancel_reason="why", updated_at=now + timedelta(seconds=5), finished_at=now + timedelta(seconds=5)))

    await tenant.db.core_transaction(live_a_life)
    assert ok(await tenant.get(f"/v1/tasks/{first['id']}"))["state"] == "SUCCEEDED"
    assert ok(await tenant.post(tasks_path(q), body, key="lived")) == {"deduplicated": True, "task": first}
    # The same key inside a batch replays the same snapshot.
    batch = ok(await tenant.post(f"/v1/queues/{q['id']}/tasks:batch", {"tasks": [{"idempotency_key": "lived", **body}]},
                                 key="lived-batch"))
    assert batch["results"] == [{"deduplicated": True, "task": first}]


async def test_a_task_available_at_once_keeps_no_response_and_replays_as_submitted(tenant):
    """Without `available_at`, the task was available from its acceptance: its record keeps no
    response (the task row's created_at is the snapshot's available_at), and a replay after the
    task moved on (a retry changed its available_at) still answers the original snapshot, alone
    and in a batch, as do the batch's own replay and a record written with a response."""
    from datetime import timedelta

    from sqlalchemy import update

    from orbit.server.store.tables import tasks

    q = await tenant.create_queue()
    body = {"payload": {"n": 3}, "priority": 6}
    first = await submit(tenant, q, body, key="at-once")
    assert first["available_at"] == first["created_at"]
    items = [{"idempotency_key": "at-once-in-batch", "payload": {"n": 4}},
             {"idempotency_key": "later-in-batch", "payload": {"n": 5}, "available_at": in_seconds(60)}]
    batch_path = f"/v1/queues/{q['id']}/tasks:batch"
    submitted = ok(await tenant.post(batch_path, {"tasks": items}, key="at-once-batch"))["results"]
    [record] = await idempotency_records_for(tenant, "at-once")
    assert record["response"] is None and record["resource_id"] == first["id"]
    [in_batch] = await idempotency_records_for(tenant, "at-once-in-batch")
    assert in_batch["response"] is None
    [later] = await idempotency_records_for(tenant, "later-in-batch")
    assert later["response"] is not None

    async def retried(tx):
        now = await tx.now()
        ids = [first["id"], *(r["task"]["id"] for r in submitted)]
        await tx.execute(update(tasks).where(tasks.c.id.in_(ids)).values(
            attempts=1, available_at=now + timedelta(minutes=3), updated_at=now + timedelta(seconds=1)))

    await tenant.db.core_transaction(retried)
    assert ok(await tenant.get(f"/v1/tasks/{first['id']}"))["available_at"] != first["available_at"]
    assert ok(await tenant.post(tasks_path(q), body, key="at-once")) == {"deduplicated": True, "task": first}
    again = ok(await tenant.post(batch_path, {"tasks": [{"idempotency_key": "at-once", **body}, *items]},
                                 key="at-once-batch-2"))
    assert again["results"] == [{"deduplicated": True, "task": first},
                                *({"deduplicated": True, "task": r["task"]} for r in submitted)]
    # The batch's own replay answers as the batch did, each item's task as submitted.
    assert ok(await tenant.post(batch_path, {"tasks": items}, key="at-once-batch"))["results"] == submitted


async def test_identity_is_scoped_to_the_namespace_and_checked_for_permissions(tenant, db, http):
    q = await tenant.create_queue()
    first = await submit(tenant, q, {"payload": 1}, key="shared-key")
    other_q = await tenant.create_queue()
    no_submit = await tenant.credential(["tasks:read", "tasks:cancel"])
    out_of_scope = await tenant.credential(["tasks:submit"], queue_scope=[other_q["id"]])
    another_submitter = await tenant.credential(["tasks:submit"], queue_scope=[q["id"]])
    before = await snapshot(tenant, q["id"])
    # Permissions are checked on replays too.
    r = await tenant.post(tasks_path(q), {"payload": 1}, key="shared-key", token=no_submit)
    assert_error(r, 403, "PERMISSION_DENIED")
    r = await tenant.post(tasks_path(q), {"payload": 1}, key="shared-key", token=out_of_scope)
    assert_error(r, 404, "NOT_FOUND")
    # Any credential of the namespace replays the same identity.
    r = await tenant.post(tasks_path(q), {"payload": 1}, key="shared-key", token=another_submitter)
    assert ok(r) == {"deduplicated": True, "task": first}
    assert await snapshot(tenant, q["id"]) == before

    # Another namespace's key space is its own.
    stranger = await make_tenant(db, http)
    sq = await stranger.create_queue()
    theirs = await submit(stranger, sq, {"payload": 1}, key="shared-key")
    assert theirs["id"] != first["id"]
    assert await snapshot(tenant, q["id"]) == before


async def test_queue_full_is_the_exact_429_and_leaves_no_record(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=1)
    first = await submit(tenant, q, {"payload": 1}, key="a")
    before = await snapshot(tenant, q["id"])
    for body, key in (({"payload": 2}, "b"), ({"payload": 2}, "b"), ({"payload": 3, "priority": 9}, "c")):
        assert_queue_full(await tenant.post(tasks_path(q), body, key=key))
        assert await idempotency_records_for(tenant, key) == []
    assert await snapshot(tenant, q["id"]) == before
    # A replay is answered first, whatever the fullness.
    assert ok(await tenant.post(tasks_path(q), {"payload": 1}, key="a")) == {"deduplicated": True, "task": first}

    assert ok(await cancel(tenant, first["id"]))["task"]["state"] == "CANCELLED"
    assert await counter_invariant(tenant, q["id"]) == 0
    # The rejected key left no record: it may even come back with other content.
    second = await submit(tenant, q, {"payload": "other content"}, key="b")
    assert_fresh_task(second, q)
    assert await counter_invariant(tenant, q["id"]) == 1
    assert ok(await tenant.post(tasks_path(q), {"payload": "other content"}, key="b"))["task"] == second
    assert_queue_full(await tenant.post(tasks_path(q), {"payload": 3, "priority": 9}, key="c"))


async def test_replays_survive_full_paused_and_retired_queues(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=1)
    a = await submit(tenant, q, {"payload": "a"}, key="a")
    assert_queue_full(await tenant.post(tasks_path(q), {"payload": "x"}))
    assert ok(await tenant.post(tasks_path(q), {"payload": "a"}, key="a")) == {"deduplicated": True, "task": a}

    paused = await configure(tenant, q["id"], paused=True)
    assert paused["paused"] is True
    assert ok(await tenant.post(tasks_path(q), {"payload": "a"}, key="a")) == {"deduplicated": True, "task": a}
    assert_queue_full(await tenant.post(tasks_path(q), {"payload": "x"}))
    assert (await cancel(tenant, a["id"])).status_code == 200
    # A paused queue accepts tasks.
    b = await submit(tenant, q, {"payload": "b"}, key="b")
    assert_fresh_task(b, q)
    assert (await cancel(tenant, b["id"])).status_code == 200
    assert await counter_invariant(tenant, q["id"]) == 0

    retired = await retire(tenant, q["id"])
    assert retired["retired_at"] is not None
    before = await snapshot(tenant, q["id"])
    for key, body, task in (("a", {"payload": "a"}, a), ("b", {"payload": "b"}, b)):
        assert ok(await tenant.post(tasks_path(q), body, key=key)) == {"deduplicated": True, "task": task}
    # A retired queue accepts no new task; the refused key leaves no record.
    r = await tenant.post(tasks_path(q), {"payload": "new"}, key="new-after-retire")
    assert_error(r, 409, "STATE_CONFLICT")
    assert await idempotency_records_for(tenant, "new-after-retire") == []
    assert_error(await tenant.post(tasks_path(q), {"payload": "changed"}, key="a"), 409, "IDEMPOTENCY_CONFLICT")
    assert await snapshot(tenant, q["id"]) == before


async def test_paused_queue_accepts_tasks(tenant):
    q = await tenant.create_queue()
    await configure(tenant, q["id"], paused=True)
    t = await submit(tenant, q, {"payload": 1, "priority": 9})
    assert_fresh_task(t, q)
    assert await counter_invariant(tenant, q["id"]) == 1


async def test_lowering_the_backlog_limit_keeps_tasks_and_refuses_new_ones(tenant):
    q = await tenant.create_queue(max_unfinished_tasks=5)
    ids = [(await submit(tenant, q, {"payload": i}))["id"] for i in range(3)]
    lowered = await configure(tenant, q["id"], max_unfinished_tasks=1)
    assert lowered["max_unfinished_tasks"] == 1
    assert await counter_invariant(tenant, q["id"]) == 3
    for task_id in ids:
        assert ok(await tenant.get(f"/v1/tasks/{task_id}"))["state"] == "WAITING"
    before = await snapshot(tenant, q["id"])
    assert_queue_full(await tenant.post(tasks_path(q), {"payload": "new"}, key="new"))
    assert await snapshot(tenant, q["id"]) == before
    for n, task_id in enumerate(ids, start=1):
        assert ok(await cancel(tenant, task_id))["task"]["state"] == "CANCELLED"
        assert await counter_invariant(tenant, q["id"]) == 3 - n
        r = await tenant.post(tasks_path(q), {"payload": "new"}, key="new")
        if n < 3:
            assert_queue_full(r)  # still at or above the new limit of 1
        else:
            assert_fresh_task(ok(r, 201)["task"], q)
    assert await counter_invariant(tenant, q["id"]) == 1
    assert_queue_full(await tenant.post(tasks_path(q), {"payload": "one more"}))


async def test_acceptance_sequence_of_queues_md(tenant):
    """Backlog 2: two accepted, the third 429, replay, cancel, the third again with its identity."""
    q = await tenant.create_queue(max_unfinished_tasks=2, max_concurrency=2, rate_per_second=1)
    await configure(tenant, q["id"], paused=True)
    bodies = [{"payload": {"echo": n}, "deadline_seconds": 20} for n in (1, 2, 3)]
    first = await submit(tenant, q, bodies[0], key="acceptance-1")
    second = await submit(tenant, q, bodies[1], key="acceptance-2")
    assert await counter_invariant(tenant, q["id"]) == 2

    before = await snapshot(tenant, q["id"])
    third = await tenant.post(tasks_path(q), bodies[2], key="acceptance-3")
    assert_queue_full(third)
    assert await idempotency_records_for(tenant, "acceptance-3") == []
    duplicate = ok(await tenant.post(tasks_path(q), bodies[0], key="acceptance-1"))
    assert duplicate == {"deduplicated": True, "task": first}
    assert await snapshot(tenant, q["id"]) == before

    cancelled = ok(await cancel(tenant, first["id"], "make room"))
    assert cancelled["task"]["state"] == "CANCELLED"
    assert await counter_invariant(tenant, q["id"]) == 1
    retried = ok(await tenant.post(tasks_path(q), bodies[2], key="acceptance-3"), 201)
    assert retried["deduplicated"] is False
    assert_fresh_task(retried["task"], q)
    assert retried["task"]["payload"] == {"echo": 3}
    assert await counter_invariant(tenant, q["id"]) == 2

    resumed = await configure(tenant, q["id"], paused=False)
    assert resumed["paused"] is False and resumed["unfinished_tasks"] == "2"
    for t in (second, retried["task"]):
        assert ok(await tenant.get(f"/v1/tasks/{t['id']}"))["state"] == "WAITING"
        # No worker here: cancel rather than leave 20-second deadlines to other tests' sweeps.
        assert (await cancel(tenant, t["id"], "cleanup")).status_code == 200
    assert await counter_invariant(tenant, q["id"]) == 0


async def test_application_quota_is_checked_after_the_queue_limit(tenant):
    from sqlalchemy import update

    from orbit.server.store.tables import applications

    async def set_quota(tx):
        await tx.execute(
            update(applications).where(applications.c.id == tenant.application["id"]).values(max_unfinished_tasks=2)
        )

    await tenant.db.core_transaction(set_quota)
    q1 = await tenant.create_queue()
    q2 = await tenant.create_queue()
    a = await submit(tenant, q1, {"payload": 1}, key="app-a")
    await submit(tenant, q2, {"payload": 2})
    before = await snapshot(tenant, q1["id"])
    for q in (q1, q2):
        r = await tenant.post(tasks_path(q), {"payload": 3}, key="app-c")
        err = assert_error(r, 429, "APPLICATION_FULL")
        assert r.headers.get("retry-after") == "1" and "details" not in err
        assert await idempotency_records_for(tenant, "app-c") == []
    data = ok(await tenant.post(f"{tasks_path(q1)}:batch", {"tasks": [
        {"idempotency_key": "app-a", "payload": 1}, {"idempotency_key": "app-d", "payload": 4},
    ]}))
    assert data["results"][0] == {"deduplicated": True, "task": a}
    assert data["results"][1]["error"]["code"] == "APPLICATION_FULL"
    after = await snapshot(tenant, q1["id"])
    assert after["tasks"] == before["tasks"] and after["usage"] == before["usage"]
    assert await counter_invariant(tenant, q2["id"]) == 1
    assert (await cancel(tenant, a["id"])).status_code == 200
    await submit(tenant, q2, {"payload": 3}, key="app-c")


async def test_concurrent_submits_never_exceed_the_limit(tenant):
    import asyncio

    q = await tenant.create_queue(max_unfinished_tasks=3)
    responses = await asyncio.gather(*(tenant.post(tasks_path(q), {"payload": i}) for i in range(8)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [201] * 3 + [429] * 5, [r.text for r in responses]
    assert await counter_invariant(tenant, q["id"]) == 3


async def test_concurrent_submits_with_one_key_create_one_task(tenant):
    import asyncio

    q = await tenant.create_queue()
    responses = await asyncio.gather(*(tenant.post(tasks_path(q), {"payload": "same"}, key="race") for _ in range(5)))
    assert sorted(r.status_code for r in responses) == [200] * 4 + [201], [r.text for r in responses]
    tasks = [ok(r, r.status_code)["task"] for r in responses]
    assert all(t == tasks[0] for t in tasks)
    assert await counter_invariant(tenant, q["id"]) == 1


async def test_concurrent_submits_sharing_a_transaction_keep_their_own_outcomes(tenant):
    """Single submits that arrive together are admitted in one transaction (group commit);
    each still gets its own status: a key reused with another body conflicts, a full queue
    refuses only the submits beyond its room, and each accepted task has its own receipt."""
    import asyncio

    q = await tenant.create_queue(max_unfinished_tasks=3)
    responses = await asyncio.gather(
        tenant.post(tasks_path(q), {"payload": "a"}, key="k1"),
        tenant.post(tasks_path(q), {"payload": "b"}, key="k1"),
        *(tenant.post(tasks_path(q), {"payload": i}, key=f"n{i}") for i in range(4)),
    )
    by_key = [r.status_code for r in responses]
    assert sorted(by_key[:2]) == [201, 409], [r.text for r in responses]
    assert sorted(by_key) == [201] * 3 + [409] + [429] * 2, [r.text for r in responses]
    ids = {ok(r, 201)["task"]["id"] for r in responses if r.status_code == 201}
    assert len(ids) == 3
    assert await counter_invariant(tenant, q["id"]) == 3


async def test_one_key_submitted_through_two_transactions_at_once_creates_one_task(tenant):
    """As two nodes would: each transaction finds no receipt, and the second one's deferred
    receipt INSERT meets the first one's key. It runs again and replays the first task."""
    import asyncio

    from orbit.server.core.permissions import ALL_PERMISSIONS
    from orbit.server.services import tasks as svc
    from orbit.server.services.auth import Principal

    q = await tenant.create_queue()
    who = Principal(tenant.credential_id, tenant.application["id"], tenant.namespace_id,
                    frozenset(ALL_PERMISSIONS), "*")
    for round_ in range(5):
        raw = {"payload": {"round": round_}}
        cmd = svc.SubmitCommand(f"race-{round_}", svc.submit_digest(q["id"], raw),
                                svc.SubmitTaskRequest.model_validate(raw), raw)
        other = svc.SubmitCommand(f"other-{round_}", svc.submit_digest(q["id"], {"payload": 0}),
                                  svc.SubmitTaskRequest.model_validate({"payload": 0}), {"payload": 0})
        groups = await asyncio.gather(
            svc.submit_group(tenant.db, [svc.QueuedSubmit(who, q["id"], cmd)]),
            svc.submit_group(tenant.db, [svc.QueuedSubmit(who, q["id"], cmd), svc.QueuedSubmit(who, q["id"], other)]),
        )
        ((a,), _), ((b, c), _) = groups
        assert a.error is None and b.error is None and c.error is None
        assert a.outcome.resource_id == b.outcome.resource_id
        assert sorted([a.outcome.deduplicated, b.outcome.deduplicated]) == [False, True]
        assert not c.outcome.deduplicated
    assert await counter_invariant(tenant, q["id"]) == 10
