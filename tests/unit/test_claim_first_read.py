"""Which form a claim's first read of due tasks takes: the plain locking scan for a queue its
node's claims read few tasks of lately, candidates then locks for a busy one."""

import math
import time
from types import SimpleNamespace

import pytest

from orbit.server.services import dispatch
from orbit.server.services.dispatch import ClaimCommand, ClaimReads, decayed

QUEUE = "q" * 32


def _first_read_sql() -> str:
    who = SimpleNamespace(principal=SimpleNamespace(credential_id="c" * 32))
    reads = ClaimReads([ClaimCommand(who, QUEUE, 10, 30_000, "m1")], optimistic=True)  # type: ignore[arg-type]
    return reads.reads[-1].sql


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(dispatch, "_claimed", {})


def test_a_count_decays_by_e_each_second():
    assert decayed(None, 5.0) == 0.0
    assert decayed((5.0, 100.0), 5.0) == 100.0
    assert decayed((5.0, 100.0), 6.0) == pytest.approx(100 / math.e)
    assert decayed((6.0, 100.0), 5.0) == 100.0  # a clock read out of order never inflates it


def test_a_quiet_queue_is_scanned_with_locks_and_a_busy_one_read_by_candidates():
    assert "LEFT JOIN" not in _first_read_sql()
    now = time.monotonic()
    dispatch._note_claimed({QUEUE: [{}] * 60}, now)
    assert "LEFT JOIN" not in _first_read_sql()
    dispatch._note_claimed({QUEUE: [{}] * 60}, now)
    assert dispatch._claimed_lately(QUEUE, now) >= dispatch.CANDIDATES_FROM
    assert "LEFT JOIN" in _first_read_sql()


def test_nothing_is_kept_for_a_queue_whose_claims_read_nothing():
    dispatch._note_claimed({QUEUE: []}, 1.0)
    assert QUEUE not in dispatch._claimed
