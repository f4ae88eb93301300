from datetime import datetime, timedelta

from tests.support.history import max_overlap, rate_windows

T = datetime(2026, 11, 29, 12, 0, 0)
MS = timedelta(milliseconds=1)


def test_rate_windows_are_opened_by_the_first_start_after_the_previous_one_ended():
    starts = [T, T + 400 * MS, T + 999 * MS, T + 1000 * MS, T + 1999 * MS, T + 2500 * MS]
    assert rate_windows(starts) == [3, 2, 1]


def test_max_overlap_treats_intervals_as_half_open():
    assert max_overlap([(T, T + MS), (T + MS, T + 2 * MS)]) == 1
    assert max_overlap([(T, T + 3 * MS), (T + MS, T + 2 * MS), (T + MS, T + 4 * MS)]) == 3
