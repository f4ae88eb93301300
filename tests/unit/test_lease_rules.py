"""Lease rules without a database."""

from orbit.server.core.lease import (
    MAX_LATE_REPORT_BYTES,
    MAX_LATE_REPORTS,
    keeps_late_report,
    keeps_late_result,
)


def test_late_evidence_is_bounded_by_count_and_its_results_by_size():
    assert keeps_late_report(1) and keeps_late_report(MAX_LATE_REPORTS)
    assert not keeps_late_report(MAX_LATE_REPORTS + 1)
    assert keeps_late_result(100) and keeps_late_result(MAX_LATE_REPORT_BYTES)
    assert not keeps_late_result(MAX_LATE_REPORT_BYTES + 1)
