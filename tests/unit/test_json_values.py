"""Stored JSON values: size and depth limits (pure)."""

from __future__ import annotations

import orjson
import pytest

from orbit.server.core import json_values


def nested(depth: int, leaf=1):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_an_ordinary_value_is_encoded_once_as_before():
    assert json_values.encode({"a": [1, 2, {"b": None}]}, 1000) == orjson.dumps({"a": [1, 2, {"b": None}]})


def test_size_limit():
    with pytest.raises(json_values.JsonValueError, match="exceeds the 10-byte limit"):
        json_values.encode("x" * 20, 10)


@pytest.mark.parametrize("depth", [json_values.MAX_DEPTH - 1, json_values.MAX_DEPTH])
def test_deep_values_within_the_limit_fit_in_every_answer(depth):
    value = nested(depth)
    json_values.encode(value, 10**6)
    wrapped = {"data": {"items": [{"data": {"task": {"payload": value}}}]}}
    orjson.dumps(wrapped)  # the deepest answer that carries a stored value


@pytest.mark.parametrize("depth", [json_values.MAX_DEPTH + 1, 253, 254, 300, 1000])
def test_deeper_values_are_refused(depth):
    with pytest.raises(json_values.JsonValueError, match="nested too deeply"):
        json_values.encode(nested(depth), 10**6)
