"""The SDK's HTTP clients against the real app, on SQLite and MariaDB.

`AsyncClient` runs over `httpx.ASGITransport` (the SDK's transport seam); the
blocking `Client` talks to a real uvicorn server on a loopback port and runs in
a worker thread so that the server keeps serving in the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import datetime, timedelta, timezone

import httpx
import orjson
import pytest

import orbit
from orbit import (
    APIError,
    AsyncClient,
    Client,
    ConfigureQueueRequest,
    CreateQueueRequest,
    SubmitTaskItem,
    SubmitTaskRequest,
    TaskState,
    TransportError,
)
from orbit.sdk import retry as retry_module
from orbit.server.core.ids import new_id
from orbit.server.services import dispatch

from .worker_client import Worker, free_port, serve

pytestmark = pytest.mark.anyio

HEX32 = re.compile(r"^[0-9a-f]{32}\Z")
MISSING = "f" * 32


def new_key() -> str:
    return f"sdk-{uuid.uuid4().hex}"


def queue_request(**fields) -> CreateQueueRequest:
    fields.setdefault("name", f"sdk-{uuid.uuid4().hex[:12]}")
    fields.setdefault("max_concurrency", 4)
    fields.setdefault("rate_per_second", 50)
    return CreateQueueRequest(**fields)


class Recording(httpx.AsyncBaseTransport):
    """Delegates to the app and records what the SDK sent; can drop answers to simulate a lost reply."""

    def __init__(self, app) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.sent: list[httpx.Request] = []
        self.lose_answers = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        response = await self.inner.handle_async_request(request)
        if self.lose_answers:
            self.lose_answers -= 1
            await response.aread()
            raise httpx.ReadTimeout("simulated lost answer", request=request)
        return response

    def bodies(self, path_suffix: str) -> list[dict]:
        return [json.loads(r.content) for r in self.sent if r.url.path.endswith(path_suffix) and r.content]


@pytest.fixture
def recording(app) -> Recording:
    return Recording(app)


@pytest.fixture
async def client(tenant, recording):
    async with AsyncClient("http://orbit.test", token=tenant.token, transport=recording) as c:
        yield c


def assert_api_error(exc: APIError, status: int, code: str) -> None:
    assert isinstance(exc, APIError) and isinstance(exc, orbit.OrbitError)
    assert (exc.status_code, exc.code) == (status, code), (exc.status_code, exc.code, exc.message)
    assert exc.message and HEX32.match(exc.request_id or ""), (exc.message, exc.request_id)


# ---------------------------------------------------------------- queues (AsyncClient)


async def test_queue_lifecycle(client, recording):
    req = queue_request()
    key = new_key()
    created = await client.create_queue(key, req)
    q = created.queue
    assert created.deduplicated is False
    assert (q.name, q.max_concurrency, q.rate_per_second, q.max_unfinished_tasks) == (req.name, 4, 50, 100000)
    assert q.revision == 1 and q.unfinished_tasks == 0 and isinstance(q.revision, int)
    assert q.created_at.tzinfo is not None and q.retired_at is None and not q.paused
    # Omitted optional fields are not sent: the digest only covers what the caller set.
    assert recording.bodies("/v1/queues")[-1] == {"name": req.name, "max_concurrency": 4, "rate_per_second": 50}

    replay = await client.create_queue(key, req)
    assert replay.deduplicated is True and replay.queue == q
    with pytest.raises(APIError) as exc:  # explicitly sending the default is different content
        await client.create_queue(key, queue_request(name=req.name, max_unfinished_tasks=0))
    assert_api_error(exc.value, 409, "IDEMPOTENCY_CONFLICT")
    with pytest.raises(APIError) as exc:
        await client.create_queue(new_key(), queue_request(name=req.name))
    assert_api_error(exc.value, 409, "STATE_CONFLICT")

    assert await client.get_queue(q.id) == q

    # configure: a mapping with an int revision and the model with a str revision are the same command.
    ckey = new_key()
    fields = {"expected_revision": q.revision, "reason": "slow down", "paused": True,
              "max_concurrency": 2, "rate_per_second": 1, "max_unfinished_tasks": 10}
    configured = await client.configure_queue(q.id, ckey, fields)
    assert configured.deduplicated is False
    assert (configured.queue.revision, configured.queue.paused, configured.queue.max_unfinished_tasks) == (2, True, 10)
    assert recording.bodies(":configure")[-1]["expected_revision"] == "1"
    again = await client.configure_queue(q.id, ckey, ConfigureQueueRequest(**{**fields, "expected_revision": "1"}))
    assert again.deduplicated is True and again.queue == configured.queue
    with pytest.raises(APIError) as exc:
        await client.configure_queue(q.id, new_key(), fields)
    assert_api_error(exc.value, 409, "STATE_CONFLICT")

    retired = await client.retire_queue(q.id, new_key(), 2, "moved elsewhere")
    assert retired.queue.revision == 3 and retired.queue.retired_at is not None
    assert retired.queue.retired_at.tzinfo is not None
    assert recording.bodies(":retire")[-1] == {"expected_revision": "2", "reason": "moved elsewhere"}
    with pytest.raises(APIError) as exc:
        await client.configure_queue(q.id, new_key(), {**fields, "expected_revision": "3"})
    assert_api_error(exc.value, 409, "STATE_CONFLICT")
    assert (await client.get_queue(q.id)).retired_at == retired.queue.retired_at

    with pytest.raises(APIError) as exc:
        await client.get_queue(MISSING)
    assert_api_error(exc.value, 404, "NOT_FOUND")


async def test_list_queues_pagination(client, recording):
    names = [f"page-{uuid.uuid4().hex[:8]}-{i}" for i in range(5)]
    ids = [(await client.create_queue(new_key(), queue_request(name=n))).queue.id for n in names]

    before = len(recording.sent)
    assert [q.id async for q in client.list_queues(page_size=2)] == ids
    assert len(recording.sent) - before == 3  # 2 + 2 + 1, fetched lazily page by page
    assert all(r.url.params["limit"] == "2" for r in recording.sent[before:])

    page = await client.list_queues_page(page_size=2)
    assert [q.id for q in page.items] == ids[:2] and page.next_cursor
    rest = await client.list_queues_page(page_size=10, cursor=page.next_cursor)
    assert [q.id for q in rest.items] == ids[2:] and rest.next_cursor is None

    assert [q.name async for q in client.list_queues(name=names[3])] == [names[3]]
    await client.retire_queue(ids[0], new_key(), 1, "not needed")
    assert [q.id async for q in client.list_queues()] == ids[1:]
    assert [q.id async for q in client.list_queues(include_retired=True)] == ids

    with pytest.raises(ValueError):
        client.list_queues(page_size=0)  # bad arguments fail at the call, not at iteration
    with pytest.raises(ValueError):
        await client.list_queues_page(page_size=1001)


# ---------------------------------------------------------------- tasks (AsyncClient)


async def test_submit_batch_reads_and_cancel(client, recording):
    q = (await client.create_queue(new_key(), queue_request(max_unfinished_tasks=3))).queue
    key = new_key()
    first = await client.submit_task(q.id, key, SubmitTaskRequest(payload={"n": 1}))
    t = first.task
    assert first.deduplicated is False and t.state == TaskState.WAITING and t.state == "WAITING"
    assert (t.queue_id, t.payload, t.priority, t.max_attempts, t.attempts) == (q.id, {"n": 1}, 5, 3, 0)
    assert t.available_at.tzinfo is not None and t.created_at.tzinfo is not None
    assert recording.bodies("/tasks")[-1] == {"payload": {"n": 1}}

    replay = await client.submit_task(q.id, key, {"payload": {"n": 1}})
    assert replay.deduplicated is True and replay.task == t
    with pytest.raises(APIError) as exc:
        await client.submit_task(q.id, key, SubmitTaskRequest(payload={"n": 2}))
    assert_api_error(exc.value, 409, "IDEMPOTENCY_CONFLICT")

    batch_key = new_key()
    items = [
        SubmitTaskItem(idempotency_key=key, payload={"n": 1}),  # the task above: its receipt
        SubmitTaskItem(idempotency_key=new_key(), payload={"n": 2}, priority=9),
        SubmitTaskItem(idempotency_key=new_key(), payload={"n": 3}),
        SubmitTaskItem(idempotency_key=new_key(), payload={"n": 4}),  # the queue is full by now
    ]
    batch = await client.submit_tasks(q.id, batch_key, items)
    assert batch.deduplicated is False and len(batch.results) == 4
    r0, r1, r2, r3 = batch.results
    assert r0.deduplicated is True and r0.task.id == t.id
    assert r1.deduplicated is False and r1.task.priority == 9 and r2.task.state == "WAITING"
    assert r3.task is None and r3.error.code == "QUEUE_FULL"
    assert recording.bodies("tasks:batch")[-1]["tasks"][1] == {
        "idempotency_key": items[1].idempotency_key, "payload": {"n": 2}, "priority": 9}
    again = await client.submit_tasks(q.id, batch_key, items)
    assert again.deduplicated is True and [r.task.id for r in again.results[:3]] == [t.id, r1.task.id, r2.task.id]

    with pytest.raises(APIError) as exc:
        await client.submit_task(q.id, new_key(), SubmitTaskRequest(payload={"n": 5}))
    full = exc.value
    assert_api_error(full, 429, "QUEUE_FULL")
    assert full.retry_after == 1.0 and full.details == {}
    # A replay of an accepted submit is answered with its receipt even while the queue is full.
    assert (await client.submit_task(q.id, key, SubmitTaskRequest(payload={"n": 1}))).task == t

    got = await client.get_task(r1.task.id)
    assert got.id == r1.task.id and got.payload == {"n": 2}
    newest_first = [r2.task.id, r1.task.id, t.id]
    before = len(recording.sent)
    assert [x.id async for x in client.list_tasks(q.id, page_size=1)] == newest_first
    assert len(recording.sent) - before == 3

    cancel_key = new_key()
    cancelled = await client.cancel_task(t.id, cancel_key, "no longer needed")
    assert cancelled.deduplicated is False and cancelled.task.state == "CANCELLED"
    assert cancelled.task.finished_at is not None
    assert (await client.cancel_task(t.id, cancel_key, "no longer needed")).deduplicated is True
    with pytest.raises(APIError) as exc:
        await client.cancel_task(t.id, new_key(), "again")
    assert_api_error(exc.value, 409, "STATE_CONFLICT")

    assert [x.id async for x in client.list_tasks(q.id, state="CANCELLED")] == [t.id]
    assert [x.id async for x in client.list_tasks(q.id, state=TaskState.WAITING)] == newest_first[:2]
    both = [x.id async for x in client.list_tasks(q.id, state=["WAITING", TaskState.CANCELLED], page_size=2)]
    assert both == newest_first
    assert [x.id async for x in client.list_tasks(q.id, state="SUCCEEDED")] == []
    after = t.created_at - timedelta(microseconds=1)
    assert [x.id async for x in client.list_tasks(q.id, created_after=after)] == newest_first
    assert [x.id async for x in client.list_tasks(q.id, created_before=t.created_at + timedelta(microseconds=1))] \
        == [t.id]
    future = (datetime.now(timezone.utc) + timedelta(days=1)).isoformat()
    assert [x.id async for x in client.list_tasks(q.id, created_after=future)] == []
    page = await client.list_tasks_page(q.id, page_size=2)
    assert len(page.items) == 2 and page.next_cursor
    assert [x.id for x in (await client.list_tasks_page(q.id, cursor=page.next_cursor)).items] == [t.id]

    assert [a async for a in client.list_attempts(t.id)] == []
    assert (await client.list_attempts_page(t.id)).items == []

    for missing in (client.get_task(MISSING), client.cancel_task(MISSING, new_key(), "x")):
        with pytest.raises(APIError) as exc:
            await missing
        assert_api_error(exc.value, 404, "NOT_FOUND")


async def test_invalid_argument_details_and_local_validation(client, recording):
    q = (await client.create_queue(new_key(), queue_request())).queue
    with pytest.raises(APIError) as exc:
        await client.list_tasks_page(q.id, created_after="yesterday")
    assert_api_error(exc.value, 400, "INVALID_ARGUMENT")
    assert exc.value.details == {"field": "created_after"} and "created_after" in exc.value.message
    with pytest.raises(APIError) as exc:
        await client.submit_task(q.id, new_key(), SubmitTaskRequest(payload=1, resource_keys=["no-such-key"]))
    assert_api_error(exc.value, 400, "INVALID_ARGUMENT")
    assert exc.value.details == {"field": "resource_keys"}
    # A value the local model would refuse, forced through: the server says which field.
    with pytest.raises(APIError) as exc:
        await client.create_queue(new_key(), CreateQueueRequest.model_construct(
            name="x-forced", max_concurrency=0, rate_per_second=1))
    assert_api_error(exc.value, 400, "INVALID_ARGUMENT")
    assert exc.value.details == {"field": "max_concurrency"}

    sent = len(recording.sent)
    bad_keys = ["", "a" * 129, "has space", "tab\tkey", "naïve", None]
    for bad in bad_keys:
        with pytest.raises(ValueError):
            await client.submit_task(q.id, bad, SubmitTaskRequest(payload=1))
    with pytest.raises(ValueError):
        await client.cancel_task(q.id, "", "x")
    with pytest.raises(ValueError):
        await client.get_task("../queues")
    with pytest.raises(ValueError):
        await client.get_queue("")
    with pytest.raises(TypeError):
        await client.submit_task(q.id, new_key(), SubmitTaskItem(idempotency_key="a", payload=1))
    with pytest.raises(ValueError):
        await client.submit_tasks(q.id, new_key(), [])
    with pytest.raises(ValueError):
        await client.submit_task(q.id, new_key(), {"payload": 1, "priority": 10})
    with pytest.raises(ValueError):
        await client.retire_queue(q.id, new_key(), 0, "x")
    with pytest.raises(ValueError):
        await client.retire_queue(q.id, new_key(), "01", "x")
    with pytest.raises(ValueError):
        client.list_tasks(q.id, state="waiting")
    with pytest.raises(ValueError):
        client.list_tasks(q.id, created_after=datetime(2026, 1, 1))  # naive: ambiguous
    with pytest.raises(ValueError):
        await client.review_task(q.id, new_key(), "MAYBE", "x")
    assert len(recording.sent) == sent  # nothing reached the server
    # The longest valid key is accepted by the server too.
    r = await client.submit_task(q.id, "~" * 128, SubmitTaskRequest(payload=1))
    assert r.deduplicated is False


async def test_health_and_ready(client, app):
    assert await client.health() == {"status": "ok"}
    assert (await client.ready())["status"] == "ready"
    app.state.node.draining = True
    try:
        with pytest.raises(APIError) as exc:
            await client.ready()
    finally:
        app.state.node.draining = False
    assert_api_error(exc.value, 503, "UNAVAILABLE")
    assert exc.value.retry_after == 1.0


async def test_unauthenticated(app, tenant):
    async with AsyncClient("http://orbit.test", token="orb_" + "0" * 32 + "_nope",
                           transport=httpx.ASGITransport(app=app)) as c:
        with pytest.raises(APIError) as exc:
            await c.get_queue(MISSING)
        assert_api_error(exc.value, 401, "UNAUTHENTICATED")
        assert await c.health() == {"status": "ok"}


# ---------------------------------------------------------------- review (both clients, real server)


async def needs_review(client: AsyncClient, base: str, token: str, n: int) -> list[str]:
    """Submit n tasks, start them under a short lease, lose the lease: n NEEDS_REVIEW tasks."""
    q = (await client.create_queue(new_key(), queue_request())).queue
    ids = [(await client.submit_task(q.id, new_key(), {"payload": i, "max_attempts": 2})).task.id
           for i in range(n)]
    async with Worker.connect(base, token) as w:
        await w.hello(q.id)
        claim = await w.call("claim", queue_id=q.id, max_tasks=n, lease_ms=1000)
        assert len(claim["tasks"]) == n, claim
        for lease in claim["tasks"]:
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
    await asyncio.sleep(1.1)  # let the 1-second leases expire
    return ids


async def test_review_and_attempts(client, tenant, app):
    async with serve(app) as base:
        a, b, c = await needs_review(client, base, tenant.token, 3)
        for _ in range(20):  # recovery spans the shared test database, in batches
            if await dispatch.recover_expired_leases(tenant.db) == 0:
                break
        for t in (a, b, c):
            assert (await client.get_task(t)).state == "NEEDS_REVIEW"

        attempts = [x async for x in client.list_attempts(a)]
        assert len(attempts) == 1 and attempts[0].number == 1 and attempts[0].outcome == "LEASE_LOST"
        assert attempts[0].started_at.tzinfo is not None
        with pytest.raises(APIError) as exc:  # cancel is not the way out of NEEDS_REVIEW
            await client.cancel_task(a, new_key(), "x")
        assert_api_error(exc.value, 409, "STATE_CONFLICT")

        key = new_key()
        done = await client.review_task(a, key, "SUCCEEDED", "checked the ledger", evidence={"ledger": "row 7"})
        assert done.deduplicated is False and done.task.state == "SUCCEEDED"
        assert (await client.review_task(a, key, "SUCCEEDED", "checked the ledger",
                                         evidence={"ledger": "row 7"})).deduplicated is True
        with pytest.raises(APIError) as exc:
            await client.review_task(a, key, "FAILED", "checked the ledger")
        assert_api_error(exc.value, 409, "IDEMPOTENCY_CONFLICT")
        with pytest.raises(APIError) as exc:
            await client.review_task(a, new_key(), "FAILED", "changed my mind")
        assert_api_error(exc.value, 409, "STATE_CONFLICT")

        def sync_reviews() -> tuple[str, str]:
            with Client(base, token=tenant.token) as sync:
                retried = sync.review_task(b, new_key(), "RETRY", "safe to rerun")
                failed = sync.review_task(c, new_key(), "FAILED", "never happened")
                assert [x.outcome for x in sync.list_attempts(b)] == ["LEASE_LOST"]
                assert sync.list_attempts_page(b, page_size=1).items[0].number == 1
                return retried.task.state, failed.task.state

        assert await asyncio.to_thread(sync_reviews) == ("WAITING", "FAILED")


# ---------------------------------------------------------------- transport failures


async def test_transport_error_on_refused_connection():
    url = f"http://127.0.0.1:{free_port()}"
    async with AsyncClient(url, token="orb_x_y", timeout=5) as c:
        with pytest.raises(TransportError) as exc:
            await c.submit_task(MISSING, new_key(), SubmitTaskRequest(payload=1))
    assert "unknown" in str(exc.value) and isinstance(exc.value, orbit.OrbitError)
    assert "orb_x_y" not in str(exc.value)

    def sync() -> str:
        with Client(url, token="orb_x_y", timeout=5) as c:
            with pytest.raises(TransportError) as exc:
                c.get_queue(MISSING)
            return str(exc.value)

    assert "unknown" in await asyncio.to_thread(sync)


# ---------------------------------------------------------------- aretry_submit


@pytest.fixture
def waits(monkeypatch):
    """Record retry waits instead of sleeping; jitter fixed at zero (waits = Retry-After)."""
    recorded: list[float] = []
    hooks: list = []

    async def fake_asleep(seconds: float) -> None:
        recorded.append(seconds)
        for hook in hooks:
            await hook()

    def fake_sleep(seconds: float) -> None:
        recorded.append(seconds)
        for hook in hooks:
            hook()

    monkeypatch.setattr(retry_module, "_asleep", fake_asleep)
    monkeypatch.setattr(retry_module, "_sleep", fake_sleep)
    monkeypatch.setattr(retry_module, "_random", lambda: 0.0)
    return recorded, hooks


async def test_aretry_submit(client, recording, waits):
    recorded, hooks = waits
    q = (await client.create_queue(new_key(), queue_request(max_unfinished_tasks=1))).queue
    blocker = (await client.submit_task(q.id, new_key(), SubmitTaskRequest(payload="blocker"))).task

    async def free_a_slot() -> None:
        hooks.clear()
        await client.cancel_task(blocker.id, new_key(), "make room")

    hooks.append(free_a_slot)
    key, req = new_key(), SubmitTaskRequest(payload="patient")
    accepted = await orbit.aretry_submit(client, q.id, key, req, attempts=3, deadline=60)
    assert accepted.deduplicated is False and accepted.task.payload == "patient"
    assert recorded == [1.0]  # one QUEUE_FULL, waited its Retry-After, then accepted
    submits = [r for r in recording.sent if r.url.path == f"/v1/queues/{q.id}/tasks"][-2:]
    sent_twice = [(r.headers["idempotency-key"], json.loads(r.content)) for r in submits]
    assert sent_twice == [(key, {"payload": "patient"})] * 2

    # Full again: gives up after `attempts` sends, re-raising QUEUE_FULL.
    recorded.clear()
    sent = len(recording.sent)
    with pytest.raises(APIError) as exc:
        await orbit.aretry_submit(client, q.id, new_key(), req, attempts=3, deadline=3600)
    assert exc.value.code == "QUEUE_FULL" and recorded == [1.0, 1.0] and len(recording.sent) - sent == 3

    # ... or as soon as the next wait would pass the deadline.
    recorded.clear()
    sent = len(recording.sent)
    with pytest.raises(APIError) as exc:
        await orbit.aretry_submit(client, q.id, new_key(), req, attempts=10, deadline=0.5)
    assert exc.value.code == "QUEUE_FULL" and recorded == [] and len(recording.sent) - sent == 1

    # Other errors are raised at once.
    with pytest.raises(APIError) as exc:
        await orbit.aretry_submit(client, MISSING, new_key(), req)
    assert exc.value.code == "NOT_FOUND" and recorded == []
    with pytest.raises(ValueError):
        await orbit.aretry_submit(client, q.id, "bad key", req)
    with pytest.raises(ValueError):
        await orbit.aretry_submit(client, q.id, new_key(), req, attempts=0)


async def test_aretry_submit_after_a_lost_answer(client, recording, waits):
    recorded, _ = waits
    q = (await client.create_queue(new_key(), queue_request())).queue
    key = new_key()
    recording.lose_answers = 1  # the first submit lands, but its answer is lost
    result = await orbit.aretry_submit(client, q.id, key, {"payload": {"x": 1}})
    assert result.deduplicated is True and recorded == [0.0]
    assert [t.id async for t in client.list_tasks(q.id)] == [result.task.id]  # exactly one task

    recording.lose_answers = 1  # without the helper the SDK does not resend: the caller sees the unknown outcome
    with pytest.raises(TransportError):
        await client.submit_task(q.id, new_key(), {"payload": {"x": 2}})
    assert len([t async for t in client.list_tasks(q.id)]) == 2


# ---------------------------------------------------------------- the blocking Client on a real server


def sync_scenario(base: str, token: str, waits) -> None:
    recorded, hooks = waits
    with Client.from_env() as c:
        assert repr(c) == f"Client(url={base!r})" and token not in repr(c)
        assert c.health() == {"status": "ok"} and c.ready()["status"] == "ready"

        names = [f"sync-{uuid.uuid4().hex[:8]}-{i}" for i in range(3)]
        created = [c.create_queue(new_key(), queue_request(name=n, max_unfinished_tasks=2)) for n in names]
        qs = [r.queue for r in created]
        assert [q.id for q in c.list_queues(page_size=2)] == [q.id for q in qs]
        page = c.list_queues_page(page_size=1)
        assert [q.id for q in page.items] == [qs[0].id] and page.next_cursor
        assert [q.name for q in c.list_queues(name=names[1])] == [names[1]]
        q = qs[0]
        assert c.get_queue(q.id) == q

        key = new_key()
        first = c.submit_task(q.id, key, SubmitTaskRequest(payload={"a": 1}, deadline_seconds=600))
        assert first.deduplicated is False and first.task.deadline_at.tzinfo is not None
        assert c.submit_task(q.id, key, SubmitTaskRequest(payload={"a": 1}, deadline_seconds=600)).deduplicated
        batch = c.submit_tasks(q.id, new_key(), [{"idempotency_key": new_key(), "payload": {"a": 2}},
                                                 SubmitTaskItem(idempotency_key=new_key(), payload={"a": 3})])
        second = batch.results[0].task
        assert batch.results[1].error.code == "QUEUE_FULL" and batch.results[1].task is None
        with pytest.raises(APIError) as exc:
            c.submit_task(q.id, new_key(), SubmitTaskRequest(payload={"a": 4}))
        assert (exc.value.status_code, exc.value.code, exc.value.retry_after) == (429, "QUEUE_FULL", 1.0)
        assert c.get_task(second.id).payload == {"a": 2}
        assert [t.id for t in c.list_tasks(q.id, page_size=1)] == [second.id, first.task.id]
        assert [t.id for t in c.list_tasks(q.id, state=["WAITING"], created_before=second.created_at)] \
            == [first.task.id]
        assert c.list_tasks_page(q.id, state="CANCELLED").items == []
        assert list(c.list_attempts(second.id)) == [] and c.list_attempts_page(second.id).next_cursor is None

        # retry_submit: the first try is QUEUE_FULL; a slot frees up during the wait.
        def free_a_slot() -> None:
            hooks.clear()
            assert c.cancel_task(second.id, new_key(), "make room").task.state == "CANCELLED"

        hooks.append(free_a_slot)
        third = orbit.retry_submit(c, q.id, new_key(), SubmitTaskRequest(payload={"a": 4}), attempts=2)
        assert third.deduplicated is False and recorded == [1.0]
        recorded.clear()
        with pytest.raises(APIError) as exc:
            orbit.retry_submit(c, q.id, new_key(), SubmitTaskRequest(payload={"a": 5}), attempts=2, deadline=60)
        assert exc.value.code == "QUEUE_FULL" and recorded == [1.0]

        cancel_key = new_key()
        assert c.cancel_task(first.task.id, cancel_key, "done").task.state == "CANCELLED"
        assert c.cancel_task(first.task.id, cancel_key, "done").deduplicated is True
        with pytest.raises(APIError) as exc:
            c.cancel_task(first.task.id, new_key(), "done")
        assert (exc.value.status_code, exc.value.code) == (409, "STATE_CONFLICT")
        assert c.cancel_task(third.task.id, new_key(), "done").task.state == "CANCELLED"

        live = c.get_queue(q.id)
        assert live.unfinished_tasks == 0
        configured = c.configure_queue(q.id, new_key(), ConfigureQueueRequest(
            expected_revision=str(live.revision), reason="pause", paused=True, max_concurrency=1,
            rate_per_second=1, max_unfinished_tasks=5))
        assert configured.queue.paused and configured.queue.revision == 2
        with pytest.raises(APIError) as exc:
            c.retire_queue(q.id, new_key(), 1, "stale")
        assert (exc.value.status_code, exc.value.code) == (409, "STATE_CONFLICT")
        retired = c.retire_queue(q.id, new_key(), configured.queue.revision, "all done")
        assert retired.queue.retired_at is not None
        assert q.id not in [x.id for x in c.list_queues()]
        assert q.id in [x.id for x in c.list_queues(include_retired=True)]
        with pytest.raises(APIError) as exc:
            c.get_task(MISSING)
        assert (exc.value.status_code, exc.value.code) == (404, "NOT_FOUND") and HEX32.match(exc.value.request_id)


async def test_sync_client_against_a_real_server(app, tenant, tmp_path, monkeypatch, waits):
    creds = tmp_path / "credentials.json"
    creds.write_bytes(orjson.dumps({"credential_id": tenant.credential_id, "token": tenant.token}))
    async with serve(app) as base:
        monkeypatch.setenv("ORBIT_URL", base)
        monkeypatch.setenv("ORBIT_CREDENTIALS_FILE", str(creds))
        monkeypatch.setenv("ORBIT_TOKEN", "orb_wrong_token")  # the credentials file wins
        await asyncio.to_thread(sync_scenario, base, tenant.token, waits)


# ---------------------------------------------------------------- applications (AsyncClient)


async def test_application_quotas(client, tenant):
    app_id = tenant.application["id"]
    app = await client.get_application(app_id)
    assert (app.id, app.revision, app.max_concurrency, app.in_flight) == (app_id, 1, 1_000_000, 0)
    key = new_key()
    body = {"expected_revision": app.revision, "reason": "plan", "paused": False, "max_concurrency": 9,
            "rate_per_second": 90, "max_unfinished_tasks": 900}
    done = await client.configure_application(app_id, key, body)
    assert done.deduplicated is False and done.application.revision == 2 and done.application.max_concurrency == 9
    assert (await client.configure_application(app_id, key, body)).deduplicated is True
    with pytest.raises(APIError) as exc:
        await client.get_application(new_id())
    assert_api_error(exc.value, 404, "NOT_FOUND")


# ---------------------------------------------------------------- live usage and blockers (both clients)


def assert_aware(value: datetime | None) -> None:
    assert isinstance(value, datetime) and value.tzinfo is not None and value.utcoffset() is not None, value


def check_idle_usage(usage: orbit.QueueUsage, queue_id: str) -> None:
    """Two unfinished tasks (one due, one an hour ahead), nothing claimed, no Start ever."""
    assert isinstance(usage, orbit.QueueUsage) and usage.queue_id == queue_id
    assert_aware(usage.at)
    counts = {f: getattr(usage, f) for f in ("unfinished_tasks", "waiting", "delayed", "leased", "running",
                                              "needs_review", "in_flight")}
    assert counts == {"unfinished_tasks": 2, "waiting": 1, "delayed": 1, "leased": 0, "running": 0,
                      "needs_review": 0, "in_flight": 0}
    assert all(type(v) is int for v in counts.values()), counts  # uint64 strings on the wire, ints here
    assert usage.rate_window is None and usage.active_nodes == []


def check_idle_blockers(due: orbit.TaskBlockers, delayed: orbit.TaskBlockers, due_id: str, delayed_id: str,
                        available_at: datetime) -> None:
    for b, task_id in ((due, due_id), (delayed, delayed_id)):
        assert isinstance(b, orbit.TaskBlockers) and (b.task_id, b.state) == (task_id, "WAITING")
        assert_aware(b.at)
        assert all(isinstance(x, orbit.Blocker) for x in b.blockers)
    # No worker node has claimed on the queue: both wait on that; the delayed one on its time first.
    assert [(x.layer, x.control) for x in due.blockers] == [("workers", "no_active_workers")]
    assert [(x.layer, x.control) for x in delayed.blockers] == [("time", "available_at"),
                                                                ("workers", "no_active_workers")]
    time = delayed.blockers[0]
    assert_aware(time.until)
    assert time.until == available_at
    assert (time.name, time.limit, time.in_use, time.used) == (None, None, None, None)


async def test_queue_usage_and_task_blockers(client, tenant, app, recording):
    q = (await client.create_queue(new_key(), queue_request())).queue
    due = (await client.submit_task(q.id, new_key(), SubmitTaskRequest(payload={"n": 1}))).task
    ahead = (datetime.now(timezone.utc) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    delayed = (await client.submit_task(q.id, new_key(), SubmitTaskRequest(payload={"n": 2},
                                                                           available_at=ahead))).task
    assert delayed.available_at > datetime.now(timezone.utc) + timedelta(minutes=59)

    # AsyncClient
    usage = await client.get_queue_usage(q.id)
    check_idle_usage(usage, q.id)
    due_b, delayed_b = await client.get_task_blockers(due.id), await client.get_task_blockers(delayed.id)
    check_idle_blockers(due_b, delayed_b, due.id, delayed.id, delayed.available_at)
    assert [r.url.path for r in recording.sent[-3:]] == [
        f"/v1/queues/{q.id}/usage", f"/v1/tasks/{due.id}/blockers", f"/v1/tasks/{delayed.id}/blockers"]
    for missing in (client.get_queue_usage(MISSING), client.get_task_blockers(MISSING)):
        with pytest.raises(APIError) as exc:
            await missing
        assert_api_error(exc.value, 404, "NOT_FOUND")
    sent = len(recording.sent)
    for bad in ("", "../queues", "a/b"):
        with pytest.raises(ValueError):
            await client.get_queue_usage(bad)
        with pytest.raises(ValueError):
            await client.get_task_blockers(bad)
    with pytest.raises(TypeError):
        await client.get_task_blockers(None)
    assert len(recording.sent) == sent  # refused locally

    async with serve(app) as base:
        # The blocking Client on a real server: the same answers.
        def sync_reads() -> None:
            with Client(base, token=tenant.token) as c:
                u = c.get_queue_usage(q.id)
                check_idle_usage(u, q.id)
                assert u.model_dump(exclude={"at"}) == usage.model_dump(exclude={"at"})
                check_idle_blockers(c.get_task_blockers(due.id), c.get_task_blockers(delayed.id), due.id,
                                    delayed.id, delayed.available_at)
                for call, arg in ((c.get_queue_usage, MISSING), (c.get_task_blockers, MISSING),
                                  (c.get_queue_usage, delayed.id), (c.get_task_blockers, q.id)):
                    with pytest.raises(APIError) as exc:
                        call(arg)
                    assert_api_error(exc.value, 404, "NOT_FOUND")
                with pytest.raises(ValueError):
                    c.get_queue_usage("../x")

        await asyncio.to_thread(sync_reads)

        # A worker node claims the due task: it shows as active, and no longer blocks anything.
        async with Worker.connect(base, tenant.token) as w:
            await w.hello(q.id, node_id="usage-node")
            claim = await w.call("claim", queue_id=q.id, max_tasks=2, lease_ms=30_000)
            assert [t["task_id"] for t in claim["tasks"]] == [due.id], claim
            leased = await client.get_queue_usage(q.id)
            assert (leased.unfinished_tasks, leased.waiting, leased.delayed, leased.leased, leased.in_flight) \
                == (2, 0, 1, 1, 1)
            assert leased.rate_window is None  # a claim reserves, only a Start opens the window
            [node] = leased.active_nodes
            assert isinstance(node, orbit.ActiveNode)
            assert (node.node_id, node.in_flight) == ("usage-node", 1) and type(node.in_flight) is int
            assert_aware(node.last_claim_at)

            def sync_after_claim() -> tuple[orbit.TaskBlockers, orbit.TaskBlockers]:
                with Client(base, token=tenant.token) as c:
                    return c.get_task_blockers(due.id), c.get_task_blockers(delayed.id)

            for held, waits in (await asyncio.to_thread(sync_after_claim),
                                (await client.get_task_blockers(due.id), await client.get_task_blockers(delayed.id))):
                assert (held.state, held.blockers) == ("LEASED", [])  # not waiting: `state` says where it is
                assert [(x.layer, x.control) for x in waits.blockers] == [("time", "available_at")]
                assert waits.blockers[0].until == delayed.available_at

            assert (await w.call("start", lease_id=claim["tasks"][0]["lease_id"]))["ok"]
            started = await client.get_queue_usage(q.id)
            assert (started.leased, started.running, started.in_flight) == (0, 1, 1)
            window = started.rate_window
            if window is not None:  # open for one second after the Start: usually still open here
                assert isinstance(window, orbit.RateWindowUse)
                assert (window.used, window.reserved) == (1, 0) and type(window.used) is int
                assert_aware(window.started_at)
                assert window.started_at <= started.at
