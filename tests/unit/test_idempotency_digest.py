"""The idempotency digest: canonical JSON of path parameters plus the fields actually sent."""

from __future__ import annotations

import hashlib
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.server.services.idempotency import request_digest

QID = "01a229aed8ce72d08c76b98403e5b7ab"


def test_digest_is_sha256_hex_and_deterministic():
    d = request_digest({"queue_id": QID}, {"name": "q", "max_concurrency": 8})
    assert len(d) == 64 and int(d, 16) >= 0
    assert d == request_digest({"queue_id": QID}, {"max_concurrency": 8, "name": "q"})


def test_digest_is_of_canonical_json():
    path, body = {"queue_id": QID}, {"b": [1, "x", None, True], "a": {"z": 1, "y": "é"}}
    canonical = json.dumps(
        {"body": body, "path": path}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    assert request_digest(path, body) == hashlib.sha256(canonical).hexdigest()


def test_key_order_does_not_matter_at_any_depth():
    a = {"name": "q", "limits": {"rate": 1, "concurrency": 2, "nested": {"b": 1, "a": 2}}, "tags": ["x", "y"]}
    b = {"tags": ["x", "y"], "limits": {"nested": {"a": 2, "b": 1}, "concurrency": 2, "rate": 1}, "name": "q"}
    assert request_digest({"x": 1, "queue_id": QID}, a) == request_digest({"queue_id": QID, "x": 1}, b)


def test_omitted_field_differs_from_default_sent():
    omitted = request_digest({}, {"name": "q", "max_concurrency": 8})
    sent_default = request_digest({}, {"name": "q", "max_concurrency": 8, "paused": False})
    sent_null = request_digest({}, {"name": "q", "max_concurrency": 8, "paused": None})
    assert len({omitted, sent_default, sent_null}) == 3


def test_values_and_types_matter():
    digests = {
        request_digest({}, {"n": 8}),
        request_digest({}, {"n": 8.0}),
        request_digest({}, {"n": "8"}),
        request_digest({}, {"n": [8]}),
        request_digest({}, {"n": 9}),
    }
    assert len(digests) == 5


def test_list_order_matters():
    assert request_digest({}, {"l": [1, 2]}) != request_digest({}, {"l": [2, 1]})


def test_path_parameters_are_part_of_the_digest():
    body = {"paused": True, "reason": "maintenance"}
    assert request_digest({"queue_id": QID}, body) != request_digest({"queue_id": "0" * 32}, body)
    # A field cannot move between path and body without changing the digest.
    assert request_digest({"queue_id": QID}, {}) != request_digest({}, {"queue_id": QID})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=8,
)


def _shuffled(value, rng):
    """The same JSON value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.text(max_size=6), json_values, max_size=6),
    st.dictionaries(st.text(max_size=6), st.text(max_size=10), max_size=3),
    st.randoms(use_true_random=False),
)
def test_insertion_order_never_changes_the_digest(body, path, rng):
    assert request_digest(path, body) == request_digest(_shuffled(path, rng), _shuffled(body, rng))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=6), st.data())
def test_dropping_a_field_changes_the_digest(body, data):
    key = data.draw(st.sampled_from(sorted(body)))
    smaller = {k: v for k, v in body.items() if k != key}
    assert request_digest({}, body) != request_digest({}, smaller)


def test_an_optional_null_is_dropped_at_any_depth_and_a_body_without_one_is_taken_as_sent():
    """What the digest is taken of: a null optional field is an omission, in the item and in its
    nested retry policy; a null payload is a value, and unknown fields stay for validation to name."""
    from orbit.models import SubmitTaskItem, omitted_nulls

    plain = {"idempotency_key": "k", "payload": {"a": None}, "priority": 3}
    assert omitted_nulls(SubmitTaskItem, plain) is plain
    assert omitted_nulls(SubmitTaskItem, {"payload": None, "priority": None, "bogus": None}) == \
        {"payload": None, "bogus": None}
    assert omitted_nulls(SubmitTaskItem, {"payload": 1, "retry": {"jitter": None, "multiplier": 2.0}}) == \
        {"payload": 1, "retry": {"multiplier": 2.0}}
    assert omitted_nulls(SubmitTaskItem, {"payload": 1, "retry": None}) == {"payload": 1}
