"""Node settings that can be out of range are refused before the node starts."""

from __future__ import annotations

import pytest

from orbit.server.config import Settings


def test_the_claim_poll_interval_defaults_to_25_ms_and_is_bounded(monkeypatch):
    assert Settings(database_url="sqlite://").claim_poll_seconds() == 0.025
    monkeypatch.setenv("ORBIT_CLAIM_POLL_MS", "200")
    assert Settings(database_url="sqlite://").claim_poll_seconds() == 0.2
    for ok in (5, 1000):
        Settings(database_url="sqlite://", claim_poll_ms=ok).check()
    for bad in (0, 4, 1001):
        with pytest.raises(ValueError, match="ORBIT_CLAIM_POLL_MS must be from 5 to 1000"):
            Settings(database_url="sqlite://", claim_poll_ms=bad).check()


def test_check_names_the_first_setting_out_of_range():
    with pytest.raises(ValueError, match="ORBIT_MAX_REQUESTS_IN_PROGRESS"):
        Settings(database_url="sqlite://", max_requests_in_progress=-1).check()
    with pytest.raises(ValueError, match="not a host:port address"):
        Settings(database_url="sqlite://", metrics_listen="nowhere").check()
