"""Property-based: arbitrary invalid bodies and keys never give a 5xx and never change state.

Each generated body is judged by an independent oracle written from the field rules of
the queue requests; bodies the oracle finds valid are discarded, every other one must be a 400
INVALID_ARGUMENT envelope that leaves the namespace exactly as it was.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from .queue_helpers import assert_error, configure_body, create_body, envelope, post_raw, state

pytestmark = pytest.mark.anyio

PROPERTY = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.filter_too_much],
)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")
REVISION = re.compile(r"[1-9][0-9]{0,19}")
KEY = re.compile(rb"[\x21-\x7e]{1,128}")
CREATE_FIELDS = ("name", "max_concurrency", "rate_per_second", "max_unfinished_tasks")
CONFIGURE_FIELDS = ("expected_revision", "reason", "paused", "max_concurrency", "rate_per_second",
                    "max_unfinished_tasks")


def _int_in(value: Any, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi


def valid_create(body: Any) -> bool:
    if not isinstance(body, dict) or not set(body) <= set(CREATE_FIELDS):
        return False
    if not {"name", "max_concurrency", "rate_per_second"} <= set(body):
        return False
    return (
        isinstance(body["name"], str)
        and NAME.fullmatch(body["name"]) is not None
        and _int_in(body["max_concurrency"], 1, 100_000)
        and _int_in(body["rate_per_second"], 1, 1_000_000)
        # An optional field given as null is the same as omitting it.
        and (body.get("max_unfinished_tasks") is None or _int_in(body["max_unfinished_tasks"], 0, 1_000_000))
    )


def valid_configure(body: Any) -> bool:
    if not isinstance(body, dict) or set(body) != set(CONFIGURE_FIELDS):
        return False
    rev, reason = body["expected_revision"], body["reason"]
    return (
        isinstance(rev, str)
        and REVISION.fullmatch(rev) is not None
        and int(rev) < 2**64
        and isinstance(reason, str)
        and reason.strip() != ""
        and len(reason) <= 1024
        and isinstance(body["paused"], bool)
        and _int_in(body["max_concurrency"], 1, 100_000)
        and _int_in(body["rate_per_second"], 1, 1_000_000)
        and _int_in(body["max_unfinished_tasks"], 1, 1_000_000)
    )


texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=24)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.sampled_from([0, 1, 100_000, 100_001, 1_000_000, 1_000_001, -1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
    | st.sampled_from(["images", "a" * 128, "a" * 129, "-x", "1", "0", "01", "18446744073709551616", " "])
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3), max_leaves=6
)


def bodies(fields: tuple[str, ...], valid: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Near-valid objects (one field replaced, dropped or added) and arbitrary JSON."""
    keys = st.sampled_from(fields) | texts
    replaced = st.tuples(st.sampled_from(fields), json_values).map(lambda kv: {**valid, kv[0]: kv[1]})
    dropped = st.sampled_from(fields).map(lambda k: {f: v for f, v in valid.items() if f != k})
    added = st.tuples(texts, json_values).map(lambda kv: {**valid, kv[0]: kv[1]})
    mixed = st.dictionaries(keys, json_values, max_size=len(fields) + 1)
    return st.one_of(replaced, dropped, added, mixed, json_values)


def encode(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


async def assert_rejected_without_effect(tenant, db, path: str, raw: bytes) -> None:
    """400 and no change; the baseline is taken once, as no example may ever change it."""
    if not hasattr(tenant, "baseline"):
        tenant.baseline = await state(db, tenant.namespace_id)
    r = await post_raw(tenant.http, path, raw, token=tenant.token, key=tenant.key())
    assert r.status_code < 500, r.text
    assert_error(r, 400, "INVALID_ARGUMENT")
    assert await state(db, tenant.namespace_id) == tenant.baseline


async def existing_queue(tenant) -> dict[str, Any]:
    """One queue per tenant, created on the first example (hypothesis reuses the fixture)."""
    if not hasattr(tenant, "property_queue"):
        tenant.property_queue = await tenant.create_queue()
    return tenant.property_queue


@PROPERTY
@given(body=bodies(CREATE_FIELDS, create_body("valid", max_unfinished_tasks=10)))
async def test_invalid_create_bodies(tenant, db, body):
    assume(not valid_create(body))
    await assert_rejected_without_effect(tenant, db, "/v1/queues", encode(body))


@PROPERTY
@given(body=bodies(CONFIGURE_FIELDS, configure_body("1")))
async def test_invalid_configure_bodies(tenant, db, body):
    assume(not valid_configure(body))
    q = await existing_queue(tenant)
    await assert_rejected_without_effect(tenant, db, f"/v1/queues/{q['id']}:configure", encode(body))


@PROPERTY
@given(raw=st.binary(max_size=48), action=st.sampled_from(["", ":configure", ":retire"]))
async def test_arbitrary_bytes(tenant, db, raw, action):
    try:
        decoded = json.loads(raw)
    except ValueError:
        decoded = None
    assume(not isinstance(decoded, dict))
    q = await existing_queue(tenant)
    path = "/v1/queues" if not action else f"/v1/queues/{q['id']}{action}"
    await assert_rejected_without_effect(tenant, db, path, raw)


@PROPERTY
@given(key=st.binary(min_size=0, max_size=140).filter(lambda b: not set(b) & set(b"\r\n\x00")))
async def test_idempotency_keys_follow_the_rule(tenant, db, key):
    before = await state(db, tenant.namespace_id)
    body = encode(create_body())
    r = await post_raw(tenant.http, "/v1/queues", body, token=tenant.token, extra={"Idempotency-Key": key})
    if KEY.fullmatch(key):
        used = tenant.__dict__.setdefault("used_keys", set())
        if key in used:
            # Hypothesis repeats keys; the body (a fresh name) differs each time.
            assert_error(r, 409, "IDEMPOTENCY_CONFLICT")
        else:
            assert r.status_code == 201, (key, r.text)
            envelope(r)
        used.add(key)
    else:
        assert_error(r, 400, "INVALID_ARGUMENT", "Idempotency-Key")
        assert await state(db, tenant.namespace_id) == before
