"""A queue's throughput: the cumulative counters on its usage row, their samples, and
`GET /v1/queues/{id}/throughput` (both backends)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

import httpx
import pytest

import orbit
from orbit import APIError, AsyncClient, Client
from orbit.server.core import throughput as rules
from orbit.server.services import dispatch, throughput
from orbit.server.services.tasks import sweep_deadlines
from orbit.server.store.db import Database
from orbit.server.store.tx import Stmt

from .queue_helpers import DECIMAL, TIMESTAMP, assert_error, ok
from .task_helpers import parse_ts
from .test_worker_protocol import submit
from .worker_client import Worker, serve

pytestmark = pytest.mark.anyio

EPOCH = datetime(1970, 1, 1)
FAST_RETRY = {"initial_backoff_ms": 1, "max_backoff_ms": 1, "jitter": 0.0}


async def rows(db, sql: str, *params):
    return await db.read(lambda tx: tx.rows(Stmt(sql, params)))


async def write(db, sql: str, *params):
    await db.transaction(lambda tx: tx.count(Stmt(sql, params)))


async def totals_row(db, queue_id: str) -> tuple[int, int, int]:
    (r,) = await rows(db, "SELECT started_total, succeeded_total, failed_total FROM queue_usage WHERE queue_id = ?",
                      queue_id)
    return int(r["started_total"]), int(r["succeeded_total"]), int(r["failed_total"])


async def samples_of(db, queue_id: str) -> list[tuple]:
    return [(r["at"], int(r["started_total"]), int(r["succeeded_total"]), int(r["failed_total"]))
            for r in await rows(db, "SELECT * FROM queue_samples WHERE queue_id = ? ORDER BY at", queue_id)]


async def head_of(db, queue_id: str) -> tuple | None:
    found = [(r["at"], int(r["started_total"]), int(r["succeeded_total"]), int(r["failed_total"]))
             for r in await rows(db, "SELECT * FROM queue_sample_heads WHERE queue_id = ?", queue_id)]
    return found[0] if found else None


async def task_state(tenant, task_id: str) -> str:
    return ok(await tenant.get(f"/v1/tasks/{task_id}"))["state"]


async def until_state(tenant, task_id: str, state: str, step) -> None:
    """Run a shared-database background job (`step`) until the task reaches `state`."""
    for _ in range(50):
        if await task_state(tenant, task_id) == state:
            return
        await step()
    assert await task_state(tenant, task_id) == state


def summed(points: list[dict]) -> tuple[int, int, int]:
    return tuple(sum(int(p[f]) for p in points) for f in ("started", "succeeded", "failed"))


async def test_counters_move_exactly_with_starts_successes_and_failures(tenant, base):
    q = await tenant.create_queue(max_concurrency=20)
    qid = q["id"]
    (succeeds,) = await submit(tenant, qid, 1)
    (retried,) = await submit(tenant, qid, 1, max_attempts=2, retry=FAST_RETRY)
    (fatal,) = await submit(tenant, qid, 1, max_attempts=5)
    (cancelled,) = await submit(tenant, qid, 1)
    assert await totals_row(tenant.db, qid) == (0, 0, 0)

    async with Worker.connect(base, tenant.token) as w:
        await w.hello(qid)
        leases = {t["task_id"]: t for t in (await w.call("claim", queue_id=qid, max_tasks=20))["tasks"]}
        assert set(leases) == {succeeds, retried, fatal, cancelled}
        for tid in (succeeds, retried, fatal):
            assert (await w.call("start", id=f"s-{tid}", lease_id=leases[tid]["lease_id"]))["ok"]
        assert await totals_row(tenant.db, qid) == (3, 0, 0)
        # A Start replayed counts nothing more.
        assert (await w.call("start", id=f"s-{succeeds}", lease_id=leases[succeeds]["lease_id"]))["ok"]
        assert await totals_row(tenant.db, qid) == (3, 0, 0)

        r = await w.call("complete", id="done", lease_id=leases[succeeds]["lease_id"], outcome="succeeded")
        assert r["task_state"] == "SUCCEEDED"
        r = await w.call("complete", id="done", lease_id=leases[succeeds]["lease_id"], outcome="succeeded")
        assert r["task_state"] == "SUCCEEDED"  # a replay
        r = await w.call("complete", lease_id=leases[retried]["lease_id"], outcome="failed", error={"message": "x"})
        assert r["task_state"] == "WAITING"  # a retry is no failure of the task
        r = await w.call("complete", lease_id=leases[fatal]["lease_id"], outcome="failed",
                         error={"message": "bad input", "retryable": False})
        assert r["task_state"] == "FAILED"
        assert (await w.call("release", lease_id=leases[cancelled]["lease_id"]))["ok"]
        ok(await tenant.post(f"/v1/tasks/{cancelled}:cancel", {"reason": "not needed"}))
        assert await totals_row(tenant.db, qid) == (3, 1, 1)

        (second,) = (await w.call("claim", queue_id=qid, max_tasks=1, wait_ms=2000))["tasks"]
        assert second["task_id"] == retried and second["attempt"] == 2
        assert (await w.call("start", lease_id=second["lease_id"]))["ok"]
        r = await w.call("complete", lease_id=second["lease_id"], outcome="failed", error={"message": "x"})
        assert r["task_state"] == "FAILED"  # the retry ends FAILED: one failure
        assert await totals_row(tenant.db, qid) == (4, 1, 2)

        # Leases that will expire while running: three exhausted tasks, two for review.
        lost = await submit(tenant, qid, 3, on_lease_lost="retry", max_attempts=1)
        reviewed = await submit(tenant, qid, 2)
        short = (await w.call("claim", queue_id=qid, max_tasks=20, lease_ms=1000))["tasks"]
        assert sorted(t["task_id"] for t in short) == sorted([*lost, *reviewed])
        for lease in short:
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
        assert await totals_row(tenant.db, qid) == (9, 1, 2)

    (deadline,) = await submit(tenant, qid, 1, deadline_seconds=1)  # nothing claims it any more
    await asyncio.sleep(1.1)
    for tid in lost:
        await until_state(tenant, tid, "FAILED", lambda: dispatch.recover_expired_leases(tenant.db))
    for tid in reviewed:
        await until_state(tenant, tid, "NEEDS_REVIEW", lambda: dispatch.recover_expired_leases(tenant.db))
    assert await totals_row(tenant.db, qid) == (9, 1, 5)
    await until_state(tenant, deadline, "FAILED", lambda: sweep_deadlines(tenant.db))
    assert await totals_row(tenant.db, qid) == (9, 1, 6)
    ok(await tenant.post(f"/v1/tasks/{reviewed[0]}:review", {"resolution": "SUCCEEDED", "reason": "it ran"}))
    ok(await tenant.post(f"/v1/tasks/{reviewed[1]}:review", {"resolution": "FAILED", "reason": "it did not"}))
    assert await totals_row(tenant.db, qid) == (9, 2, 7)

    view = ok(await tenant.get(f"/v1/queues/{qid}/throughput"))
    assert view["totals"] == {"started": "9", "succeeded": "2", "failed": "7"}
    # A new queue without samples (no background loops here) counted everything since its creation.
    assert summed(view["points"]) == (9, 2, 7)


async def test_the_view_is_the_bucketed_difference_of_samples(tenant):
    q = await tenant.create_queue()
    qid = q["id"]
    fresh = ok(await tenant.get(f"/v1/queues/{qid}/throughput"))
    assert set(fresh) == {"queue_id", "at", "interval_seconds", "totals", "points"}
    assert fresh["queue_id"] == qid and TIMESTAMP.match(fresh["at"]) and fresh["interval_seconds"] == 5
    assert fresh["totals"] == {"started": "0", "succeeded": "0", "failed": "0"}
    assert len(fresh["points"]) == 120
    for p in fresh["points"]:
        assert set(p) == {"at", "started", "succeeded", "failed"} and TIMESTAMP.match(p["at"])
        assert DECIMAL.match(p["started"]) and (p["started"], p["succeeded"], p["failed"]) == ("0", "0", "0")
    ats = [parse_ts(p["at"]) for p in fresh["points"]]
    assert all(b - a == timedelta(seconds=5) for a, b in zip(ats, ats[1:], strict=False))
    assert ats[-1] <= parse_ts(fresh["at"]) < ats[-1] + timedelta(seconds=5)
    assert ats[-1].timestamp() % 5 == 0  # aware: seconds since the epoch

    # Samples 60, 55 and 40 s before the current bucket, and live counters past the last one.
    current = rules.bucket_start(parse_ts(fresh["at"]).replace(tzinfo=None))
    samples = {60: (1, 0, 0), 55: (4, 2, 1), 40: (10, 7, 1)}
    for back, (s, ok_, f) in samples.items():
        await write(tenant.db, "INSERT INTO queue_samples (queue_id, at, started_total, succeeded_total, "
                    "failed_total) VALUES (?, ?, ?, ?, ?)", qid, current - timedelta(seconds=back), s, ok_, f)
    await write(tenant.db, "UPDATE queue_usage SET started_total = 12, succeeded_total = 9, failed_total = 2 "
                "WHERE queue_id = ?", qid)
    view = ok(await tenant.get(f"/v1/queues/{qid}/throughput", params={"minutes": 2}))
    assert len(view["points"]) == 24 and view["totals"] == {"started": "12", "succeeded": "9", "failed": "2"}
    got = {parse_ts(p["at"]).replace(tzinfo=None): (int(p["started"]), int(p["succeeded"]), int(p["failed"]))
           for p in view["points"]}
    now_bucket = rules.bucket_start(parse_ts(view["at"]).replace(tzinfo=None))
    expected = {t: (0, 0, 0) for t in got}
    expected[current - timedelta(seconds=65)] = (1, 0, 0)  # a new queue counts from zero
    expected[current - timedelta(seconds=60)] = (3, 2, 1)  # consecutive samples
    expected[current - timedelta(seconds=45)] = (6, 5, 0)  # a gap: the bucket before the next sample
    expected[now_bucket] = (2, 2, 1)  # the live counters end the current bucket
    assert got == expected
    assert summed(view["points"]) == (12, 9, 2)

    # One minute: the sample 60 s back is the baseline; nothing before it is counted.
    view = ok(await tenant.get(f"/v1/queues/{qid}/throughput", params={"minutes": 1}))
    assert len(view["points"]) == 12
    assert summed(view["points"]) == (12 - 4, 9 - 2, 2 - 1) or now_bucket != rules.bucket_start(
        parse_ts(view["at"]).replace(tzinfo=None))  # the clock moved on a bucket: another baseline


async def test_an_old_queue_without_a_baseline_counts_nothing_before_its_first_sample(tenant, db):
    q = await tenant.create_queue()
    qid = q["id"]
    await write(db, "UPDATE queues SET created_at = ? WHERE id = ?",
                parse_ts(q["created_at"]).replace(tzinfo=None) - timedelta(hours=2), qid)
    await write(db, "UPDATE queue_usage SET started_total = 500, succeeded_total = 400, failed_total = 50 "
                "WHERE queue_id = ?", qid)
    view = ok(await tenant.get(f"/v1/queues/{qid}/throughput"))
    assert view["totals"]["started"] == "500" and summed(view["points"]) == (0, 0, 0)
    current = rules.bucket_start(parse_ts(view["at"]).replace(tzinfo=None))
    await write(db, "INSERT INTO queue_samples (queue_id, at, started_total, succeeded_total, failed_total) "
                "VALUES (?, ?, 498, 400, 49)", qid, current - timedelta(seconds=30))
    view = ok(await tenant.get(f"/v1/queues/{qid}/throughput"))
    assert summed(view["points"]) == (2, 0, 1)


async def test_the_sampler_writes_a_sample_only_where_counters_moved_or_a_baseline_is_due(tenant, db):
    q, idle = await tenant.create_queue(), await tenant.create_queue()
    qid = q["id"]
    # Sampling passes labelled in the past, so that each is a bucket of its own.
    t0 = rules.bucket_start(parse_ts(ok(await tenant.get(f"/v1/queues/{qid}/throughput"))["at"])
                            .replace(tzinfo=None)) - timedelta(minutes=10)
    step = timedelta(seconds=5)
    long_ago = t0 - timedelta(hours=1)

    async def sample_at(at, stale_before=long_ago):
        return await db.transaction(lambda tx: throughput.sample_at(tx, at, stale_before))

    assert await sample_at(t0) >= 2  # a queue without a sample gets one
    assert await samples_of(db, qid) == [(t0, 0, 0, 0)]
    await sample_at(t0 + step)
    assert await samples_of(db, qid) == [(t0, 0, 0, 0)]  # nothing moved: nothing written
    await write(db, "UPDATE queue_usage SET started_total = started_total + 3, failed_total = failed_total + 1 "
                "WHERE queue_id = ?", qid)
    await sample_at(t0 + 2 * step)
    assert await samples_of(db, qid) == [(t0, 0, 0, 0), (t0 + 2 * step, 3, 0, 1)]
    assert await samples_of(db, idle["id"]) == [(t0, 0, 0, 0)]
    # The latest sample is older than the baseline age: the idle queue gets a new one too.
    await sample_at(t0 + 3 * step, stale_before=t0 + step)
    assert await samples_of(db, idle["id"]) == [(t0, 0, 0, 0), (t0 + 3 * step, 0, 0, 0)]
    assert await samples_of(db, qid) == [(t0, 0, 0, 0), (t0 + 2 * step, 3, 0, 1)]

    # The loop itself, at the database clock: nothing moved since, so nothing new.
    await throughput.sample(db)
    assert len(await samples_of(db, qid)) == 2
    await write(db, "UPDATE queue_usage SET succeeded_total = succeeded_total + 1 WHERE queue_id = ?", qid)
    await throughput.sample(db)
    latest = (await samples_of(db, qid))[-1]
    assert latest[1:] == (3, 1, 1) and latest[0] > t0 + 3 * step and (latest[0] - EPOCH).total_seconds() % 5 == 0
    await throughput.sample(db)  # the same bucket, or nothing moved: no second sample
    assert len(await samples_of(db, qid)) == 3

    assert await head_of(db, qid) == (await samples_of(db, qid))[-1]
    assert await head_of(db, idle["id"]) == (t0 + 3 * step, 0, 0, 0)

    # Pruning drops what is older than the retention, and nothing newer.
    await write(db, "INSERT INTO queue_samples (queue_id, at, started_total, succeeded_total, failed_total) "
                "VALUES (?, ?, 0, 0, 0)", qid, t0 - timedelta(hours=2))
    assert await throughput.prune(db, batch=1) >= 1
    kept = await samples_of(db, qid)
    assert len(kept) == 3 and kept[0][0] == t0


async def test_a_head_outlives_its_pruned_sample(tenant, db):
    q = await tenant.create_queue()
    qid = q["id"]
    now = rules.bucket_start(parse_ts(ok(await tenant.get(f"/v1/queues/{qid}/throughput"))["at"])
                             .replace(tzinfo=None))
    old = now - timedelta(minutes=90)
    assert await db.transaction(lambda tx: throughput.sample_at(tx, old, old - timedelta(hours=1))) >= 1
    await write(db, "UPDATE queue_usage SET started_total = 2 WHERE queue_id = ?", qid)
    assert await db.transaction(lambda tx: throughput.sample_at(tx, old + timedelta(seconds=5),
                                                                old - timedelta(hours=1))) >= 1
    assert await head_of(db, qid) == (old + timedelta(seconds=5), 2, 0, 0)
    await throughput.prune(db)
    assert await samples_of(db, qid) == []
    assert await head_of(db, qid) == (old + timedelta(seconds=5), 2, 0, 0)  # pruning leaves the heads alone
    # The counters did not move since: no sample, until a baseline is due (the head is older than 30 minutes).
    await db.transaction(lambda tx: throughput.sample_at(tx, now - timedelta(minutes=5), old))
    assert await samples_of(db, qid) == []
    await throughput.sample(db)
    (baseline,) = await samples_of(db, qid)
    assert baseline[1:] == (2, 0, 0) and await head_of(db, qid) == baseline


async def test_the_view_is_scoped_and_checked_like_the_usage_view(tenant, http, db):
    q = await tenant.create_queue()
    path = f"/v1/queues/{q['id']}/throughput"
    other = await tenant.credential(["queues:read"], queue_scope=[(await tenant.create_queue())["id"]])
    assert_error(await tenant.get(path, token=other), 404, "NOT_FOUND")
    scoped = await tenant.credential(["queues:read"], queue_scope=[q["id"]])
    assert ok(await tenant.get(path, token=scoped))["queue_id"] == q["id"]
    nobody = await tenant.credential(["tasks:read"])
    assert_error(await tenant.get(path, token=nobody), 403, "PERMISSION_DENIED")
    assert_error(await tenant.get("/v1/queues/" + "f" * 32 + "/throughput"), 404, "NOT_FOUND")
    assert_error(await tenant.get("/v1/queues/nope/throughput"), 404, "NOT_FOUND")
    assert_error(await http.get(path), 401, "UNAUTHENTICATED")
    assert_error(await http.get(path, params={"minutes": "0"}), 401, "UNAUTHENTICATED")  # the token first
    for bad in ("0", "61", "-1", "abc", "1.5", ""):
        assert_error(await tenant.get(path, params={"minutes": bad}), 400, "INVALID_ARGUMENT", "minutes")
    assert len(ok(await tenant.get(path, params={"minutes": "60"}))["points"]) == 720
    assert len(ok(await tenant.get(path, params={"minutes": "1"}))["points"]) == 12


async def test_the_sdk_reads_the_view(tenant, app):
    q = await tenant.create_queue()
    async with AsyncClient("http://orbit.test", token=tenant.token,
                           transport=httpx.ASGITransport(app=app)) as client:
        view = await client.get_queue_throughput(q["id"], minutes=2)
        assert isinstance(view, orbit.QueueThroughput) and view.queue_id == q["id"]
        assert view.interval_seconds == 5 and view.at.tzinfo is not None and len(view.points) == 24
        assert isinstance(view.totals, orbit.ThroughputCounts) and type(view.totals.started) is int
        assert isinstance(view.points[0], orbit.ThroughputPoint) and view.points[0].at.tzinfo is not None
        assert len((await client.get_queue_throughput(q["id"])).points) == 120
        with pytest.raises(APIError) as exc:
            await client.get_queue_throughput("f" * 32)
        assert (exc.value.status_code, exc.value.code) == (404, "NOT_FOUND")
        for bad in (0, 61, True, "5"):
            with pytest.raises(ValueError):
                await client.get_queue_throughput(q["id"], minutes=bad)

    async with serve(app) as url:
        def sync_read() -> orbit.QueueThroughput:
            with Client(url, token=tenant.token) as c:
                return c.get_queue_throughput(q["id"], minutes=1)

        view = await asyncio.to_thread(sync_read)
        assert len(view.points) == 12 and view.totals.started == 0


# ---------------------------------------------------------------- nodes sampling at the same time
# On MariaDB (READ COMMITTED) a pass reads the usage rows and heads from a snapshot taken when its
# statement starts, and takes the heads' row locks only to move them. These tests hold one pass
# (another node's) open at chosen points and start a second pass meanwhile, so that its snapshot
# predates the first one's commit.


@pytest.fixture
def mariadb(db):
    if db.dialect != "mysql":
        pytest.skip("concurrent writers: SQLite has a single one")


def hold(db, *steps):
    """Run `steps` (each `fn(tx)`) in one transaction, pausing after each but the last until the
    returned `go` event is set; `paused` is set at every pause. Returns (task, paused, go); the
    task's result is the steps' results."""
    paused, go = asyncio.Event(), asyncio.Event()

    async def body(tx):
        out = []
        for i, step in enumerate(steps):
            out.append(await step(tx))
            if i < len(steps) - 1:
                paused.set()
                await go.wait()
                go.clear()
        return out

    return asyncio.create_task(db.transaction(body)), paused, go


async def waiting_pass(db, at: datetime, stale_before: datetime) -> tuple[asyncio.Task, bool]:
    """Start a sampling pass; return it once it waits for a row lock held by another transaction,
    with True (False: it never did)."""
    connection: list[int] = []

    async def body(tx):
        connection.append(int((await tx.rows(Stmt("SELECT CONNECTION_ID() AS id")))[0]["id"]))
        return await throughput.sample_at(tx, at, stale_before)

    task = asyncio.create_task(db.transaction(body))
    for _ in range(20):
        # innodb_trx is a cache that MariaDB refreshes only when it was not read for 0.1 s.
        await asyncio.sleep(0.15)
        if task.done():
            break
        if connection and await rows(db, "SELECT 1 FROM information_schema.innodb_trx WHERE "
                                          "trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'", connection[-1]):
            return task, True
    return task, False


def no_driver_warnings(caplog) -> bool:
    return not [r for r in caplog.records if r.name.startswith("asyncmy") and r.levelno >= logging.WARNING]


async def past_bucket(tenant, queue_id: str) -> datetime:
    """A bucket ten minutes ago: passes labelled from there on are buckets of their own."""
    now = parse_ts(ok(await tenant.get(f"/v1/queues/{queue_id}/throughput"))["at"]).replace(tzinfo=None)
    return rules.bucket_start(now) - timedelta(minutes=10)


async def test_two_nodes_sampling_at_once_leave_one_sample_per_bucket_and_the_head_on_it(tenant, db, mariadb,
                                                                                           caplog):
    caplog.set_level(logging.WARNING, logger="asyncmy")
    qid = (await tenant.create_queue())["id"]
    t = await past_bucket(tenant, qid)
    step, stale = timedelta(seconds=5), t - timedelta(hours=1)
    assert await db.transaction(lambda tx: throughput.sample_at(tx, t, stale)) >= 1
    await write(db, "UPDATE queue_usage SET started_total = 3, failed_total = 1 WHERE queue_id = ?", qid)

    # The same bucket: the first node moved the head and wrote its sample, not yet committed.
    first, paused, go = hold(db, lambda tx: throughput.sample_at(tx, t + step, stale), lambda tx: tx.now())
    await paused.wait()
    # It holds no lock on the usage rows: a dispatch's update goes through at once.
    await asyncio.wait_for(write(db, "UPDATE queue_usage SET started_total = 5 WHERE queue_id = ?", qid), 2)
    # The second node read the newer counters and the old head; it waits for the head's row lock.
    second, waited = await waiting_pass(db, t + step, stale)
    go.set()
    assert waited
    assert (await first)[0] >= 1 and await second == 0
    # The bucket's sample and the head are the first node's: the next pass writes what moved since.
    assert await samples_of(db, qid) == [(t, 0, 0, 0), (t + step, 3, 0, 1)]
    assert await head_of(db, qid) == (t + step, 3, 0, 1)
    await db.transaction(lambda tx: throughput.sample_at(tx, t + 2 * step, stale))
    assert (await samples_of(db, qid))[-1] == (t + 2 * step, 5, 0, 1) == await head_of(db, qid)

    # A later bucket committed first: the pass of an earlier bucket never moves the head back
    # (nor writes a sample behind the latest one).
    await write(db, "UPDATE queue_usage SET succeeded_total = 2 WHERE queue_id = ?", qid)
    first, paused, go = hold(db, lambda tx: throughput.sample_at(tx, t + 4 * step, stale), lambda tx: tx.now())
    await paused.wait()
    second, waited = await waiting_pass(db, t + 3 * step, stale)
    go.set()
    assert waited
    assert (await first)[0] >= 1 and await second == 0
    assert [s[0] for s in await samples_of(db, qid)] == [t, t + step, t + 2 * step, t + 4 * step]
    assert await head_of(db, qid) == (t + 4 * step, 5, 2, 1)

    # An earlier bucket committed first: the later one follows it.
    await write(db, "UPDATE queue_usage SET started_total = 6 WHERE queue_id = ?", qid)
    first, paused, go = hold(db, lambda tx: throughput.sample_at(tx, t + 5 * step, stale), lambda tx: tx.now())
    await paused.wait()
    await write(db, "UPDATE queue_usage SET started_total = 7 WHERE queue_id = ?", qid)
    second, waited = await waiting_pass(db, t + 6 * step, stale)
    go.set()
    assert waited
    assert (await first)[0] >= 1 and await second >= 1
    assert (await samples_of(db, qid))[-2:] == [(t + 5 * step, 6, 2, 1), (t + 6 * step, 7, 2, 1)]
    assert await head_of(db, qid) == (t + 6 * step, 7, 2, 1)

    # Nothing moved since: nothing written, however many nodes.
    counted = len(await samples_of(db, qid))
    await asyncio.gather(*(db.transaction(lambda tx: throughput.sample_at(tx, t + 7 * step, stale))
                           for _ in range(2)))
    assert len(await samples_of(db, qid)) == counted

    # A node sampling a bucket after another one committed it writes what moved since, and leaves
    # the other node's samples of the bucket as they are.
    other = (await tenant.create_queue())["id"]
    assert await db.transaction(lambda tx: throughput.sample_at(tx, t + 8 * step, stale)) >= 1
    await write(db, "UPDATE queue_usage SET failed_total = 2 WHERE queue_id = ?", qid)
    assert await db.transaction(lambda tx: throughput.sample_at(tx, t + 8 * step, stale)) == 1
    assert await samples_of(db, other) == [(t + 8 * step, 0, 0, 0)]
    assert (await samples_of(db, qid))[-1] == (t + 8 * step, 7, 2, 2) == await head_of(db, qid)
    assert no_driver_warnings(caplog)


async def test_a_pass_that_read_older_counters_never_moves_a_newer_head_back(tenant, db, mariadb, caplog):
    """Its bucket is later, but another node read the counters after it did and moved the head
    first: writing the older counters as the later sample would count the difference twice."""
    caplog.set_level(logging.WARNING, logger="asyncmy")
    qid = (await tenant.create_queue())["id"]
    t = await past_bucket(tenant, qid)
    step, stale = timedelta(seconds=5), t - timedelta(hours=1)
    await db.transaction(lambda tx: throughput.sample_at(tx, t, stale))
    await write(db, "UPDATE queue_usage SET started_total = 1 WHERE queue_id = ?", qid)

    # The other node holds the head's row (it is about to move it).
    other, paused, go = hold(db, lambda tx: tx.rows(Stmt("SELECT queue_id FROM queue_sample_heads WHERE queue_id = ? "
                                                         "{FOR_UPDATE}", (qid,))),
                             lambda tx: throughput.sample_at(tx, t + step, stale))
    await paused.wait()
    late, waited = await waiting_pass(db, t + 2 * step, stale)  # read started_total = 1
    await asyncio.wait_for(write(db, "UPDATE queue_usage SET started_total = 4 WHERE queue_id = ?", qid), 2)
    go.set()  # the other node reads 4, labels it t + step, commits
    assert waited
    assert (await other)[1] >= 1
    await late
    assert await samples_of(db, qid) == [(t, 0, 0, 0), (t + step, 4, 0, 0)]
    assert await head_of(db, qid) == (t + step, 4, 0, 0)
    await db.transaction(lambda tx: throughput.sample_at(tx, t + 3 * step, stale))  # nothing moved since
    assert await samples_of(db, qid) == [(t, 0, 0, 0), (t + step, 4, 0, 0)]
    assert no_driver_warnings(caplog)


async def test_two_nodes_sampling_at_once(tenant, db, db_url, caplog):
    """Two `Database`s (nodes) run passes of the same buckets together, counters moving in
    between: every moved queue gets exactly one sample a bucket, and its head is that sample."""
    caplog.set_level(logging.WARNING, logger="asyncmy")
    queues = [(await tenant.create_queue())["id"] for _ in range(20)]
    t = await past_bucket(tenant, queues[0])
    stale = t - timedelta(hours=1)
    other = Database(db_url, pool_size=2)
    try:
        for i in range(4):
            moved = queues[i % 3::3] if i else queues
            await write(db, f"UPDATE queue_usage SET started_total = started_total + 1 WHERE queue_id IN "
                            f"({', '.join('?' * len(moved))})", *moved)
            at = t + i * rules.INTERVAL
            written = await asyncio.gather(*(d.transaction(lambda tx: throughput.sample_at(tx, at, stale))
                                             for d in (db, other)))
            assert sum(written) >= len(moved)
            for qid in queues:
                history = await samples_of(db, qid)
                assert (history[-1][0] == at) == (qid in moved)
                assert len(history) == 1 + sum(qid in queues[j % 3::3] for j in range(1, i + 1))
                assert history[-1][1:] == await totals_row(db, qid) and await head_of(db, qid) == history[-1]
    finally:
        await other.close()
    assert no_driver_warnings(caplog)
