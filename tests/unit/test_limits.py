"""The cluster-wide limits as pure rules (`core/limits.py`): backlog admission, claim grants, Starts."""

from datetime import datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from orbit.server.core.limits import (
    APPLICATION_FULL,
    QUEUE_FULL,
    Backlog,
    QueueLimits,
    admit_in_order,
    backlog_fits,
    count_starts,
    grant_size,
    grant_still_fits,
    may_lease,
)
from orbit.server.core.rate_window import RateWindow, authorize_start

NOW = datetime(2026, 11, 29, 12, 0, 0, 500000)
MS = timedelta(milliseconds=1)
SECOND = timedelta(seconds=1)


def limits(*, paused=False, max_concurrency=10, rate=100, permits=0, window=None) -> QueueLimits:
    return QueueLimits(paused, max_concurrency, rate, permits, window or RateWindow(None, 0, 0))


# ---------------------------------------------------------------- backlog


def test_backlog_fits_up_to_the_limit():
    assert backlog_fits(3, 2, 5)
    assert not backlog_fits(3, 3, 5)
    assert not backlog_fits(7, 1, 5)  # a limit lowered below the backlog admits nothing


def test_room_is_the_smaller_of_both_limits_and_never_negative():
    assert Backlog(2, 10, 5, 8).room() == 3
    assert Backlog(7, 10, 0, 8).room() == 3
    assert Backlog(12, 10, 0, 8).room() == 0
    assert Backlog(0, 10, 9, 8).room() == 0


def test_the_queue_limit_is_checked_first():
    assert admit_in_order(3, Backlog(5, 5, 8, 8)) == [QUEUE_FULL] * 3
    assert admit_in_order(4, Backlog(0, 2, 0, 2)) == [None, None, QUEUE_FULL, QUEUE_FULL]


def test_the_application_limit_refuses_when_the_queue_has_room():
    assert admit_in_order(4, Backlog(0, 5, 3, 5)) == [None, None, APPLICATION_FULL, APPLICATION_FULL]
    assert admit_in_order(2, Backlog(0, 5, 6, 5)) == [APPLICATION_FULL] * 2


def test_a_refusal_sticks_for_the_rest_of_the_batch():
    assert admit_in_order(4, Backlog(0, 1, 0, 3)) == [None, QUEUE_FULL, QUEUE_FULL, QUEUE_FULL]
    assert admit_in_order(3, Backlog(0, 3, 2, 3)) == [None, APPLICATION_FULL, APPLICATION_FULL]


def test_everything_fits_and_nothing_is_asked():
    assert admit_in_order(3, Backlog(0, 5, 0, 5)) == [None] * 3
    assert admit_in_order(0, Backlog(5, 5, 5, 5)) == []


backlogs = st.builds(Backlog, *[st.integers(min_value=0, max_value=12)] * 4)


@given(st.integers(min_value=0, max_value=15), backlogs)
def test_admission_takes_the_room_in_order(n, backlog):
    out = admit_in_order(n, backlog)
    admitted = out.count(None)
    assert len(out) == n
    assert admitted == min(n, backlog.room())
    assert out[:admitted] == [None] * admitted  # refusals are a suffix: a batch is never reordered
    refusals = set(out[admitted:])
    assert len(refusals) <= 1
    if refusals:
        queue_room = max(0, backlog.queue_limit - backlog.queue_unfinished)
        app_room = max(0, backlog.app_limit - backlog.app_unfinished)
        assert refusals == {QUEUE_FULL if queue_room <= app_room else APPLICATION_FULL}
    # The guarded UPDATE's rule agrees: the admitted tasks fit both limits, one more would not.
    assert backlog_fits(backlog.queue_unfinished, admitted, max(backlog.queue_limit, backlog.queue_unfinished))
    assert backlog_fits(backlog.app_unfinished, admitted, max(backlog.app_limit, backlog.app_unfinished))
    if admitted < n:
        assert not (backlog_fits(backlog.queue_unfinished, admitted + 1, backlog.queue_limit)
                    and backlog_fits(backlog.app_unfinished, admitted + 1, backlog.app_limit))


# ---------------------------------------------------------------- claim grants


def test_a_paused_queue_grants_nothing():
    assert grant_size(5, limits(paused=True), NOW) == 0


def test_grants_are_capped_by_free_permits():
    assert grant_size(5, limits(max_concurrency=4, permits=1), NOW) == 3
    assert grant_size(5, limits(max_concurrency=4, permits=4), NOW) == 0
    assert grant_size(5, limits(max_concurrency=4, permits=6), NOW) == 0  # concurrency lowered


def test_grants_are_capped_by_rate_room_net_of_reservations():
    open_window = RateWindow(NOW - 100 * MS, 3, 2)
    assert grant_size(10, limits(rate=10, window=open_window), NOW) == 5
    assert grant_size(10, limits(rate=5, window=open_window), NOW) == 0
    # An ended window's Starts count no more; its reservations still do.
    ended = RateWindow(NOW - 2 * SECOND, 10, 2)
    assert grant_size(10, limits(rate=10, window=ended), NOW) == 8


def test_grants_are_capped_by_what_was_asked():
    assert grant_size(2, limits(), NOW) == 2
    assert grant_size(0, limits(), NOW) == 0


def test_a_claim_may_lease_only_when_a_task_waits_and_the_queue_grants_one():
    assert may_lease(limits(), 1, NOW)
    assert not may_lease(limits(), 0, NOW)  # every unfinished task holds a permit: none waits
    assert not may_lease(limits(paused=True), 5, NOW)
    assert not may_lease(limits(max_concurrency=4, permits=4), 5, NOW)
    assert not may_lease(limits(rate=3, window=RateWindow(NOW - 100 * MS, 3, 0)), 5, NOW)


@given(st.integers(0, 5), st.integers(0, 12), st.integers(0, 12))
def test_may_lease_is_exactly_whether_a_one_task_claim_is_granted(waiting, max_concurrency, permits):
    q = limits(max_concurrency=max_concurrency, permits=permits)
    assert may_lease(q, waiting, NOW) == (waiting > 0 and grant_size(1, q, NOW) == 1)


def test_a_grant_does_not_fit_a_window_opened_later_than_now():
    later = RateWindow(NOW + MS, 0, 0)
    assert not grant_still_fits(1, limits(window=later), NOW)
    assert not grant_still_fits(0, limits(window=later), NOW)


def test_a_grant_still_fits_while_permits_and_rate_room_last():
    q = limits(max_concurrency=4, permits=2, rate=10, window=RateWindow(NOW - 100 * MS, 6, 1))
    assert grant_still_fits(2, q, NOW)
    assert grant_still_fits(3, limits(max_concurrency=4, permits=1, rate=10, window=RateWindow(NOW, 6, 1)), NOW)
    assert not grant_still_fits(3, q, NOW)  # permits
    assert not grant_still_fits(4, limits(max_concurrency=9, rate=10, window=RateWindow(NOW - 100 * MS, 6, 1)), NOW)
    assert not grant_still_fits(1, limits(paused=True), NOW)


windows = st.builds(
    RateWindow,
    st.one_of(st.none(), st.integers(min_value=-3000, max_value=300).map(lambda ms: NOW + ms * MS)),
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=0, max_value=12),
)
queue_limits = st.builds(QueueLimits, st.booleans(), st.integers(0, 12), st.integers(0, 12), st.integers(0, 14), windows)


@given(st.integers(min_value=0, max_value=15), queue_limits)
def test_a_grant_fits_the_row_it_was_sized_on(wanted, q):
    granted = grant_size(wanted, q, NOW)
    assert 0 <= granted <= wanted
    later = q.window.start is not None and q.window.start > NOW
    over = q.permits_in_use > q.max_concurrency  # concurrency lowered below the permits in use
    assert grant_still_fits(granted, q, NOW) is (not q.paused and not later and not over)
    if not q.paused and not later:
        assert granted == wanted or not grant_still_fits(granted + 1, q, NOW)


# ---------------------------------------------------------------- Starts


def authorize_each(window, rate, now, reserved):
    for r in reserved:
        decision = authorize_start(window, rate, now, reserved=r)
        if not decision.allowed:
            return None
        window = decision.window
    return window


def test_starts_open_a_window_and_count_in_it():
    assert count_starts(RateWindow(None, 0, 0), 5, NOW, [False, False]) == RateWindow(NOW, 2, 0)
    assert count_starts(RateWindow(NOW - 300 * MS, 3, 2), 5, NOW, [True, False]) == RateWindow(NOW - 300 * MS, 5, 1)
    assert count_starts(RateWindow(NOW - SECOND, 5, 0), 5, NOW, [False]) == RateWindow(NOW, 1, 0)  # ended


def test_starts_past_the_rate_are_refused_all_together():
    assert count_starts(RateWindow(NOW - 300 * MS, 4, 0), 5, NOW, [False, False]) is None
    assert count_starts(RateWindow(None, 0, 0), 2, NOW, [False] * 3) is None


def test_starts_on_a_window_opened_later_than_now_are_refused():
    assert count_starts(RateWindow(NOW + MS, 0, 0), 5, NOW, [False]) is None


@given(windows, st.integers(min_value=1, max_value=8), st.lists(st.booleans(), max_size=6))
def test_counting_starts_is_authorizing_them_one_by_one(window, rate, reserved):
    got = count_starts(window, rate, NOW, reserved)
    if window.start is not None and window.start > NOW:
        assert got is None
    else:
        assert got == authorize_each(window, rate, NOW, reserved)
