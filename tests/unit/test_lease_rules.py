"""Lease rules without a database."""

from datetime import UTC, datetime

from orbit.server.core.lease import (
    MAX_LATE_REPORT_BYTES,
    MAX_LATE_REPORTS,
    as_started,
    keeps_late_report,
    keeps_late_result,
    start_fields,
)

T0 = datetime(2026, 12, 5, 7, 0, tzinfo=UTC)
UNSTARTED = {"id": "l1", "state": "LEASED", "reserved": True, "started_at": None, "start_msg_id": None,
             "start_response": None}
START = {"started_at": T0, "start_msg_id": "s-1", "start_response": '{"attempt":2}'}


def test_late_evidence_is_bounded_by_count_and_its_results_by_size():
    assert keeps_late_report(1) and keeps_late_report(MAX_LATE_REPORTS)
    assert not keeps_late_report(MAX_LATE_REPORTS + 1)
    assert keeps_late_result(100) and keeps_late_result(MAX_LATE_REPORT_BYTES)
    assert not keeps_late_result(MAX_LATE_REPORT_BYTES + 1)


def test_a_leased_lease_under_a_running_task_reads_started_from_the_task_row():
    lease = as_started(UNSTARTED, {"state": "RUNNING", **START})
    assert lease["state"] == "RUNNING" and lease["reserved"] is False
    assert {k: lease[k] for k in START} == START
    assert start_fields(lease) == START  # what its row gets when it ends
    assert UNSTARTED["state"] == "LEASED"  # the row read is left as it was


def test_an_unstarted_lease_ignores_an_earlier_attempts_start_on_its_task_row():
    for state in ("LEASED", "WAITING", "SUCCEEDED"):
        lease = as_started(UNSTARTED, {"state": state, **START})
        assert lease == UNSTARTED and start_fields(lease) == {}


def test_lease_rows_a_start_wrote_itself_or_that_ended_read_as_they_are():
    started_in_row = {**UNSTARTED, "state": "RUNNING", "reserved": False, **START}
    ended = {**started_in_row, "state": "ENDED"}
    for row in (started_in_row, ended):
        lease = as_started(row, {"state": "RUNNING", "started_at": None, "start_msg_id": None,
                                 "start_response": None})
        assert lease == row and start_fields(lease) == {}
