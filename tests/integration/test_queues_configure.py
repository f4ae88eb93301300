"""POST /v1/queues/{queue_id}:configure — replace every control at once."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from .conftest import make_tenant
from .queue_helpers import (
    assert_error,
    assert_queue_object,
    audit_rows,
    configure_body,
    event_rows,
    idempotency_count,
    ok,
    retire_body,
    state,
)

pytestmark = pytest.mark.anyio


def path(q: dict[str, Any]) -> str:
    return f"/v1/queues/{q['id']}:configure"


async def rejected(tenant, db, q, bodies: list[tuple[Any, str | None]]) -> None:
    """Each body gets 400 INVALID_ARGUMENT naming the field; nothing is written, no key is kept."""
    before = await state(db, tenant.namespace_id)
    for body, field in bodies:
        key = tenant.key()
        r = await tenant.post(path(q), body, key=key)
        try:
            assert_error(r, 400, "INVALID_ARGUMENT", field)
        except AssertionError as exc:
            raise AssertionError(f"body {body!r}: {exc}") from None
    assert await state(db, tenant.namespace_id) == before


async def test_configure_replaces_every_control_and_bumps_the_revision(tenant):
    q = await tenant.create_queue(max_concurrency=8, rate_per_second=100)
    body = configure_body("1", paused=True, max_concurrency=2, rate_per_second=1, max_unfinished_tasks=100)
    data = ok(await tenant.post(path(q), body))
    assert set(data) == {"deduplicated", "queue"} and data["deduplicated"] is False
    after = data["queue"]
    assert_queue_object(after)
    assert after["revision"] == "2"
    assert (after["paused"], after["max_concurrency"], after["rate_per_second"], after["max_unfinished_tasks"]) == (
        True, 2, 1, 100,
    )
    for unchanged in ("id", "namespace_id", "name", "created_at", "retired_at", "unfinished_tasks"):
        assert after[unchanged] == q[unchanged], unchanged
    assert after["updated_at"] > q["updated_at"]
    assert ok(await tenant.get(f"/v1/queues/{q['id']}")) == after

    # Resume: every control is replaced again, the revision moves on.
    body = configure_body("2", paused=False, max_concurrency=100_000, rate_per_second=1_000_000,
                          max_unfinished_tasks=1_000_000)
    resumed = ok(await tenant.post(path(q), body))["queue"]
    assert resumed["revision"] == "3" and resumed["paused"] is False
    assert (resumed["max_concurrency"], resumed["rate_per_second"], resumed["max_unfinished_tasks"]) == (
        100_000, 1_000_000, 1_000_000,
    )
    assert resumed["updated_at"] > after["updated_at"]
    body = configure_body("3", paused=True, max_concurrency=1, rate_per_second=1, max_unfinished_tasks=1)
    assert ok(await tenant.post(path(q), body))["queue"]["revision"] == "4"


async def test_replay_returns_the_original_snapshot_after_later_configures(tenant, db):
    q = await tenant.create_queue()
    key = tenant.key()
    body = configure_body("1", paused=True)
    first = ok(await tenant.post(path(q), body, key=key))
    ok(await tenant.post(path(q), configure_body("2", max_concurrency=77)))
    before = await state(db, tenant.namespace_id)
    replay = ok(await tenant.post(path(q), body, key=key))
    assert replay == {"deduplicated": True, "queue": first["queue"]}
    assert replay["queue"]["revision"] == "2"
    assert await state(db, tenant.namespace_id) == before
    live = ok(await tenant.get(f"/v1/queues/{q['id']}"))
    assert live["revision"] == "3" and live["max_concurrency"] == 77


async def test_same_key_different_content_is_an_idempotency_conflict(tenant, db):
    q = await tenant.create_queue()
    key = tenant.key()
    ok(await tenant.post(path(q), configure_body("1"), key=key))
    before = await state(db, tenant.namespace_id)
    for body in (
        configure_body("1", reason="another reason"),
        configure_body("1", paused=True),
        configure_body("2"),
    ):
        assert_error(await tenant.post(path(q), body, key=key), 409, "IDEMPOTENCY_CONFLICT")
    assert await state(db, tenant.namespace_id) == before


async def test_stale_or_future_revision_with_a_new_key_is_a_state_conflict(tenant, db):
    q = await tenant.create_queue()
    ok(await tenant.post(path(q), configure_body("1")))
    before = await state(db, tenant.namespace_id)
    for rev in ("1", "3", "99", "18446744073709551615"):
        key = tenant.key()
        err = assert_error(await tenant.post(path(q), configure_body(rev), key=key), 409, "STATE_CONFLICT")
        assert err.get("details", {}).get("current_revision") == "2", err
        assert await idempotency_count(db, tenant.namespace_id, key) == 0
    assert await state(db, tenant.namespace_id) == before


async def test_a_rejected_configure_leaves_no_record_so_the_key_can_be_reused(tenant, db):
    q = await tenant.create_queue()
    key = tenant.key()
    assert_error(await tenant.post(path(q), configure_body("5"), key=key), 409, "STATE_CONFLICT")
    assert_error(await tenant.post(path(q), configure_body("0"), key=key), 400, "INVALID_ARGUMENT")
    assert await idempotency_count(db, tenant.namespace_id, key) == 0
    assert ok(await tenant.post(path(q), configure_body("1"), key=key))["deduplicated"] is False


async def test_expected_revision_must_be_a_canonical_nonzero_uint64_string(tenant, db):
    q = await tenant.create_queue()
    values = [
        "0", "00", "01", "-1", "+1", "abc", "1.0", "1e0", "0x1", " 1", "1 ", "1\n", "\u0661", "１", "",
        "18446744073709551616", "99999999999999999999", "100000000000000000000",
        1, 1.0, 0, True, None, [], {},
    ]
    await rejected(tenant, db, q, [(configure_body(v), "expected_revision") for v in values])


async def test_every_field_is_required(tenant, db):
    q = await tenant.create_queue()
    bodies = []
    for field in ("expected_revision", "reason", "paused", "max_concurrency", "rate_per_second",
                  "max_unfinished_tasks"):
        body = configure_body("1")
        del body[field]
        bodies.append((body, field))
        bodies.append((configure_body("1") | {field: None}, field))
    await rejected(tenant, db, q, bodies + [({}, None)])


async def test_paused_must_be_an_explicit_boolean(tenant, db):
    q = await tenant.create_queue()
    await rejected(tenant, db, q, [(configure_body("1", paused=v), "paused") for v in ("true", "false", 1, 0, "")])


async def test_limits_are_range_checked_and_zero_is_not_a_default_here(tenant, db):
    q = await tenant.create_queue()
    cases = [
        ("max_concurrency", 0), ("max_concurrency", 100_001), ("max_concurrency", -1),
        ("rate_per_second", 0), ("rate_per_second", 1_000_001),
        ("max_unfinished_tasks", 0), ("max_unfinished_tasks", 1_000_001), ("max_unfinished_tasks", -1),
    ]
    wrong_types = [8.0, "8", True]
    bodies = [(configure_body("1", **{f: v}), f) for f, v in cases]
    bodies += [(configure_body("1", **{f: v}), f) for f in ("max_concurrency", "rate_per_second",
                                                            "max_unfinished_tasks") for v in wrong_types]
    await rejected(tenant, db, q, bodies)


async def test_unknown_fields_are_rejected(tenant, db):
    q = await tenant.create_queue()
    fields = ["name", "revision", "retired_at", "id", "Paused"]
    await rejected(tenant, db, q, [(configure_body("1") | {f: "x"}, f) for f in fields])


async def test_reason_rules(tenant, db):
    q = await tenant.create_queue()
    bad = ["", " ", "\t\n ", "\u3000", "x" * 1025, "é" * 1025, "😀" * 1025, 123, True, ["why"]]
    await rejected(tenant, db, q, [(configure_body("1", reason=v), "reason") for v in bad])
    # At most 1024 Unicode characters, whatever their UTF-8 length.
    revision = 1
    for reason in ("x" * 1024, "é" * 1024, "😀" * 1024, "名" * 1024, " padded\nreason "):
        after = ok(await tenant.post(path(q), configure_body(str(revision), reason=reason)))["queue"]
        revision += 1
        assert after["revision"] == str(revision)
        audit = (await audit_rows(db, q["id"]))[-1]
        assert audit["reason"] == reason


async def test_configure_writes_the_audit_record_and_the_event(tenant, db):
    q = await tenant.create_queue()
    key = tenant.key()
    reason = "limit background traffic ☂"
    r = await tenant.post(path(q), configure_body("1", reason=reason, paused=True), key=key)
    after = ok(r)["queue"]
    audits = await audit_rows(db, q["id"])
    assert [a["action"] for a in audits] == ["queue.create", "queue.configure"]
    audit = audits[-1]
    assert audit["namespace_id"] == tenant.namespace_id and audit["resource_type"] == "queue"
    assert audit["reason"] == reason
    assert audit["actor_credential_id"] == tenant.credential_id
    assert audit["request_id"] == r.headers["x-request-id"] == r.json()["request_id"]
    assert audit["idempotency_key"] == key
    assert orjson.loads(audit["before"]) == q
    assert orjson.loads(audit["after"]) == after
    events = await event_rows(db, q["id"])
    assert [e["type"] for e in events] == ["queue.created", "queue.configured"]
    data = orjson.loads(events[-1]["data"])
    assert data["queue"] == after and data["reason"] == reason
    assert events[-1]["namespace_id"] == tenant.namespace_id and events[-1]["resource_type"] == "queue"
    # A replay writes neither another audit record nor another event.
    ok(await tenant.post(path(q), configure_body("1", reason=reason, paused=True), key=key))
    assert len(await audit_rows(db, q["id"])) == 2 and len(await event_rows(db, q["id"])) == 2


async def test_configuring_a_retired_queue_is_a_state_conflict(tenant, db):
    q = await tenant.create_queue()
    ok(await tenant.post(f"/v1/queues/{q['id']}:retire", retire_body("1")))
    before = await state(db, tenant.namespace_id)
    for rev in ("2", "1"):
        assert_error(await tenant.post(path(q), configure_body(rev)), 409, "STATE_CONFLICT")
    assert await state(db, tenant.namespace_id) == before


async def test_configure_of_a_missing_malformed_or_foreign_queue_is_404(tenant, db, http):
    other = await make_tenant(db, http)
    foreign = await other.create_queue()
    before = await state(db, other.namespace_id)
    for qid in ("0" * 32, "abc", foreign["id"].upper(), foreign["id"]):
        r = await tenant.post(f"/v1/queues/{qid}:configure", configure_body("1"))
        assert_error(r, 404, "NOT_FOUND")
    assert await state(db, other.namespace_id) == before
