"""Guarded usage UPDATEs (MySQL): the SQL that counts Starts on a rate window as it stands when
the UPDATE locks the row must decide exactly as the pure rules in `core/rate_window.py`."""

from datetime import timedelta

import pytest

from orbit.server.core.ids import new_id
from orbit.server.core.rate_window import RateWindow, authorize_start
from orbit.server.services.usage import PlanNoLongerHolds, UsageChanges
from orbit.server.store.db import BAD_NULL

pytestmark = pytest.mark.anyio

RATE = 5


def expected(start, used, n, now):
    """`authorize_start` n times; None when one of them is refused or the window is later than now."""
    window = RateWindow(start, used, 0)
    if start is not None and start > now:
        return None
    for _ in range(n):
        decision = authorize_start(window, RATE, now, reserved=False)
        if not decision.allowed:
            return None
        window = decision.window
    return window.start, window.used


async def test_counting_starts_in_the_update_matches_the_rate_rules(db):
    if db.dialect != "mysql":
        pytest.skip("SQLite counts Starts on a window it read under its single writer lock")
    now = (await db.fast_transaction(lambda tx: tx.now())).replace(microsecond=500000)
    starts = [None, now - timedelta(seconds=2), now - timedelta(seconds=1), now - timedelta(microseconds=999999),
              now - timedelta(milliseconds=500), now, now + timedelta(milliseconds=100)]
    cases = [(s, u, n) for s in starts for u in (0, 2, 3, 4, 5) for n in (1, 2, 3)]
    for start, used, n in cases:
        qid = new_id()
        await db.fast_transaction(lambda tx, q=qid, s=start, u=used: tx.raw(
            "INSERT INTO queue_usage (queue_id, unfinished, permits_in_use, rate_window_start, rate_window_used, "
            "rate_reserved) VALUES (?, 0, 0, ?, ?, 0)", (q, s, u)))
        want = expected(start, used, n, now)
        if want is None:
            with pytest.raises(PlanNoLongerHolds):
                await db.fast_transaction(lambda tx, q=qid, k=n: _count(tx, q, k, now))
        else:
            await db.fast_transaction(lambda tx, q=qid, k=n: _count(tx, q, k, now))
        rows = await db.fast_transaction(lambda tx, q=qid: tx.raw_rows(
            "SELECT rate_window_start, rate_window_used FROM queue_usage WHERE queue_id = ?", (q,)))
        got = (rows[0]["rate_window_start"], rows[0]["rate_window_used"])
        assert got == (want if want is not None else (start, used)), (start, used, n)


async def _count(tx, queue_id, n, now):
    tx.error_means(BAD_NULL, PlanNoLongerHolds)
    changes = UsageChanges()
    changes.count_starts(queue_id, n, RATE, now)
    await changes.apply(tx)
