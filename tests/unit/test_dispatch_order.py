"""core/dispatch_order.py: priority aging, dispatch order, resource-key choice, node fairness."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.server.core.dispatch_order import (
    MAX_PRIORITY,
    Choice,
    KeyRoom,
    choose,
    effective_priority,
    fair_room,
    fair_share,
    in_dispatch_order,
    note_due,
)

NOW = datetime(2026, 11, 29, 22, 0, 0)
US = timedelta(microseconds=1)
S = timedelta(seconds=1)


def due_for(seconds: float | timedelta) -> datetime:
    """The `available_at` of a task that has been due for `seconds` at NOW."""
    return NOW - (seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))


# ---------------------------------------------------------------- effective_priority


@pytest.mark.parametrize(("due", "boost"), [
    (timedelta(0), 0),
    (1 * US, 0),
    (30 * S, 0),
    (60 * S - US, 0),
    (60 * S, 0),  # up to and including 60 s: no boost
    (60 * S + US, 1),  # just past 60 s
    (90 * S, 1),
    (120 * S, 1),  # up to and including 120 s: one level
    (120 * S + US, 2),
    (180 * S, 2),
    (180 * S + US, 3),
    (240 * S, 3),
    (240 * S + US, 4),
])
def test_aging_adds_one_level_per_60_s_beyond_the_first(due, boost):
    assert effective_priority(0, due_for(due), NOW) == boost
    assert effective_priority(3, due_for(due), NOW) == 3 + boost


@pytest.mark.parametrize("priority", range(10))
def test_aging_never_goes_above_9(priority):
    for due, boost in ((61, 1), (121, 2), (540, 8), (541, 9), (600, 9), (601, 10), (3600, 59)):
        assert effective_priority(priority, due_for(due), NOW) == min(MAX_PRIORITY, priority + boost)
    assert effective_priority(priority, due_for(86400 * 365 * 100), NOW) == 9


@pytest.mark.parametrize("ahead", [US, S, 61 * S, 3600 * S, timedelta(days=400)])
def test_a_task_not_yet_due_keeps_its_priority(ahead):
    for priority in (0, 5, 9):
        assert effective_priority(priority, NOW + ahead, NOW) == priority


def test_aware_datetimes_age_the_same_way():
    from datetime import timezone

    now = NOW.replace(tzinfo=timezone.utc)
    assert effective_priority(4, now - 61 * S, now) == 5
    assert effective_priority(4, now - 60 * S, now) == 4


due_times = st.integers(min_value=-10**12, max_value=10**13).map(lambda us: timedelta(microseconds=us))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 9), due_times, due_times)
def test_effective_priority_is_monotone_in_due_time_and_within_base_and_9(priority, a, b):
    shorter, longer = sorted((a, b))
    p_short = effective_priority(priority, NOW - shorter, NOW)
    p_long = effective_priority(priority, NOW - longer, NOW)
    assert priority <= p_short <= p_long <= MAX_PRIORITY
    # The boost is exactly the number of whole 60 s steps begun after the first 60 s.
    due_us = longer // US
    step_us = 60_000_000
    expected = 0 if due_us <= step_us else -(-due_us // step_us) - 1
    assert p_long == min(MAX_PRIORITY, priority + expected)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 9), st.integers(-10**9, 10**9), st.integers(0, 10**9))
def test_effective_priority_depends_only_on_the_due_time(priority, shift_s, due_us):
    """Moving both instants by the same amount changes nothing."""
    shift = timedelta(seconds=shift_s)
    due = timedelta(microseconds=due_us)
    assert effective_priority(priority, NOW - due + shift, NOW + shift) == \
        effective_priority(priority, NOW - due, NOW)


# ---------------------------------------------------------------- in_dispatch_order


def row(id_: str, priority: int, due_s: float) -> dict:
    return {"id": id_, "priority": priority, "available_at": due_for(due_s)}


def ids(rows) -> list[str]:
    return [r["id"] for r in rows]


def test_order_is_priority_then_available_at_then_id():
    rows = [row("c", 5, 10), row("a", 5, 10), row("b", 5, 20), row("d", 7, 0), row("e", 0, 30)]
    assert ids(in_dispatch_order(rows, NOW)) == ["d", "b", "a", "c", "e"]


def test_priority_as_a_string_counts_as_its_number():
    rows = [{"id": "x", "priority": "2", "available_at": due_for(1)},
            {"id": "y", "priority": "9", "available_at": due_for(0)}]
    assert ids(in_dispatch_order(rows, NOW)) == ["y", "x"]


def test_aging_lifts_a_long_due_task_above_newer_higher_priority_work():
    old = row("old", 5, 121)  # effective 7
    rows = [row("p6", 6, 0), row("p7", 7, 0), old, row("p8", 8, 0)]
    # p8 first; then p7 and old tie at 7 and the earlier due time wins; then p6.
    assert ids(in_dispatch_order(rows, NOW)) == ["p8", "old", "p7", "p6"]
    # Just 60 s due is not aged: it stays behind every higher base priority.
    assert ids(in_dispatch_order([row("p6", 6, 0), row("sixty", 5, 60)], NOW)) == ["p6", "sixty"]
    assert ids(in_dispatch_order([row("p6", 6, 0), row("past", 5, 60.5)], NOW)) == ["past", "p6"]


def test_not_yet_due_rows_sort_by_their_own_priority_and_time():
    rows = [row("later", 5, -30), row("now", 5, 0), row("high-later", 6, -3600)]
    assert ids(in_dispatch_order(rows, NOW)) == ["high-later", "now", "later"]


def test_the_input_is_not_changed():
    rows = [row("b", 1, 0), row("a", 2, 0)]
    copy = list(rows)
    assert ids(in_dispatch_order(rows, NOW)) == ["a", "b"] and rows == copy
    assert in_dispatch_order([], NOW) == []


rows_strategy = st.lists(
    st.tuples(st.integers(0, 9), st.integers(-120, 900)), max_size=30
).map(lambda items: [row(f"{i:04d}", p, d) for i, (p, d) in enumerate(items)])


@settings(max_examples=200, deadline=None)
@given(rows_strategy)
def test_dispatch_order_is_sorted_by_effective_priority_then_time_then_id(rows):
    out = in_dispatch_order(rows, NOW)
    assert sorted(ids(out)) == sorted(ids(rows))
    keys = [(-effective_priority(r["priority"], r["available_at"], NOW), r["available_at"], r["id"]) for r in out]
    assert keys == sorted(keys)
    # Within one base priority, dispatch order is (available_at, id) order: aging never reorders a level.
    for p in range(10):
        level = [r for r in out if r["priority"] == p]
        assert level == sorted(level, key=lambda r: (r["available_at"], r["id"]))


# ---------------------------------------------------------------- choose


def rooms(**limits: tuple[int, int]) -> dict[str, KeyRoom]:
    return {k: KeyRoom(*v) for k, v in limits.items()}


def test_candidates_with_free_permits_are_taken_until_room():
    keys = rooms(a=(5, 0), b=(5, 0))
    assert choose([["a"], ["b"], ["a", "b"], [], ["a"]], 3, keys) == Choice([0, 1, 2], {})
    assert choose([["a"], ["b"]], 10, keys) == Choice([0, 1], {})
    assert keys == rooms(a=(5, 0), b=(5, 0))  # the caller's rooms are not changed


def test_keyless_candidates_are_taken_while_room_lasts():
    assert choose([[], [], [], []], 2, {}) == Choice([0, 1], {})
    assert choose([[], []], 5, {}) == Choice([0, 1], {})
    # Even behind a parked candidate.
    assert choose([["a"], [], []], 2, rooms(a=(1, 1))) == Choice([1, 2], {0: "a"})


def test_no_room_takes_and_parks_nothing():
    assert choose([["a"], [], ["b"]], 0, rooms(a=(1, 1), b=(1, 0))) == Choice([], {})
    assert choose([["a"]], -1, rooms(a=(1, 1))) == Choice([], {})
    assert choose([], 5, {}) == Choice([], {})


def test_a_candidate_is_parked_on_its_first_saturated_key_in_sorted_order():
    keys = rooms(a=(1, 0), m=(2, 2), z=(1, 1))
    # Keys are checked in name order, whatever order the task lists them in.
    assert choose([["z", "m", "a"]], 5, keys) == Choice([], {0: "m"})
    assert choose([["z", "a"]], 5, keys) == Choice([], {0: "z"})
    # A parked candidate takes no permit of its free keys: `a` is still free for the next one.
    assert choose([["z", "a"], ["a"]], 5, keys) == Choice([1], {0: "z"})


def test_an_over_saturated_key_parks_too():
    # max_concurrency lowered below the permits already held.
    assert choose([["a"]], 5, rooms(a=(2, 5))) == Choice([], {0: "a"})


def test_permits_taken_earlier_in_the_same_call_count():
    keys = rooms(a=(2, 1), b=(3, 0))
    got = choose([["a"], ["a", "b"], ["b"], ["a"], ["b"], ["b"], ["b"]], 10, keys)
    # a: one free permit, taken by candidate 0; candidates 1 and 3 then park on a (1 takes no b).
    # b: three free permits, taken by 2, 4 and 5; candidate 6 parks on b.
    assert got == Choice([0, 2, 4, 5], {1: "a", 3: "a", 6: "b"})


def test_choice_stops_at_room_leaving_later_candidates_alone():
    keys = rooms(a=(1, 1), b=(10, 0))
    got = choose([["b"], ["a"], ["b"], ["a"], ["b"], ["a"]], 2, keys)
    # Taken 0 and 2 (room 2), parked 1 on the way; 3 (saturated) and beyond are not looked at.
    assert got == Choice([0, 2], {1: "a"})
    # Parking does not use room: with room 1 the parked candidate is skipped and the next is taken.
    assert choose([["a"], ["a"], ["b"], ["a"]], 1, keys) == Choice([2], {0: "a", 1: "a"})


names = st.sampled_from("abcdef")
candidates_strategy = st.lists(st.lists(names, unique=True, max_size=4), max_size=25)
rooms_strategy = st.fixed_dictionaries({
    k: st.tuples(st.integers(1, 4), st.integers(0, 5)).map(lambda t: KeyRoom(*t)) for k in "abcdef"})


@settings(max_examples=400, deadline=None)
@given(candidates_strategy, st.integers(0, 30), rooms_strategy)
def test_choose_never_exceeds_room_nor_any_keys_free_permits(candidates, room, keys):
    taken, parked = choose(candidates, room, keys)
    assert len(taken) <= room
    assert taken == sorted(taken) and not set(taken) & set(parked)
    for k, r in keys.items():
        holders = sum(1 for i in taken if k in candidates[i])
        assert holders <= max(0, r.max_concurrency - r.in_use), (k, holders, r)
    # Replaying the walk: each taken candidate had a free permit of every key; each parked one
    # was refused on the first saturated key in name order; nothing after the room ran out was looked at.
    in_use = {k: r.in_use for k, r in keys.items()}
    for i, task_keys in enumerate(candidates):
        if len([t for t in taken if t < i]) >= room:
            assert i not in taken and i not in parked
            continue
        full = [k for k in sorted(task_keys) if in_use[k] >= keys[k].max_concurrency]
        if full:
            assert parked.get(i) == full[0] and i not in taken
        else:
            assert i in taken
            for k in task_keys:
                in_use[k] += 1


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 50), st.integers(0, 60))
def test_keyless_candidates_are_all_taken_up_to_room(n, room):
    assert choose([[]] * n, room, {}) == Choice(list(range(min(n, room))), {})


# ---------------------------------------------------------------- node fairness


@pytest.mark.parametrize(("c", "active", "share"), [
    (10, 1, 10), (10, 2, 5), (10, 3, 4), (10, 4, 3), (10, 10, 1), (10, 11, 1), (1, 3, 1), (7, 0, 7),
])
def test_fair_share_is_the_ceiling_of_an_even_split(c, active, share):
    assert fair_share(c, active) == share


def test_fair_room_applies_only_with_two_active_nodes_and_someone_else_waiting():
    assert fair_room(10, 1, 9, True) is None
    assert fair_room(10, 0, 9, True) is None
    assert fair_room(10, 2, 9, False) is None
    assert fair_room(10, 2, 3, True) == 2
    assert fair_room(10, 2, 5, True) == 0
    assert fair_room(10, 2, 8, True) == 0  # above its share: nothing, never negative
    assert fair_room(10, 3, 0, True) == 4


@given(st.integers(1, 1000), st.integers(2, 50), st.integers(0, 2000))
def test_fair_room_keeps_a_waiting_node_at_its_share(c, active, holding):
    room = fair_room(c, active, holding, True)
    assert room is not None and room >= 0
    assert holding + room == max(holding, fair_share(c, active))
    assert fair_share(c, active) * active >= c  # the shares together cover the whole limit


# ---------------------------------------------------------------- a node's row on a queue


def test_a_node_row_is_written_when_its_claims_are_granted_or_it_has_none():
    assert note_due(None, None, True, 0, NOW)
    assert note_due(NOW, NOW, True, 3, NOW)


def test_a_waiting_node_rewrites_its_row_at_half_its_wanting_window():
    assert not note_due(NOW - 0.4 * S, NOW - 0.4 * S, True, 0, NOW)
    assert note_due(NOW - 0.6 * S, NOW - 0.6 * S, True, 0, NOW)


def test_a_node_rewrites_its_row_when_its_wanting_flips():
    assert note_due(NOW - 0.1 * S, None, True, 0, NOW)
    assert note_due(NOW - 0.1 * S, NOW - 0.1 * S, False, 0, NOW)
    assert not note_due(NOW - 0.1 * S, None, False, 0, NOW)
