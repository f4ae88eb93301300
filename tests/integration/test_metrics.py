"""GET /metrics: the Prometheus text format, per-queue
gauges that agree with the queue usage view, counters and histograms that move with the work,
bounded label sets, the per-node cache of the gauges' database read, and the separate listener."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orbit.server.app import create_app
from orbit.server.config import Settings, parse_address
from orbit.server.services import dispatch
from orbit.server.store.dialect import MYSQL
from orbit.server.store.queries import usage as usage_q
from orbit.server.store.tx import Stmt

from .queue_helpers import ok
from .test_worker_protocol import submit
from .worker_client import Worker, free_port, serve

pytestmark = pytest.mark.anyio

QUEUE_GAUGES = ("unfinished_tasks", "waiting_tasks", "delayed_tasks", "leased_tasks", "running_tasks",
                "needs_review_tasks", "permits_in_use", "rate_window_used")
COUNTERS = ("orbit_tasks_submitted_total", "orbit_tasks_started_total", "orbit_tasks_succeeded_total",
            "orbit_tasks_failed_total", "orbit_tasks_cancelled_total", "orbit_starts_rate_limited_total",
            "orbit_leases_lost_total")


@pytest.fixture
async def app(db, db_url):
    """The scraped node reads the per-queue gauges afresh on every scrape (no cache)."""
    return create_app(Settings(database_url=db_url, node_id="test", background_loops=False,
                               metrics_ttl_seconds=0), db)


class Scrape:
    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[tuple[str, frozenset], float] = {}
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        for family in self.families.values():
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def queue(self, queue_id: str, namespace_id: str) -> dict[str, int | None]:
        out = {}
        for g in QUEUE_GAUGES:
            v = self.value(f"orbit_queue_{g}", queue_id=queue_id, namespace_id=namespace_id)
            out[g] = None if v is None else int(v)
        return out

    def counters(self) -> dict[str, float]:
        return {c: self.value(c) or 0.0 for c in COUNTERS} | {
            f"queue_full_{limit}": self.value("orbit_submits_queue_full_total", limit=limit) or 0.0
            for limit in ("queue", "application")}

    def histogram_count(self, name: str, **labels: str) -> float:
        return self.value(f"{name}_count", **labels) or 0.0


async def scrape(http) -> Scrape:
    r = await http.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return Scrape(r.text)


def from_usage(u: dict[str, Any]) -> dict[str, int]:
    return {"unfinished_tasks": int(u["unfinished_tasks"]), "waiting_tasks": int(u["waiting"]),
            "delayed_tasks": int(u["delayed"]), "leased_tasks": int(u["leased"]), "running_tasks": int(u["running"]),
            "needs_review_tasks": int(u["needs_review"]), "permits_in_use": int(u["in_flight"]),
            "rate_window_used": int(u["rate_window"]["used"]) if u["rate_window"] else 0}


async def test_per_queue_gauges_agree_with_the_usage_view(tenant, http, base):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=50)
    idle = await tenant.create_queue()
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    await submit(tenant, q["id"], 4)
    await submit(tenant, q["id"], 2, available_at=later)
    ns = tenant.namespace_id

    async def agree() -> dict[str, int | None]:
        before = from_usage(ok(await tenant.get(f"/v1/queues/{q['id']}/usage")))
        gauges = (await scrape(http)).queue(q["id"], ns)
        after = from_usage(ok(await tenant.get(f"/v1/queues/{q['id']}/usage")))
        assert gauges in (before, after), (gauges, before, after)  # a rate window may close in between
        return gauges

    assert await agree() == {"unfinished_tasks": 6, "waiting_tasks": 4, "delayed_tasks": 2, "leased_tasks": 0,
                             "running_tasks": 0, "needs_review_tasks": 0, "permits_in_use": 0, "rate_window_used": 0}
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"], node_id="worker-a")
        leases = (await w.call("claim", queue_id=q["id"], max_tasks=3))["tasks"]
        assert (await w.call("start", lease_id=leases[0]["lease_id"]))["ok"]
        gauges = await agree()
        assert {k: gauges[k] for k in ("waiting_tasks", "leased_tasks", "running_tasks", "permits_in_use")} == {
            "waiting_tasks": 1, "leased_tasks": 2, "running_tasks": 1, "permits_in_use": 3}
        assert (await w.call("complete", lease_id=leases[0]["lease_id"], outcome="succeeded"))["ok"]
        assert (await agree())["unfinished_tasks"] == 5
    assert (await scrape(http)).queue(idle["id"], ns) == dict.fromkeys(QUEUE_GAUGES, 0)


async def test_limits_pause_and_how_long_due_work_has_waited(tenant, http):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=50, max_unfinished_tasks=70)
    ns = tenant.namespace_id

    def limits(s: Scrape) -> dict[str, float | None]:
        return {g: s.value(f"orbit_queue_{g}", queue_id=q["id"], namespace_id=ns)
                for g in ("max_concurrency", "rate_per_second", "max_unfinished_tasks", "paused",
                          "oldest_waiting_seconds")}

    assert limits(await scrape(http)) == {"max_concurrency": 5, "rate_per_second": 50, "max_unfinished_tasks": 70,
                                          "paused": 0, "oldest_waiting_seconds": 0}
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    await submit(tenant, q["id"], 1, available_at=later)  # not due: it has not waited yet
    assert limits(await scrape(http))["oldest_waiting_seconds"] == 0
    await submit(tenant, q["id"], 2)
    await asyncio.sleep(1.1)
    assert 1.0 <= limits(await scrape(http))["oldest_waiting_seconds"] < 60
    ok(await tenant.post(f"/v1/queues/{q['id']}:configure", {
        "expected_revision": "1", "reason": "hold", "paused": True, "max_concurrency": 6, "rate_per_second": 60,
        "max_unfinished_tasks": 80}))
    now = limits(await scrape(http))
    assert (now["paused"], now["max_concurrency"], now["rate_per_second"], now["max_unfinished_tasks"]) == \
        (1, 6, 60, 80)
    assert (await scrape(http)).value("orbit_database_available") == 1


async def test_queue_labels_name_live_queues_only(tenant, http):
    kept = await tenant.create_queue()
    gone = await tenant.create_queue()
    ok(await tenant.post(f"/v1/queues/{gone['id']}:retire", {"expected_revision": "1", "reason": "unused"}))
    s = await scrape(http)
    assert s.value("orbit_queue_unfinished_tasks", queue_id=kept["id"], namespace_id=tenant.namespace_id) == 0
    assert not [k for k in s.samples if ("queue_id", gone["id"]) in k[1]]
    for name in QUEUE_GAUGES:
        family = s.families[f"orbit_queue_{name}"]
        assert family.type == "gauge"
        assert all(set(sample.labels) == {"queue_id", "namespace_id"} for sample in family.samples)


async def test_counters_and_histograms_move_with_the_work(tenant, http, base):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    full = await tenant.create_queue(max_unfinished_tasks=1)
    first = await scrape(http)
    c0 = first.counters()
    waits0 = first.histogram_count("orbit_submit_to_start_seconds")
    runs0 = {o: first.histogram_count("orbit_attempt_duration_seconds", outcome=o)
             for o in ("succeeded", "failed", "cancelled")}

    ids = await submit(tenant, q["id"], 3, max_attempts=1)
    r = await tenant.post(f"/v1/queues/{q['id']}/tasks:batch",
                          {"tasks": [{"idempotency_key": tenant.key(), "payload": {"i": i}} for i in range(2)]})
    assert [item["deduplicated"] for item in ok(r)["results"]] == [False, False]
    await submit(tenant, full["id"], 1)
    refused = await tenant.post(f"/v1/queues/{full['id']}/tasks", {"payload": {}})
    assert refused.json()["error"]["code"] == "QUEUE_FULL"
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        leases = {t["task_id"]: t["lease_id"] for t in (await w.call("claim", queue_id=q["id"], max_tasks=2))["tasks"]}
        assert set(leases) == set(ids[:2])
        for lease_id in leases.values():
            assert (await w.call("start", lease_id=lease_id))["ok"]
        assert (await w.call("complete", lease_id=leases[ids[0]], outcome="succeeded", result={"r": 1}))["ok"]
        assert (await w.call("complete", lease_id=leases[ids[1]], outcome="failed",
                             error={"message": "boom", "retryable": False}))["ok"]
    ok(await tenant.post(f"/v1/tasks/{ids[2]}:cancel", {"reason": "not needed"}))

    s = await scrape(http)
    delta = {k: v - c0[k] for k, v in s.counters().items()}
    assert delta == {"orbit_tasks_submitted_total": 6, "orbit_tasks_started_total": 2,
                     "orbit_tasks_succeeded_total": 1, "orbit_tasks_failed_total": 1,
                     "orbit_tasks_cancelled_total": 1, "orbit_starts_rate_limited_total": 0,
                     "orbit_leases_lost_total": 0, "queue_full_queue": 1, "queue_full_application": 0}
    assert s.histogram_count("orbit_submit_to_start_seconds") - waits0 == 2
    assert s.histogram_count("orbit_attempt_duration_seconds", outcome="succeeded") - runs0["succeeded"] == 1
    assert s.histogram_count("orbit_attempt_duration_seconds", outcome="failed") - runs0["failed"] == 1
    buckets = [k for k in s.samples if k[0] == "orbit_submit_to_start_seconds_bucket"]
    assert {dict(k[1])["le"] for k in buckets} >= {"0.005", "1.0", "3600.0", "+Inf"}
    assert s.families["orbit_submit_to_start_seconds"].type == "histogram"
    # Requests are labelled by route template, method and status class, never by raw path.
    routes = {dict(k[1])["route"] for k in s.samples if k[0] == "orbit_http_request_duration_seconds_count"}
    assert "/v1/queues/{queue_id}/tasks" in routes and "/v1/tasks/{task_id}:cancel" in routes
    assert not [r for r in routes if q["id"] in r or ids[2] in r]
    assert s.value("orbit_http_request_duration_seconds_count", route="/v1/queues/{queue_id}/tasks",
                   method="POST", status="4xx") >= 1


async def test_rate_limited_starts_and_lost_leases_are_counted(tenant, http, base):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=5)
    await submit(tenant, q["id"], 2)
    c0 = (await scrape(http)).counters()
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        c = (await w.call("claim", queue_id=q["id"], max_tasks=2, lease_ms=1000))["tasks"]
        assert len(c) == 2
        ok(await tenant.post(f"/v1/queues/{q['id']}:configure", {
            "expected_revision": "1", "reason": "slow down", "paused": False, "max_concurrency": 5,
            "rate_per_second": 1, "max_unfinished_tasks": 100}))
        assert (await w.call("start", lease_id=c[0]["lease_id"]))["ok"]
        limited = await w.call("start", lease_id=c[1]["lease_id"])
        assert limited["error"]["code"] == "RATE_LIMITED"
        await asyncio.sleep(1.1)
        assert await dispatch.recover_expired_leases(tenant.db) >= 2
    delta = {k: v - c0[k] for k, v in (await scrape(http)).counters().items()}
    assert delta["orbit_starts_rate_limited_total"] == 1 and delta["orbit_tasks_started_total"] == 1
    assert delta["orbit_leases_lost_total"] >= 1  # other tests' expired leases in this database may count too


async def test_node_gauges(tenant, app, http, db_url):
    q = await tenant.create_queue()
    before = await scrape(http)
    assert before.value("orbit_worker_sessions") == 0
    pools = {dict(k[1])["pool"] for k in before.samples if k[0] == "orbit_db_pool_connections_max"}
    if db_url.startswith("sqlite"):
        assert pools == {"sqlite_writer", "sqlite_read"}
    else:  # the driver pools open on first use
        assert "engine" in pools and pools <= {"transactional", "autocommit", "engine"}
    for key, most in ((k, v) for k, v in before.samples.items() if k[0] == "orbit_db_pool_connections_max"):
        assert 0 <= before.samples[("orbit_db_pool_connections_in_use", key[1])] <= most
    assert before.value("process_cpu_seconds_total") is not None
    # Worker sessions are this node's: connect one to the scraped app itself.
    async with serve(app) as url, Worker.connect(url, tenant.token) as w:
        await w.hello(q["id"])
        assert (await scrape(http)).value("orbit_worker_sessions") == 1


async def test_the_gauges_read_runs_once_per_ttl(db, db_url, tenant, monkeypatch):
    reads = []
    real = usage_q.live_state_counts

    def counted():
        reads.append(1)
        return real()

    monkeypatch.setattr(usage_q, "live_state_counts", counted)

    def node(ttl: float) -> httpx.AsyncClient:
        app = create_app(Settings(database_url=db_url, node_id="cached", background_loops=False,
                                  metrics_ttl_seconds=ttl), db)
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://orbit.test")

    q = await tenant.create_queue()
    unfinished = lambda s: s.queue(q["id"], tenant.namespace_id)["unfinished_tasks"]  # noqa: E731
    async with node(60) as http:
        first, second = await scrape(http), await scrape(http)
        assert len(reads) == 1 and unfinished(first) == unfinished(second) == 0
        await submit(tenant, q["id"], 1)
        assert unfinished(await scrape(http)) == 0  # still the cached read
        assert len(reads) == 1
    # Scrapes that arrive together at a node with nothing cached share one read.
    async with node(60) as http:
        together = await asyncio.gather(*(scrape(http) for _ in range(5)))
        assert len(reads) == 2 and {unfinished(s) for s in together} == {1}
        age = together[0].value("orbit_queue_gauges_age_seconds")
        assert age is not None and 0 <= age < 60
    # Once the TTL has passed, the next scrape reads again.
    async with node(0.2) as http:
        await scrape(http)
        await asyncio.sleep(0.25)
        await scrape(http)
        assert len(reads) == 4


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_separate_listener_takes_metrics_off_the_public_one(db, db_url):
    port = free_port()
    app = create_app(Settings(database_url=db_url, node_id="m", background_loops=False,
                              metrics_listen=f"127.0.0.1:{port}"), db)
    async with serve(app) as public, httpx.AsyncClient() as client:
        assert (await client.get(f"{public}/metrics")).status_code == 404
        assert (await client.get(f"{public}/healthz")).status_code == 200
        r = await client.get(f"http://127.0.0.1:{port}/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert Scrape(r.text).value("orbit_worker_sessions") == 0
        assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 404
        assert (await client.post(f"http://127.0.0.1:{port}/metrics")).status_code == 405
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{port}/metrics")
    both = create_app(Settings(database_url=db_url, background_loops=False, metrics_listen=f"127.0.0.1:{port}",
                               metrics_public=True), db)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=both), base_url="http://orbit.test") as http:
        assert (await http.get("/metrics")).status_code == 200


def test_metrics_addresses():
    assert parse_address("127.0.0.1:9100") == ("127.0.0.1", 9100)
    assert parse_address(":9100") == ("0.0.0.0", 9100)
    assert parse_address("[::1]:9100") == ("::1", 9100)
    for bad in ("9100", "host:", "host:port", "host:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)


async def _index_ranges_on_tasks(db, stmt) -> set[tuple[str, tuple[str, ...]]]:
    """Per read of `tasks` in the plan of `stmt`: the index and the key columns its range is bound on."""
    if db.dialect == MYSQL:
        rows = await db.read(lambda tx: tx.rows(Stmt("EXPLAIN FORMAT=JSON " + stmt.sql, stmt.params)))
        found: set[tuple[str, tuple[str, ...]]] = set()

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                if node.get("table_name") == "t":
                    found.add((node["key"], tuple(node["used_key_parts"])))
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(orjson.loads(next(iter(rows[0].values()))))
        return found
    sql = stmt.sqlite or stmt.sql
    rows = await db.read(lambda tx: tx.rows(Stmt("EXPLAIN QUERY PLAN " + sql, stmt.params,
                                                  "EXPLAIN QUERY PLAN " + sql)))
    found = set()
    for r in rows:
        m = re.match(r"SEARCH t USING (?:COVERING )?INDEX (\w+) \((.*)\)", r["detail"])
        assert m or not r["detail"].startswith(("SCAN t", "SEARCH t")), r["detail"]
        if m:
            found.add((m.group(1), tuple(part.split("=")[0] for part in m.group(2).split(" AND "))))
    return found


async def test_the_gauges_read_never_reads_finished_tasks(db, tenant, http):
    """However long a queue's history, the gauges read looks into the waiting range of the dispatch
    index and the held states' ranges of the state index only, never at a finished task."""
    q = await tenant.create_queue()
    await submit(tenant, q["id"], 1)  # the queue has unfinished work, so it is looked into
    assert await _index_ranges_on_tasks(db, usage_q.live_state_counts()) == {
        ("ix_tasks_dispatch", ("queue_id", "waiting")), ("ix_tasks_queue_group", ("queue_id", "state_group"))}
