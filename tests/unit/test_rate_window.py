from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orbit.server.core.rate_window import RateWindow, authorize_start, claim_room

T0 = datetime(2026, 11, 29, 22, 0, 0)
MS = timedelta(milliseconds=1)


def test_first_start_opens_a_window():
    d = authorize_start(RateWindow(None, 0, 1), 2, T0, reserved=True)
    assert d.allowed and d.window == RateWindow(T0, 1, 0)


def test_window_full_answers_time_to_its_end():
    w = RateWindow(T0, 2, 0)
    d = authorize_start(w, 2, T0 + 300 * MS, reserved=False)
    assert not d.allowed and d.window == w and d.retry_after_ms == 700


def test_ended_window_is_replaced_at_now():
    d = authorize_start(RateWindow(T0, 5, 3), 5, T0 + 1000 * MS, reserved=True)
    assert d.allowed and d.window == RateWindow(T0 + 1000 * MS, 1, 2)


def test_claim_room_counts_reservations_and_current_window_only():
    assert claim_room(RateWindow(T0, 3, 2), 10, T0 + 10 * MS) == 5
    assert claim_room(RateWindow(T0, 3, 2), 10, T0 + 1000 * MS) == 8
    assert claim_room(RateWindow(T0, 9, 5), 10, T0) == 0


def test_lowering_the_rate_keeps_used_and_refuses():
    w = RateWindow(T0, 5, 0)
    assert not authorize_start(w, 1, T0 + 1 * MS, reserved=False).allowed


@settings(max_examples=200)
@given(st.integers(1, 20), st.lists(st.integers(0, 400), min_size=1, max_size=200))
def test_no_window_ever_holds_more_than_the_rate(rate, gaps):
    """Drive Starts at arbitrary times; count approved Starts per opened window."""
    w = RateWindow(None, 0, 0)
    now = T0
    per_window: dict[datetime, int] = {}
    for g in gaps:
        now += g * MS
        d = authorize_start(w, rate, now, reserved=False)
        if d.allowed:
            w = d.window
            per_window[w.start] = per_window.get(w.start, 0) + 1
    assert all(n <= rate for n in per_window.values())
    starts = sorted(per_window)
    assert all(b - a >= timedelta(seconds=1) for a, b in zip(starts, starts[1:]))
