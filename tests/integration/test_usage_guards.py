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
from orbit.server.core.limits import (APPLICATION_FULL, QUEUE_FULL, QueueLimits, backlog_fits, count_starts,
                                      grant_still_fits)
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


# ---------------------------------------------------------------- a claim's permits (MySQL)


@dataclass(frozen=True)
class Layer:
    """A queue's or an application's controls and usage row, as a claim's grant meets them."""

    paused: bool
    max_concurrency: int
    rate: int
    permits: int
    start: timedelta | None  # the window's start, from the plan's clock
    used: int
    reserved: int

    def limits(self, now: datetime) -> QueueLimits:
        start = None if self.start is None else now + self.start
        return QueueLimits(self.paused, self.max_concurrency, self.rate, self.permits,
                           RateWindow(start, self.used, self.reserved))


@st.composite
def layers(draw, n: int):
    """A layer near the edge of admitting n more leases: permits and rate space within two of it."""
    permits = draw(st.integers(min_value=0, max_value=4))
    used = draw(st.integers(min_value=0, max_value=4))
    reserved = draw(st.integers(min_value=0, max_value=4))
    return Layer(
        paused=draw(st.sampled_from([False, False, False, True])),
        max_concurrency=max(0, permits + n + draw(st.integers(min_value=-2, max_value=2))),
        rate=max(0, used + reserved + n + draw(st.integers(min_value=-2, max_value=2))),
        permits=permits,
        start=draw(st.none() | st.sampled_from([-2 * SECOND, -SECOND, -SECOND + US, -SECOND / 2, -US, timedelta(0), US])
                   | st.integers(min_value=-3_000_000, max_value=500_000).map(lambda us: timedelta(microseconds=us))),
        used=used,
        reserved=reserved,
    )


async def insert_layers(db: Database, queue: Layer, app: Layer, key_limit: int, key_permits: int,
                        now: datetime) -> tuple[str, str, str]:
    qid, aid, kid = new_id(), new_id(), new_id()

    def start(layer: Layer) -> datetime | None:
        return None if layer.start is None else now + layer.start

    async def body(tx):
        await tx.count(Stmt(
            "INSERT INTO applications (id, name, paused, max_concurrency, rate_per_second, max_unfinished_tasks, "
            "revision, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 100, 1, {NOW}, {NOW})",
            (aid, f"grants-{aid}", app.paused, app.max_concurrency, app.rate)))
        await tx.count(Stmt(
            "INSERT INTO queues (id, namespace_id, name, paused, max_concurrency, rate_per_second, "
            "max_unfinished_tasks, revision, retired_at, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, 100, 1, NULL, {NOW}, {NOW})",
            (qid, new_id(), f"grants-{qid}", queue.paused, queue.max_concurrency, queue.rate)))
        await tx.count(Stmt(
            "INSERT INTO resource_keys (id, namespace_id, name, max_concurrency, revision, retired_at, created_at, "
            "updated_at) VALUES (?, ?, ?, ?, 1, NULL, {NOW}, {NOW})", (kid, new_id(), f"grants-{kid}", key_limit)))
        for table, column, layer, id_ in (("queue_usage", "queue_id", queue, qid),
                                          ("application_usage", "application_id", app, aid)):
            await tx.count(Stmt(
                f"INSERT INTO {table} ({column}, unfinished, permits_in_use, rate_window_start, rate_window_used, "
                "rate_reserved) VALUES (?, 0, ?, ?, ?, ?)", (id_, layer.permits, start(layer), layer.used, layer.reserved)))
        await tx.count(Stmt("INSERT INTO resource_key_usage (resource_key_id, unfinished, permits_in_use) "
                            "VALUES (?, 0, ?)", (kid, key_permits)))

    await db.transaction(body)
    return qid, aid, kid


async def permits_rows(db: Database, qid: str, aid: str, kid: str) -> tuple[tuple[int, int], tuple[int, int], int]:
    q, a, k = await db.read(lambda tx: tx.rows_multi([
        Stmt("SELECT permits_in_use, rate_reserved FROM queue_usage WHERE queue_id = ?", (qid,)),
        Stmt("SELECT permits_in_use, rate_reserved FROM application_usage WHERE application_id = ?", (aid,)),
        Stmt("SELECT permits_in_use FROM resource_key_usage WHERE resource_key_id = ?", (kid,)),
    ]))
    return ((int(q[0]["permits_in_use"]), int(q[0]["rate_reserved"])),
            (int(a[0]["permits_in_use"]), int(a[0]["rate_reserved"])), int(k[0]["permits_in_use"]))


@st.composite
def grant_cases(draw):
    n = draw(st.integers(min_value=1, max_value=4))
    key_permits = draw(st.integers(min_value=0, max_value=4))
    key_limit = max(0, key_permits + n + draw(st.integers(min_value=-1, max_value=2)))
    return draw(layers(n)), draw(layers(n)), key_limit, key_permits, n


async def assert_grants_like_the_rule(db: Database, case: tuple[Layer, Layer, int, int, int]) -> None:
    queue, app, key_limit, key_permits, n = case
    now = (await db.transaction(lambda tx: tx.now())).replace(microsecond=500000)
    qid, aid, kid = await insert_layers(db, queue, app, key_limit, key_permits, now)
    fits = (grant_still_fits(n, queue.limits(now), now) and grant_still_fits(n, app.limits(now), now)
            and key_permits + n <= key_limit)

    async def take(tx):
        changes = UsageChanges()
        changes.add(qid, aid, permits_in_use=n, rate_reserved=n, keys=[kid])
        assert changes.grant_permits_in_sql(tx, now)
        await changes.apply(tx)

    before = await permits_rows(db, qid, aid, kid)
    if fits:
        await db.transaction(take)
        assert await permits_rows(db, qid, aid, kid) == (
            (queue.permits + n, queue.reserved + n), (app.permits + n, app.reserved + n), key_permits + n), case
    else:
        with pytest.raises(PlanNoLongerHolds):
            await db.transaction(take)
        assert await permits_rows(db, qid, aid, kid) == before, case


@pytest.mark.anyio
async def test_taking_a_claims_permits_in_the_update_matches_the_rule_on_every_window_boundary(db):
    """7 window starts (none, ended, just ended, just open, open, now, later than now) x used x n,
    on the queue's row and on the application's."""
    if db.dialect != "mysql":
        pytest.skip("SQLite checks a grant on the usage rows it read under its single writer lock")
    roomy = Layer(False, 100, 100, 0, None, 0, 0)
    starts = [None, -2 * SECOND, -SECOND, -SECOND + US, -SECOND / 2, timedelta(0), SECOND / 10]
    for start in starts:
        for used in (0, 1, 2, 3):
            for n in (1, 2):
                tight = Layer(False, 100, 3, 0, start, used, 0)
                await assert_grants_like_the_rule(db, (tight, roomy, 100, 0, n))
                await assert_grants_like_the_rule(db, (roomy, tight, 100, 0, n))


def test_taking_a_claims_permits_in_the_update_matches_the_rule(db_url):
    """A grant of n leases planned at `now` takes its permits and rate reservations in the queue's,
    the application's and the key's rows exactly when `core.limits.grant_still_fits` holds for the
    queue and the application and the key's limit holds them; else nothing is taken."""
    if not db_url.startswith("mysql"):
        pytest.skip("SQLite checks a grant on the usage rows it read under its single writer lock")

    run_examples(db_url, assert_grants_like_the_rule, grant_cases(), max_examples=300)


@pytest.mark.anyio
async def test_claims_permits_are_taken_in_sql_only_where_writes_wait_for_the_commit(db):
    async def body(tx):
        changes = UsageChanges()
        changes.add(new_id(), None, permits_in_use=1)
        return changes.grant_permits_in_sql(tx, await tx.now())

    assert await db.transaction(body) is (db.dialect == "mysql")
