"""core/blockers.py: every control that holds a waiting task, layer by layer (no I/O)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.server.core.blockers import Key, Layer, NodeUse, active, blockers
from orbit.server.core.dispatch_order import fair_room
from orbit.server.core.rate_window import RateWindow

NOW = datetime(2026, 11, 29, 22, 0, 0)
MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)
S = timedelta(seconds=1)
NO_WINDOW = RateWindow(None, 0, 0)


def layer(*, paused=False, retired=False, max_concurrency=10, rate=100, in_use=0, window=NO_WINDOW) -> Layer:
    return Layer(paused, retired, max_concurrency, rate, in_use, window)


def node(node_id="n1", in_flight=0, claimed_ago=0.0, wanting_ago: float | None = None) -> NodeUse:
    return NodeUse(node_id, in_flight, NOW - timedelta(seconds=claimed_ago),
                   None if wanting_ago is None else NOW - timedelta(seconds=wanting_ago))


ONE_NODE = [node()]


def ask(*, state="WAITING", available_at=NOW, now=NOW, queue=None, application=None, keys=(), nodes=None):
    return blockers(state=state, available_at=available_at, now=now, queue=queue or layer(),
                    application=application or layer(), keys=list(keys),
                    nodes=ONE_NODE if nodes is None else nodes)


def controls(out) -> list[tuple]:
    return [(b["layer"], b.get("name"), b["control"]) for b in out]


# ---------------------------------------------------------------- nothing holds it / not waiting


def test_a_due_task_with_room_everywhere_has_no_blockers():
    assert ask() == []
    assert ask(available_at=NOW - timedelta(hours=1)) == []
    assert ask(keys=[Key("k", 2, 1, False)]) == []


@pytest.mark.parametrize("state", ["LEASED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW",
                                   "waiting", ""])
def test_any_other_state_has_no_blockers_whatever_holds(state):
    everything = layer(paused=True, retired=True, max_concurrency=1, in_use=1, rate=1,
                       window=RateWindow(NOW, 1, 0))
    assert ask(state=state, available_at=NOW + timedelta(hours=1), queue=everything, application=everything,
               keys=[Key("k", 1, 1, True)], nodes=[]) == []


# ---------------------------------------------------------------- time


def test_available_at_ahead_is_a_time_blocker_until_then():
    out = ask(available_at=NOW + 90 * S + 5 * US)
    assert out == [{"layer": "time", "control": "available_at", "until": "2026-11-29T22:01:30.000005Z"}]
    assert ask(available_at=NOW + US) == [
        {"layer": "time", "control": "available_at", "until": "2026-11-29T22:00:00.000001Z"}]


def test_a_task_due_exactly_now_is_not_held_by_time():
    assert ask(available_at=NOW) == []


# ---------------------------------------------------------------- queue and application layers


@pytest.mark.parametrize("name", ["queue", "application"])
def test_paused_and_retired(name):
    assert ask(**{name: layer(paused=True)}) == [{"layer": name, "control": "paused"}]
    assert ask(**{name: layer(retired=True)}) == [{"layer": name, "control": "retired"}]
    assert controls(ask(**{name: layer(paused=True, retired=True)})) == [(name, None, "retired"),
                                                                         (name, None, "paused")]


@pytest.mark.parametrize("name", ["queue", "application"])
def test_max_concurrency_holds_when_every_permit_is_in_use(name):
    assert ask(**{name: layer(max_concurrency=8, in_use=7)}) == []
    full = ask(**{name: layer(max_concurrency=8, in_use=8)})
    assert full == [{"layer": name, "control": "max_concurrency", "limit": 8, "in_use": "8"}]
    assert type(full[0]["limit"]) is int and type(full[0]["in_use"]) is str
    # A limit lowered below the permits held still holds (and says how many are held).
    assert ask(**{name: layer(max_concurrency=2, in_use=5)}) == [
        {"layer": name, "control": "max_concurrency", "limit": 2, "in_use": "5"}]


@pytest.mark.parametrize("name", ["queue", "application"])
def test_rate_per_second_in_an_open_window_holds_until_it_ends(name):
    window = RateWindow(NOW - 300 * MS, 7, 3)
    out = ask(**{name: layer(rate=10, window=window)})
    assert out == [{"layer": name, "control": "rate_per_second", "limit": 10, "used": "10",
                    "until": "2026-11-29T22:00:00.700000Z"}]
    assert type(out[0]["limit"]) is int and type(out[0]["used"]) is str
    # Used beyond the limit (a lowered rate) is reported as it is.
    assert ask(**{name: layer(rate=5, window=RateWindow(NOW, 9, 0))})[0]["used"] == "9"
    # Room left in the window: no blocker.
    assert ask(**{name: layer(rate=10, window=RateWindow(NOW - 300 * MS, 7, 2))}) == []


@pytest.mark.parametrize("name", ["queue", "application"])
def test_rate_reservations_alone_hold_without_until_when_no_window_is_open(name):
    # The window ended (start + 1 s <= now): its Starts count nothing, reservations still do.
    ended = RateWindow(NOW - S, 50, 10)
    assert ask(**{name: layer(rate=10, window=ended)}) == [
        {"layer": name, "control": "rate_per_second", "limit": 10, "used": "10"}]
    assert ask(**{name: layer(rate=10, window=RateWindow(None, 0, 12))}) == [
        {"layer": name, "control": "rate_per_second", "limit": 10, "used": "12"}]
    assert ask(**{name: layer(rate=10, window=RateWindow(NOW - 2 * S, 10, 9))}) == []


def test_a_window_that_opens_in_the_future_is_not_open():
    # start > now (clock skew between rows): not open, so its Starts do not count.
    assert ask(queue=layer(rate=5, window=RateWindow(NOW + MS, 5, 0))) == []


def test_every_control_of_a_layer_is_listed_in_order():
    both = layer(paused=True, retired=True, max_concurrency=3, in_use=3, rate=2, window=RateWindow(NOW, 2, 0))
    assert controls(ask(queue=both)) == [("queue", None, c)
                                         for c in ("retired", "paused", "max_concurrency", "rate_per_second")]
    assert controls(ask(queue=both, application=both)) == [
        (lay, None, c) for lay in ("queue", "application")
        for c in ("retired", "paused", "max_concurrency", "rate_per_second")]


# ---------------------------------------------------------------- resource keys


def test_resource_keys_saturated_or_retired_sorted_by_name():
    keys = [Key("zeta", 2, 2, False), Key("alpha", 5, 6, False), Key("mid", 3, 1, False),
            Key("beta", 1, 1, True), Key("gamma", 4, 0, True)]
    out = ask(keys=keys)
    assert out == [
        {"layer": "resource_key", "name": "alpha", "control": "max_concurrency", "limit": 5, "in_use": "6"},
        {"layer": "resource_key", "name": "beta", "control": "retired"},
        {"layer": "resource_key", "name": "beta", "control": "max_concurrency", "limit": 1, "in_use": "1"},
        {"layer": "resource_key", "name": "gamma", "control": "retired"},
        {"layer": "resource_key", "name": "zeta", "control": "max_concurrency", "limit": 2, "in_use": "2"},
    ]


def test_a_key_with_a_free_permit_does_not_hold():
    assert ask(keys=[Key("a", 3, 2, False), Key("b", 100000, 0, False)]) == []


# ---------------------------------------------------------------- workers


def test_no_node_claimed_within_10_s_is_no_active_workers():
    expected = [{"layer": "workers", "control": "no_active_workers"}]
    assert ask(nodes=[]) == expected
    assert ask(nodes=[node(claimed_ago=10.000001), node("n2", claimed_ago=3600)]) == expected
    assert ask(nodes=[node(claimed_ago=10)]) == []  # 10 s ago is still within the window
    assert ask(nodes=[node(claimed_ago=0.5)]) == []


def test_active_keeps_the_nodes_that_claimed_within_10_s():
    nodes = [node("a", claimed_ago=0), node("b", claimed_ago=10), node("c", claimed_ago=10.000001)]
    assert [n.node_id for n in active(nodes, NOW)] == ["a", "b"]
    assert active([], NOW) == []


# ---------------------------------------------------------------- fairness


def test_fairness_holds_when_every_waiting_node_holds_its_share():
    q = layer(max_concurrency=4)  # two active nodes: share 2
    nodes = [node("a", in_flight=2, wanting_ago=0), node("b", in_flight=3, wanting_ago=0.2)]
    assert ask(queue=q, nodes=nodes) == [
        {"layer": "fairness", "control": "max_concurrency", "limit": 2, "in_use": "2"}]


def test_no_fairness_when_a_waiting_node_is_below_its_share():
    q = layer(max_concurrency=4)
    assert ask(queue=q, nodes=[node("a", 2, wanting_ago=0), node("b", 1, wanting_ago=0)]) == []


def test_no_fairness_with_a_single_waiting_node():
    q = layer(max_concurrency=4)
    # b is active but not waiting (no unserved claim, or one older than 1 s): a may go past its share.
    assert ask(queue=q, nodes=[node("a", 4, wanting_ago=0), node("b", 0)]) == []
    assert ask(queue=q, nodes=[node("a", 4, wanting_ago=0), node("b", 2, wanting_ago=1.000001)]) == []
    # 1 s ago still counts as waiting.
    assert controls(ask(queue=q, nodes=[node("a", 4, wanting_ago=0), node("b", 2, wanting_ago=1)])) == [
        ("fairness", None, "max_concurrency")]


def test_no_fairness_with_a_single_active_node():
    q = layer(max_concurrency=4)
    # b wants work but has not claimed within 10 s: it is not active, so a has the queue to itself.
    assert ask(queue=q, nodes=[node("a", 4, wanting_ago=0), node("b", 4, claimed_ago=11, wanting_ago=0)]) == []


def test_the_share_counts_every_active_node_waiting_or_not():
    q = layer(max_concurrency=10)  # three active nodes: share ceil(10/3) = 4
    idle = node("c", 0, claimed_ago=9)
    assert ask(queue=q, nodes=[node("a", 4, wanting_ago=0), node("b", 5, wanting_ago=0), idle]) == [
        {"layer": "fairness", "control": "max_concurrency", "limit": 4, "in_use": "4"}]
    assert ask(queue=q, nodes=[node("a", 4, wanting_ago=0), node("b", 3, wanting_ago=0), idle]) == []


# ---------------------------------------------------------------- all at once


def test_every_control_that_holds_is_listed_in_layer_order():
    full = layer(paused=True, max_concurrency=2, in_use=2, rate=1, window=RateWindow(NOW - 100 * MS, 1, 0))
    out = ask(available_at=NOW + S, queue=full, application=layer(retired=False, max_concurrency=1, in_use=1),
              keys=[Key("k2", 1, 1, False), Key("k1", 1, 0, True)], nodes=[])
    assert controls(out) == [
        ("time", None, "available_at"),
        ("queue", None, "paused"), ("queue", None, "max_concurrency"), ("queue", None, "rate_per_second"),
        ("application", None, "max_concurrency"),
        ("resource_key", "k1", "retired"), ("resource_key", "k2", "max_concurrency"),
        ("workers", None, "no_active_workers"),
    ]
    assert out[3]["until"] == "2026-11-29T22:00:00.900000Z"


# ---------------------------------------------------------------- properties

windows = st.one_of(
    st.just(NO_WINDOW),
    st.builds(RateWindow, st.integers(-2500, 500).map(lambda ms: NOW + ms * MS), st.integers(0, 12),
              st.integers(0, 12)),
)
layers = st.builds(Layer, st.booleans(), st.booleans(), st.integers(1, 12), st.integers(1, 12),
                   st.integers(0, 14), windows)
key_lists = st.lists(st.builds(Key, st.sampled_from("abcdefgh"), st.integers(1, 4), st.integers(0, 5),
                               st.booleans()), unique_by=lambda k: k.name, max_size=5)
node_lists = st.lists(
    st.builds(NodeUse, st.sampled_from("uvwxyz"), st.integers(0, 12),
              st.integers(0, 15_000).map(lambda ms: NOW - ms * MS),
              st.one_of(st.none(), st.integers(0, 2000).map(lambda ms: NOW - ms * MS))),
    unique_by=lambda n: n.node_id, max_size=4)
LAYER_ORDER = ["time", "queue", "application", "resource_key", "workers", "fairness"]


@settings(max_examples=400, deadline=None)
@given(st.integers(-5000, 5000), layers, layers, key_lists, node_lists)
def test_blockers_are_well_formed_and_in_layer_order(ahead_ms, queue, application, keys, nodes):
    available_at = NOW + ahead_ms * MS
    out = blockers(state="WAITING", available_at=available_at, now=NOW, queue=queue, application=application,
                   keys=keys, nodes=nodes)
    ranks = [LAYER_ORDER.index(b["layer"]) for b in out]
    assert ranks == sorted(ranks)
    assert [b["name"] for b in out if b["layer"] == "resource_key"] == \
        sorted(b["name"] for b in out if b["layer"] == "resource_key")
    assert (("time", None, "available_at") in controls(out)) == (available_at > NOW)
    for b in out:
        assert set(b) <= {"layer", "control", "name", "limit", "in_use", "used", "until"}
        assert ("limit" in b) == (b["control"] in ("max_concurrency", "rate_per_second"))
        if "limit" in b:
            assert type(b["limit"]) is int
        for figure in ("in_use", "used"):
            if figure in b:
                assert type(b[figure]) is str and b[figure].isdigit()
    # The workers and fairness entries exclude each other: fairness needs two active nodes.
    assert not {"workers", "fairness"} <= {b["layer"] for b in out}
    # Not waiting: nothing.
    assert blockers(state="RUNNING", available_at=available_at, now=NOW, queue=queue, application=application,
                    keys=keys, nodes=nodes) == []


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 12), node_lists)
def test_fairness_is_dispatch_fair_room_asked_the_other_way_round(max_concurrency, nodes):
    """Held by fairness exactly when no waiting node may take one more lease while another waits
    (`fair_room` as dispatch applies it), with two or more nodes waiting."""
    out = ask(queue=layer(max_concurrency=max_concurrency), nodes=nodes)
    held = any(b["layer"] == "fairness" for b in out)
    live = active(nodes, NOW)
    waiting = [n for n in live if n.wanting_at is not None and n.wanting_at >= NOW - S]
    rooms = [fair_room(max_concurrency, len(live), n.in_flight, len(waiting) > 1) for n in waiting]
    assert held == (len(waiting) >= 2 and all(r == 0 for r in rooms))
