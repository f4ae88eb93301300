"""The throughput history's bucket arithmetic (core/throughput.py), without a database."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.server.core.throughput import (
    BASELINE_EVERY,
    INTERVAL,
    RETENTION,
    ZERO,
    Sample,
    Totals,
    bucket_start,
    is_young,
    points,
    prune_before,
    sample_cutoffs,
    window,
)

NOW = datetime(2026, 3, 1, 12, 0, 7, 300000)  # in the bucket starting 12:00:05
CURRENT = datetime(2026, 3, 1, 12, 0, 5)
S = timedelta(seconds=1)


def at(seconds_before_current: int) -> datetime:
    return CURRENT - seconds_before_current * S


def test_buckets_are_five_seconds_aligned_on_the_epoch():
    assert bucket_start(NOW) == CURRENT
    assert bucket_start(CURRENT) == CURRENT
    assert bucket_start(CURRENT - timedelta(microseconds=1)) == datetime(2026, 3, 1, 12, 0, 0)
    assert bucket_start(datetime(2026, 3, 1, 0, 0, 0, 1)) == datetime(2026, 3, 1)


def test_a_window_is_its_minutes_of_buckets_ending_with_the_current_one():
    w = window(NOW, 1)
    assert len(w) == 12 and w[-1] == CURRENT and w[0] == CURRENT - 55 * S
    assert all(b - a == INTERVAL for a, b in zip(w, w[1:], strict=False))
    assert len(window(NOW, 60)) == 720


def test_the_sampler_labels_with_the_bucket_and_wants_a_baseline_every_half_hour():
    assert sample_cutoffs(NOW) == (CURRENT, NOW - BASELINE_EVERY)
    assert prune_before(NOW) == NOW - RETENTION
    assert BASELINE_EVERY < RETENTION


def test_points_are_differences_of_consecutive_samples_and_the_live_totals_end_the_current_bucket():
    samples = [Sample(at(15), Totals(10, 5, 1)), Sample(at(10), Totals(14, 8, 1)),
               Sample(at(5), Totals(20, 9, 3)), Sample(at(0), Totals(21, 9, 3))]
    got = points(samples, Totals(25, 12, 3), NOW, 1, young=False)
    assert [p.at for p in got] == window(NOW, 1)
    by_at = {p.at: p.counts for p in got}
    assert by_at[at(15)] == Totals(4, 3, 0)
    assert by_at[at(10)] == Totals(6, 1, 2)
    assert by_at[at(5)] == Totals(1, 0, 0)
    assert by_at[at(0)] == Totals(4, 3, 0)  # the current bucket: live minus its own sample
    assert all(c == ZERO for a, c in by_at.items() if a < at(15))  # no sample before: unknown, 0


def test_a_sample_before_the_window_is_its_baseline():
    samples = [Sample(at(3600 - 600), Totals(100, 90, 2)), Sample(at(10), Totals(107, 95, 2))]
    got = points(samples, Totals(107, 95, 2), NOW, 1, young=False)
    assert got[0].counts == ZERO
    assert {p.at: p.counts for p in got}[at(15)] == Totals(7, 5, 0)  # the bucket before the next sample
    assert sum(p.counts.started for p in got) == 7


def test_counters_that_did_not_move_leave_no_sample_and_count_nothing():
    samples = [Sample(at(600), Totals(3, 3, 0))]
    got = points(samples, Totals(3, 3, 0), NOW, 10, young=False)
    assert len(got) == 120 and all(p.counts == ZERO for p in got)


def test_a_new_queue_starts_from_zero_and_an_old_one_without_samples_counts_nothing():
    young = points([], Totals(4, 2, 1), NOW, 1, young=True)
    assert [p.counts for p in young] == [ZERO] * 11 + [Totals(4, 2, 1)]
    assert all(p.counts == ZERO for p in points([], Totals(4, 2, 1), NOW, 1, young=False))
    first = [Sample(at(10), Totals(4, 2, 1))]
    assert sum(p.counts.started for p in points(first, Totals(6, 2, 1), NOW, 1, young=True)) == 6
    assert sum(p.counts.started for p in points(first, Totals(6, 2, 1), NOW, 1, young=False)) == 2


def test_samples_after_now_are_ignored_and_counts_never_go_negative():
    samples = [Sample(at(5), Totals(5, 0, 0)), Sample(at(0), Totals(9, 0, 0)), Sample(at(-5), Totals(50, 0, 0))]
    got = points(samples, Totals(8, 0, 0), NOW, 1, young=False)
    assert got[-1].counts == ZERO and got[-2].counts == Totals(4, 0, 0)


def test_a_queue_is_young_while_none_of_its_samples_can_have_been_pruned():
    assert is_young(NOW - timedelta(minutes=59), NOW)
    assert not is_young(NOW - RETENTION, NOW)
    assert not is_young(None, NOW)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 800), st.integers(0, 5), st.integers(0, 5), st.integers(0, 5)),
                max_size=40),
       st.integers(1, 60), st.booleans(), st.integers(0, 5))
def test_the_points_add_up_to_the_live_totals_minus_the_first_known_boundary(steps, minutes, young, tail):
    # Monotone counters sampled at distinct buckets up to 800 buckets back.
    offsets = sorted({o for o, *_ in steps}, reverse=True)
    samples, running = [], [0, 0, 0]
    for o, (_, a, b, c) in zip(offsets, steps, strict=False):
        running = [running[0] + a, running[1] + b, running[2] + c]
        samples.append(Sample(CURRENT - o * INTERVAL, Totals(*running)))
    live = Totals(running[0] + tail, running[1], running[2] + tail)
    got = points(samples, live, NOW, minutes, young=young)
    first = window(NOW, minutes)[0]
    before = [s for s in samples if s.at <= first]
    if before:
        base = before[-1].totals
    elif young:
        base = ZERO
    else:
        later = [s for s in samples if s.at > first]
        base = later[0].totals if later else live  # counting starts at the first sample in the window
    assert Totals(*(sum(getattr(p.counts, f) for p in got) for f in Totals._fields)) == live.minus(base)
    assert len(got) == minutes * 12 and all(min(p.counts) >= 0 for p in got)
