"""The guarded usage UPDATEs of `store/queries/usage.py` decide, under the row lock the UPDATE itself
takes, what the pure rules of `core/limits.py` decide on rows read: tested against them over
generated cases, on the backend(s) where the SQL runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbit.server.core.ids import new_id
from orbit.server.core.limits import APPLICATION_FULL, QUEUE_FULL, backlog_fits, count_starts
from orbit.server.core.rate_window import RateWindow
from orbit.server.store.db import Database
from orbit.server.store.dialect import PlanNoLongerHolds
from orbit.server.store.queries.usage import UsageChanges, take_backlog_slots
from orbit.server.store.tx import Stmt

RATE = 5
US = timedelta(microseconds=1)
SECOND = timedelta(seconds=1)
MYSQL_ONLY = "SQLite counts Starts on a window it read under its single writer lock"


def run_examples(db_url: str, check, strategy, max_examples: int) -> None:
    """Run `check(db, case)` for generated cases on one Database and event loop."""
    with asyncio.Runner() as runner:
        db = Database(db_url, pool_size=2)
        try:
            @settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(strategy)
            def examples(case):
                runner.run(check(db, case))

            examples()
        finally:
            runner.run(db.close())


# ---------------------------------------------------------------- Starts on the rate window (MySQL)


async def insert_queue_usage(db: Database, *, start: datetime | None = None, used: int = 0, reserved: int = 0,
                             unfinished: int = 0) -> str:
    qid = new_id()
    await db.transaction(lambda tx: tx.count(Stmt(
        "INSERT INTO queue_usage (queue_id, unfinished, permits_in_use, rate_window_start, rate_window_used, "
        "rate_reserved) VALUES (?, ?, 0, ?, ?, ?)", (qid, unfinished, start, used, reserved))))
    return qid


async def window_row(db: Database, qid: str) -> tuple[datetime | None, int, int]:
    row = await db.read(lambda tx: tx.one(Stmt(
        "SELECT rate_window_start, rate_window_used, rate_reserved FROM queue_usage WHERE queue_id = ?", (qid,))))
    assert row is not None
    return row["rate_window_start"], int(row["rate_window_used"]), int(row["rate_reserved"])


async def count_in_sql(db: Database, qid: str, n: int, rate: int, now: datetime, *, reservations: int = 0) -> None:
    async def body(tx):
        changes = UsageChanges()
        assert changes.count_starts_in_sql(tx, qid, n, rate, now)
        if reservations:
            changes.add(qid, None, rate_reserved=-reservations)
        await changes.apply(tx)

    await db.transaction(body)


async def assert_counts_like_the_rule(db: Database, start: datetime | None, used: int, reserved: list[bool],
                                      rate: int, now: datetime, held: int) -> None:
    """Count `len(reserved)` Starts in SQL on a window (`held` reservations on the row) and compare
    the row with `core.limits.count_starts` on the same window."""
    qid = await insert_queue_usage(db, start=start, used=used, reserved=held)
    want = count_starts(RateWindow(start, used, held), rate, now, reserved)
    case = (start, used, held, reserved, rate, now)
    if want is None:
        with pytest.raises(PlanNoLongerHolds):
            await count_in_sql(db, qid, len(reserved), rate, now, reservations=sum(reserved))
        assert await window_row(db, qid) == (start, used, held), case
    else:
        await count_in_sql(db, qid, len(reserved), rate, now, reservations=sum(reserved))
        assert await window_row(db, qid) == (want.start, want.used, want.reserved), case


@pytest.mark.anyio
async def test_counting_starts_in_the_update_matches_the_rule_on_every_boundary(db):
    """7 window starts (none, ended, just ended, just open, open, now, later than now) x used x n."""
    if db.dialect != "mysql":
        pytest.skip(MYSQL_ONLY)
    now = (await db.transaction(lambda tx: tx.now())).replace(microsecond=500000)
    starts = [None, now - 2 * SECOND, now - SECOND, now - SECOND + US, now - SECOND / 2, now, now + SECOND / 10]
    cases = [(s, u, n) for s in starts for u in (0, 2, 3, 4, 5) for n in (1, 2, 3)]
    assert len(cases) == 105
    for start, used, n in cases:
        await assert_counts_like_the_rule(db, start, used, [False] * n, RATE, now, 0)


@st.composite
def start_cases(draw):
    now = draw(st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1)))
    offset = draw(st.one_of(
        st.none(),
        st.sampled_from([-2 * SECOND, -SECOND, -SECOND + US, -SECOND / 2, -US, timedelta(0), US, SECOND / 10]),
        st.integers(min_value=-3_000_000, max_value=500_000).map(lambda us: timedelta(microseconds=us)),
    ))
    rate = draw(st.integers(min_value=1, max_value=6))
    used = draw(st.integers(min_value=0, max_value=rate + 1))
    n = draw(st.integers(min_value=1, max_value=4))
    held = draw(st.integers(min_value=0, max_value=3))
    reserved = draw(st.lists(st.booleans(), min_size=n, max_size=n).filter(lambda r: sum(r) <= held))
    return (None if offset is None else now + offset), used, reserved, rate, now, held


def test_counting_starts_in_the_update_matches_the_rule(db_url):
    """Window start none / ended / open / later than now, any used, n Starts (some consuming
    reservations), any rate."""
    if not db_url.startswith("mysql"):
        pytest.skip(MYSQL_ONLY)

    async def check(db, case):
        start, used, reserved, rate, now, held = case
        await assert_counts_like_the_rule(db, start, used, reserved, rate, now, held)

    run_examples(db_url, check, start_cases(), max_examples=300)


@pytest.mark.anyio
async def test_starts_are_counted_in_sql_only_where_writes_wait_for_the_commit(db):
    """Elsewhere (SQLite) the caller counts them on the window it read under the lock."""
    async def body(tx):
        return UsageChanges().count_starts_in_sql(tx, new_id(), 1, RATE, await tx.now())

    assert await db.transaction(body) is (db.dialect == "mysql")


# ---------------------------------------------------------------- backlog slots (both backends)


@dataclass(frozen=True)
class BacklogCase:
    queue_unfinished: int
    queue_limit: int
    app_unfinished: int
    app_limit: int
    n: int


class Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


async def insert_backlog(db: Database, case: BacklogCase) -> tuple[str, str]:
    qid, aid = new_id(), new_id()

    async def body(tx):
        await tx.count(Stmt(
            "INSERT INTO applications (id, name, paused, max_concurrency, rate_per_second, max_unfinished_tasks, "
            "revision, created_at, updated_at) VALUES (?, ?, 0, 1, 1, ?, 1, {NOW}, {NOW})",
            (aid, f"guards-{aid}", case.app_limit)))
        await tx.count(Stmt(
            "INSERT INTO queues (id, namespace_id, name, paused, max_concurrency, rate_per_second, "
            "max_unfinished_tasks, revision, retired_at, created_at, updated_at) "
            "VALUES (?, ?, ?, 0, 1, 1, ?, 1, NULL, {NOW}, {NOW})",
            (qid, new_id(), f"guards-{qid}", case.queue_limit)))
        await tx.count(Stmt(
            "INSERT INTO queue_usage (queue_id, unfinished, permits_in_use, rate_window_start, rate_window_used, "
            "rate_reserved) VALUES (?, ?, 0, NULL, 0, 0)", (qid, case.queue_unfinished)))
        await tx.count(Stmt(
            "INSERT INTO application_usage (application_id, unfinished, permits_in_use, rate_window_start, "
            "rate_window_used, rate_reserved) VALUES (?, ?, 0, NULL, 0, 0)", (aid, case.app_unfinished)))

    await db.transaction(body)
    return qid, aid


async def unfinished(db: Database, qid: str, aid: str) -> tuple[int, int]:
    q, a = await db.read(lambda tx: tx.rows_multi([
        Stmt("SELECT unfinished FROM queue_usage WHERE queue_id = ?", (qid,)),
        Stmt("SELECT unfinished FROM application_usage WHERE application_id = ?", (aid,)),
    ]))
    return int(q[0]["unfinished"]), int(a[0]["unfinished"])


async def assert_takes_like_the_rule(db: Database, case: BacklogCase) -> None:
    qid, aid = await insert_backlog(db, case)
    queue_fits = backlog_fits(case.queue_unfinished, case.n, case.queue_limit)
    app_fits = backlog_fits(case.app_unfinished, case.n, case.app_limit)

    async def take(tx):
        code = await take_backlog_slots(tx, qid, aid, case.n)
        if code is not None:
            raise Refused(code)  # rolls back whatever was taken

    if queue_fits and app_fits:
        await db.transaction(take)
        assert await unfinished(db, qid, aid) == (case.queue_unfinished + case.n, case.app_unfinished + case.n), case
        return
    if db.dialect == "mysql":
        # The guarded UPDATEs travel with the COMMIT: a refusal fails it, whichever limit refused.
        with pytest.raises(PlanNoLongerHolds):
            await db.transaction(take)
    else:
        with pytest.raises(Refused) as refused:
            await db.transaction(take)
        assert refused.value.code == (QUEUE_FULL if not queue_fits else APPLICATION_FULL), case
    assert await unfinished(db, qid, aid) == (case.queue_unfinished, case.app_unfinished), case


backlog_cases = st.builds(
    BacklogCase,
    queue_unfinished=st.integers(min_value=0, max_value=8),
    queue_limit=st.integers(min_value=0, max_value=6),
    app_unfinished=st.integers(min_value=0, max_value=8),
    app_limit=st.integers(min_value=0, max_value=6),
    n=st.integers(min_value=1, max_value=5),
)


def test_taking_backlog_slots_matches_the_rule(db_url):
    """Both slots are taken exactly when `core.limits.backlog_fits` admits `n` more tasks in the
    queue and in its application; a refusal takes nothing (and names the queue first)."""
    run_examples(db_url, assert_takes_like_the_rule, backlog_cases, max_examples=200)
