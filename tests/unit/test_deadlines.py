from datetime import datetime, timedelta

from orbit.server.core import states
from orbit.server.core.deadlines import next_sweep, sweep_action

T0 = datetime(2026, 1, 1)
S = timedelta(seconds=1)


def test_next_sweep_is_the_earlier_deadline_while_waiting():
    assert next_sweep(states.WAITING, 0, T0 + 10 * S, T0 + 5 * S, False) == T0 + 5 * S
    assert next_sweep(states.WAITING, 0, None, T0 + 5 * S, False) == T0 + 5 * S
    assert next_sweep(states.WAITING, 0, T0 + 10 * S, None, False) == T0 + 10 * S
    assert next_sweep(states.WAITING, 0, None, None, False) is None


def test_start_deadline_stops_counting_after_the_first_start():
    assert next_sweep(states.WAITING, 1, T0 + 10 * S, T0 + 5 * S, False) == T0 + 10 * S
    assert next_sweep(states.RUNNING, 1, T0 + 10 * S, T0 + 5 * S, False) == T0 + 10 * S
    assert next_sweep(states.WAITING, 1, None, T0 + 5 * S, False) is None


def test_nothing_to_sweep_once_finished_under_review_or_cancel_requested():
    for state in (states.SUCCEEDED, states.FAILED, states.CANCELLED, states.NEEDS_REVIEW):
        assert next_sweep(state, 1, T0, T0, False) is None
    assert next_sweep(states.RUNNING, 1, T0, None, True) is None


def test_sweep_fails_waiting_and_leased_tasks_past_a_deadline():
    a = sweep_action(states.WAITING, 0, T0 + 10 * S, T0 + 5 * S, False, T0 + 6 * S)
    assert (a.kind, a.code) == ("fail", "START_DEADLINE_EXCEEDED")
    a = sweep_action(states.LEASED, 0, T0 + 10 * S, None, False, T0 + 10 * S)
    assert (a.kind, a.code) == ("fail", "DEADLINE_EXCEEDED")
    # Both passed: the one that passed first names the failure.
    a = sweep_action(states.WAITING, 0, T0 + 4 * S, T0 + 5 * S, False, T0 + 9 * S)
    assert a.code == "DEADLINE_EXCEEDED"
    a = sweep_action(states.WAITING, 0, T0 + 6 * S, T0 + 5 * S, False, T0 + 9 * S)
    assert a.code == "START_DEADLINE_EXCEEDED"


def test_a_retried_task_is_not_failed_by_its_start_deadline():
    a = sweep_action(states.WAITING, 1, T0 + 10 * S, T0 + 5 * S, False, T0 + 6 * S)
    assert (a.kind, a.next_sweep_at) == ("reschedule", T0 + 10 * S)


def test_running_past_the_total_deadline_gets_one_cancel_request():
    a = sweep_action(states.RUNNING, 1, T0 + 5 * S, None, False, T0 + 6 * S)
    assert (a.kind, a.message) == ("cancel", "the total deadline passed")
    a = sweep_action(states.RUNNING, 1, T0 + 5 * S, None, True, T0 + 6 * S)
    assert (a.kind, a.next_sweep_at) == ("reschedule", None)
    a = sweep_action(states.RUNNING, 1, T0 + 10 * S, T0 + 5 * S, False, T0 + 6 * S)
    assert (a.kind, a.next_sweep_at) == ("reschedule", T0 + 10 * S)


def test_finished_tasks_leave_the_sweep():
    a = sweep_action(states.SUCCEEDED, 1, T0, T0, False, T0 + S)
    assert (a.kind, a.next_sweep_at) == ("reschedule", None)
