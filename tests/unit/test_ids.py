"""Ids: 32 lowercase hex, UUIDv7 layout, strictly increasing within a process."""

from __future__ import annotations

import time
import uuid
from itertools import pairwise
from types import SimpleNamespace

from orbit.server.core import ids
from orbit.server.core.ids import is_id, new_id


def test_shape_version_and_variant():
    for _ in range(200):
        value = new_id()
        assert is_id(value)
        assert len(value) == 32 and value == value.lower()
        assert value[12] == "7"  # version nibble
        assert value[16] in "89ab"  # RFC 4122 variant
        assert uuid.UUID(hex=value).version == 7


def test_timestamp_prefix_is_now():
    before = time.time_ns() // 1_000_000
    value = new_id()
    after = time.time_ns() // 1_000_000
    ms = int(value[:12], 16)
    # The counter may push ms ahead by a little when many ids share one millisecond.
    assert before <= ms <= after + 50


def test_tight_loop_is_strictly_increasing_and_unique():
    values = [new_id() for _ in range(20_000)]
    assert len(set(values)) == len(values)
    assert all(a < b for a, b in pairwise(values))


def test_frozen_clock_overflows_counter_into_next_millisecond(monkeypatch):
    frozen = time.time_ns()
    monkeypatch.setattr(ids, "time", SimpleNamespace(time_ns=lambda: frozen))
    values = [new_id() for _ in range(10_000)]  # more than the 12-bit counter holds
    assert len(set(values)) == len(values)
    assert all(a < b for a, b in pairwise(values))


def test_clock_going_backwards_stays_monotonic(monkeypatch):
    now = [time.time_ns()]
    monkeypatch.setattr(ids, "time", SimpleNamespace(time_ns=lambda: now[0]))
    first = [new_id() for _ in range(100)]
    now[0] -= 5_000_000_000  # NTP steps the clock back 5 s
    second = [new_id() for _ in range(100)]
    values = first + second
    assert all(a < b for a, b in pairwise(values))


def test_is_id_rejects_near_misses():
    good = new_id()
    assert is_id(good)
    for bad in (
        good.upper(),
        good[:-1],
        good + "0",
        good + "\n",
        "\n" + good,
        str(uuid.UUID(hex=good)),  # dashed form
        "g" * 32,
        "",
        None,
        123,
        good.encode(),
    ):
        assert not is_id(bad), bad


def test_node_ids_are_1_to_128_printable_ascii_without_end_spaces():
    from orbit.server.core.ids import is_node_id

    for good in ("a", "worker-1", "host 7", "x" * 128, "~!#$%&'()*+,-./:;<=>?@[]^_`{|}"):
        assert is_node_id(good), good
    for bad in ("", "x" * 129, " a", "a ", "a\n", "tab\there", "wörker", "é", None, 7, ["a"]):
        assert not is_node_id(bad), bad
