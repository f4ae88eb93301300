"""SDK errors without a server: Retry-After parsing, envelope mapping, local validation, retry bounds,
and that `import orbit` stays free of server dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import orjson
import pytest

import orbit
from orbit import APIError, AsyncClient, Client, SubmitTaskRequest, TransportError
from orbit.sdk import retry as retry_module
from orbit.sdk.errors import parse_retry_after

TOKEN = "orb_" + "1" * 32 + "_secret-value"
RID = "4" * 32
QID = "a" * 32


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("1", 1.0), (None, 0.0), ("abc", 0.0), ("3601", 0.0), ("-1", 0.0), ("3600", 3600.0),
        ("0", 0.0), (" 2 ", 2.0), ("", 0.0), ("1.5", 0.0), ("+1", 0.0), ("1e3", 0.0),
        ("Wed, 21 Oct 2026 07:28:00 GMT", 0.0),  # HTTP-date form: not an integer, so 0
        ("²", 0.0), ("٣", 0.0),  # non-ASCII digits
        ("9" * 5000, 0.0), ("0" * 40 + "7", 7.0),  # longer than int() accepts / leading zeros
    ],
)
def test_parse_retry_after(header, seconds):
    assert parse_retry_after(header) == seconds


def test_import_orbit_loads_no_server_dependency():
    code = (
        "import orbit, sys\n"
        "assert orbit.Client and orbit.AsyncClient and orbit.retry_submit and orbit.aretry_submit\n"
        "heavy = ('fastapi', 'sqlalchemy', 'uvicorn', 'starlette', 'structlog', 'alembic')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_public_names_are_documented():
    for name in ("Client", "AsyncClient", "retry_submit", "aretry_submit", "APIError", "TransportError"):
        assert getattr(orbit, name).__doc__, name
        assert name in orbit.__all__
    for cls in (Client, AsyncClient):
        for attr in dir(cls):
            if not attr.startswith("_"):
                assert getattr(cls, attr).__doc__, f"{cls.__name__}.{attr}"


# ---------------------------------------------------------------- envelope → error mapping


def envelope_error(code, message="m", details=None):
    err = {"code": code, "message": message}
    if details is not None:
        err["details"] = details
    return orjson.dumps({"request_id": RID, "error": err})


def client_answering(status: int, content: bytes, headers=None, seen=None) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=content, headers={"x-request-id": RID, **(headers or {})})

    return Client("http://orbit.test", token=TOKEN, transport=httpx.MockTransport(handler))


def test_error_envelope_maps_every_field():
    body = envelope_error("QUEUE_FULL", "queue unfinished task limit reached", {"queue_id": QID})
    with client_answering(429, body, {"content-type": "application/json", "retry-after": "1"}) as c:
        with pytest.raises(APIError) as exc:
            c.submit_task(QID, "k-1", SubmitTaskRequest(payload=1))
    e = exc.value
    assert (e.code, e.status_code, e.message, e.request_id, e.details, e.retry_after) == (
        "QUEUE_FULL", 429, "queue unfinished task limit reached", RID, {"queue_id": QID}, 1.0)
    assert str(e) == "429 QUEUE_FULL: queue unfinished task limit reached" and TOKEN not in str(e)


def test_error_envelope_with_a_bad_retry_after_means_zero():
    with client_answering(503, envelope_error("UNAVAILABLE"), {"retry-after": "soon"}) as c:
        with pytest.raises(APIError) as exc:
            c.get_queue(QID)
    assert (exc.value.code, exc.value.retry_after, exc.value.details) == ("UNAVAILABLE", 0.0, {})


@pytest.mark.parametrize(
    ("status", "content", "headers"),
    [
        (200, b"<html>ok</html>", {"content-type": "text/html"}),  # 2xx but not an envelope
        (201, b'{"request_id": "x"}', {}),  # JSON without data
        (200, b'["data"]', {}),
        (200, b"", {}),
        (502, b"<html>Bad Gateway</html>", {"content-type": "text/html"}),  # an intermediary gave up
        (504, b"upstream timed out", {}),
        (503, b"no healthy upstream", {}),
    ],
)
def test_unreadable_answers_mean_an_unknown_outcome(status, content, headers):
    with client_answering(status, content, headers) as c:
        with pytest.raises(TransportError) as exc:
            c.submit_task(QID, "k-1", SubmitTaskRequest(payload=1))
    assert "unknown" in str(exc.value) and "same idempotency key" in str(exc.value)


@pytest.mark.parametrize(
    ("status", "content", "headers", "needle"),
    [
        (500, b"Internal Server Error", {"content-type": "text/plain"}, "Internal Server Error"),
        (404, b"<html>nginx 404</html>", {"content-type": "text/html"}, "nginx 404"),
        (413, b"too big", {}, "too big"),
        (400, b'{"error": "no code"}', {}, "no code"),
        (302, b"", {"location": "https://orbit.example/v1/queues"}, "redirect"),
    ],
)
def test_other_answers_without_an_envelope_are_internal(status, content, headers, needle):
    with client_answering(status, content, headers) as c:
        with pytest.raises(APIError) as exc:
            c.get_queue(QID)
    e = exc.value
    assert (e.code, e.status_code, e.request_id) == ("INTERNAL", status, RID) and needle in e.message


def test_a_success_that_does_not_fit_the_model_is_internal():
    with client_answering(200, orjson.dumps({"request_id": RID, "data": {"id": QID}})) as c:
        with pytest.raises(APIError) as exc:
            c.get_queue(QID)
    assert (exc.value.code, exc.value.status_code, exc.value.request_id) == ("INTERNAL", 200, RID)
    assert "Queue" in exc.value.message


@pytest.mark.parametrize(
    ("error", "word"),
    [
        (httpx.ConnectError("refused"), "failed"),
        (httpx.ReadTimeout("slow"), "timed out"),
        (httpx.RemoteProtocolError("peer closed connection"), "failed"),
        (httpx.WriteError("broken pipe"), "failed"),
    ],
)
def test_transport_failures_are_transport_errors(error, word):
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    with Client("http://orbit.test", token=TOKEN, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(TransportError) as exc:
            c.cancel_task(QID, "k-1", "why")
    msg = str(exc.value)
    assert word in msg and "unknown" in msg and f"/v1/tasks/{QID}:cancel" in msg and TOKEN not in msg
    assert exc.value.__cause__ is error


def test_a_stuck_cursor_does_not_loop_forever():
    page = orjson.dumps({"request_id": RID, "data": {"items": [], "next_cursor": "same"}})
    with client_answering(200, page) as c:
        with pytest.raises(APIError) as exc:
            list(c.list_queues())
    assert exc.value.code == "INTERNAL" and "cursor" in exc.value.message


@pytest.mark.anyio
async def test_async_client_maps_the_same_way():
    answers = iter([
        httpx.Response(429, content=envelope_error("QUEUE_FULL"), headers={"retry-after": "1"}),
        httpx.Response(200, content=b"garbage"),
    ])

    async def handler(request: httpx.Request) -> httpx.Response:
        return next(answers)

    async def failing(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("no route")

    async with AsyncClient("http://orbit.test", token=TOKEN, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(APIError) as exc:
            await c.submit_task(QID, "k", SubmitTaskRequest(payload=1))
        assert (exc.value.code, exc.value.status_code, exc.value.retry_after) == ("QUEUE_FULL", 429, 1.0)
        with pytest.raises(TransportError):
            await c.submit_task(QID, "k", SubmitTaskRequest(payload=1))
    async with AsyncClient("http://orbit.test", transport=httpx.MockTransport(failing)) as c:
        with pytest.raises(TransportError, match="timed out"):
            await c.health()


# ---------------------------------------------------------------- what the client sends


def test_requests_carry_auth_keys_and_only_the_fields_that_were_set():
    seen: list[httpx.Request] = []
    body = orjson.dumps({"request_id": RID, "data": {"status": "ok"}})
    with client_answering(200, body, seen=seen) as c:
        assert c.health() == {"status": "ok"}
        with pytest.raises(APIError):  # the mock's answer does not fit SubmitTaskResult
            c.submit_task(QID, "key-1", SubmitTaskRequest(payload={"a": [1, 2]}, priority=5))
    get, post = seen
    assert get.headers["authorization"] == f"Bearer {TOKEN}" and "idempotency-key" not in get.headers
    assert get.headers["user-agent"].startswith("orbit-python/") and get.content == b""
    assert post.url.path == f"/v1/queues/{QID}/tasks"
    assert post.headers["idempotency-key"] == "key-1" and post.headers["content-type"] == "application/json"
    assert json.loads(post.content) == {"payload": {"a": [1, 2]}, "priority": 5}


def test_base_url_prefix_and_extra_headers_are_kept():
    seen: list[httpx.Request] = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, content=orjson.dumps({"request_id": RID, "data": {"status": "ok"}}))

    with Client("https://gw.example/orbit/", token=TOKEN, headers={"X-Tenant": "blue"},
                transport=httpx.MockTransport(handler)) as c:
        assert c.base_url == "https://gw.example/orbit"
        c.health()
    assert str(seen[0].url) == "https://gw.example/orbit/healthz" and seen[0].headers["x-tenant"] == "blue"


def test_constructor_and_environment(monkeypatch, tmp_path):
    c = Client("http://127.0.0.1:8080", token=TOKEN)
    assert repr(c) == "Client(url='http://127.0.0.1:8080')" and TOKEN not in repr(c)
    c.close()
    for bad_url in ("127.0.0.1:8080", "ftp://x", "http://", "http://h/?a=1", "http://h:99999"):
        with pytest.raises(ValueError):
            Client(bad_url)
    for bad_token in ("", "with space", "line\nbreak"):
        with pytest.raises(ValueError) as exc:
            Client("http://h", token=bad_token)
        assert bad_token not in str(exc.value) or bad_token == ""
    with pytest.raises(ValueError):
        Client("http://h", timeout=0)

    for name in ("ORBIT_URL", "ORBIT_CREDENTIALS_FILE", "ORBIT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="ORBIT_URL"):
        Client.from_env()
    monkeypatch.setenv("ORBIT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("ORBIT_TOKEN", TOKEN)
    with Client.from_env(timeout=3) as c:
        assert c.token == TOKEN and c.timeout == 3
    creds = tmp_path / "credentials.json"
    creds.write_text(json.dumps({"token": "orb_from_file\n"}))
    monkeypatch.setenv("ORBIT_CREDENTIALS_FILE", str(creds))
    with Client.from_env() as c:
        assert c.token == "orb_from_file"
    creds.write_text('{"token": ')
    with pytest.raises(ValueError, match="ORBIT_CREDENTIALS_FILE"):
        Client.from_env()
    creds.write_text(json.dumps({"credential_id": "x"}))
    with pytest.raises(ValueError, match="token"):
        AsyncClient.from_env()
    monkeypatch.setenv("ORBIT_CREDENTIALS_FILE", str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="missing.json"):
        Client.from_env()


APP_ID = "b" * 32
APPLICATION = {
    "id": APP_ID, "name": "acme", "paused": False, "max_concurrency": 10, "rate_per_second": 100,
    "max_unfinished_tasks": 1000, "unfinished_tasks": "0", "in_flight": "0", "revision": "1",
    "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
}
CONFIGURE_APPLICATION = {
    "expected_revision": 1, "reason": "raise the quota", "paused": False,
    "max_concurrency": 20, "rate_per_second": 200, "max_unfinished_tasks": 2000,
}


def application_handler(seen: list[httpx.Request]):
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "GET":
            data = APPLICATION
        else:
            data = {"deduplicated": False, "application": {**APPLICATION, "max_concurrency": 20, "revision": "2"}}
        return httpx.Response(200, content=orjson.dumps({"request_id": RID, "data": data}))

    return handler


def check_application_requests(seen: list[httpx.Request]) -> None:
    get, post = seen
    assert (get.method, get.url.path, get.content) == ("GET", f"/v1/applications/{APP_ID}", b"")
    assert "idempotency-key" not in get.headers
    assert (post.method, post.url.path) == ("POST", f"/v1/applications/{APP_ID}:configure")
    assert post.headers["idempotency-key"] == "app-key-1" and post.headers["content-type"] == "application/json"
    assert json.loads(post.content) == {**CONFIGURE_APPLICATION, "expected_revision": "1"}


def test_application_requests():
    seen: list[httpx.Request] = []
    with Client("http://orbit.test", token=TOKEN, transport=httpx.MockTransport(application_handler(seen))) as c:
        app = c.get_application(APP_ID)
        assert isinstance(app, orbit.Application)
        assert (app.id, app.revision, app.unfinished_tasks, app.in_flight) == (APP_ID, 1, 0, 0)
        result = c.configure_application(APP_ID, "app-key-1", CONFIGURE_APPLICATION)
    assert isinstance(result, orbit.ConfigureApplicationResult)
    assert (result.deduplicated, result.application.max_concurrency, result.application.revision) == (False, 20, 2)
    check_application_requests(seen)


@pytest.mark.anyio
async def test_async_application_requests():
    seen: list[httpx.Request] = []
    async with AsyncClient("http://orbit.test", token=TOKEN,
                           transport=httpx.MockTransport(application_handler(seen))) as c:
        assert (await c.get_application(APP_ID)).revision == 1
        request = orbit.ConfigureApplicationRequest(**CONFIGURE_APPLICATION)
        result = await c.configure_application(APP_ID, "app-key-1", request)
    assert result.application.revision == 2
    check_application_requests(seen)


@pytest.mark.anyio
async def test_application_arguments_are_validated_before_sending():
    seen: list[httpx.Request] = []
    transport = httpx.MockTransport(application_handler(seen))
    bad_requests = [
        {**CONFIGURE_APPLICATION, "max_concurrency": 0},
        {**CONFIGURE_APPLICATION, "reason": "  "},
        {**CONFIGURE_APPLICATION, "expected_revision": 0},
        {k: v for k, v in CONFIGURE_APPLICATION.items() if k != "paused"},
        {**CONFIGURE_APPLICATION, "surprise": 1},
    ]
    with Client("http://orbit.test", token=TOKEN, transport=transport) as c:
        for bad in bad_requests:
            with pytest.raises(ValueError):
                c.configure_application(APP_ID, "app-key-1", bad)
        with pytest.raises(ValueError):
            c.configure_application(APP_ID, "", CONFIGURE_APPLICATION)
        with pytest.raises(ValueError):
            c.get_application("../queues")
        with pytest.raises(TypeError):
            c.configure_application(APP_ID, "app-key-1", SubmitTaskRequest(payload=1))
    async with AsyncClient("http://orbit.test", token=TOKEN, transport=transport) as c:
        with pytest.raises(ValueError):
            await c.configure_application(APP_ID, "app-key-1", bad_requests[0])
        with pytest.raises(ValueError):
            await c.get_application("")
    assert seen == []


# ---------------------------------------------------------------- retry_submit bounds (fake client)


class FakeClient:
    """Raises the given errors in order, then accepts; records what was resent."""

    def __init__(self, *errors):
        self.errors = list(errors)
        self.calls: list[tuple] = []

    def submit_task(self, queue_id, key, request):
        self.calls.append((queue_id, key, request))
        if self.errors:
            raise self.errors.pop(0)
        return "accepted"


def full(retry_after=1.0, code="QUEUE_FULL"):
    return APIError(code, "full", status_code=429, retry_after=retry_after)


@pytest.fixture
def clock(monkeypatch):
    """A fake monotonic clock that only advances when the helper sleeps."""
    state = {"now": 100.0, "waits": []}

    def sleep(seconds):
        state["waits"].append(seconds)
        state["now"] += seconds

    monkeypatch.setattr(retry_module, "_clock", lambda: state["now"])
    monkeypatch.setattr(retry_module, "_sleep", sleep)
    return state


def test_retry_submit_resends_the_same_command(clock):
    req = SubmitTaskRequest(payload=1)
    fake = FakeClient(full(), TransportError("lost"), full(code="APPLICATION_FULL"), full(code="UNAVAILABLE"))
    assert orbit.retry_submit(fake, QID, "k", req, attempts=5) == "accepted"
    assert fake.calls == [(QID, "k", req)] * 5
    assert len(clock["waits"]) == 4 and all(w >= 0 for w in clock["waits"])
    assert clock["waits"][0] >= 1.0 and clock["waits"][2] >= 1.0  # never shorter than Retry-After


def test_retry_submit_backoff_uses_full_jitter(clock, monkeypatch):
    monkeypatch.setattr(retry_module, "_random", lambda: 1.0)  # the top of each jitter range
    fake = FakeClient(*[TransportError("lost")] * 6)
    with pytest.raises(TransportError):
        orbit.retry_submit(fake, QID, "k", {"payload": 1}, attempts=6, deadline=1000, base_delay=0.5, max_delay=3)
    assert clock["waits"] == [0.5, 1.0, 2.0, 3.0, 3.0] and len(fake.calls) == 6
    monkeypatch.setattr(retry_module, "_random", lambda: 0.0)
    clock["waits"].clear()
    with pytest.raises(APIError):
        orbit.retry_submit(FakeClient(full(2.0), full(2.0)), QID, "k", {"payload": 1}, attempts=2)
    assert clock["waits"] == [2.0]  # max(retry_after, jittered backoff)


def test_retry_submit_stops_at_the_deadline(clock):
    fake = FakeClient(*[full()] * 100)
    with pytest.raises(APIError) as exc:
        orbit.retry_submit(fake, QID, "k", {"payload": 1}, attempts=100, deadline=5.5, base_delay=0)
    assert exc.value.code == "QUEUE_FULL"
    assert clock["waits"] == [1.0] * 5 and len(fake.calls) == 6  # the 6th wait would end past 5.5 s


def test_retry_submit_raises_other_errors_at_once(clock):
    for error in (APIError("STATE_CONFLICT", "retired", status_code=409), APIError("INVALID_ARGUMENT", "x",
                                                                                   status_code=400)):
        fake = FakeClient(error)
        with pytest.raises(APIError) as exc:
            orbit.retry_submit(fake, QID, "k", {"payload": 1})
        assert exc.value is error and len(fake.calls) == 1 and clock["waits"] == []
    for bad in ({"attempts": 0}, {"deadline": 0}, {"base_delay": -1}, {"max_delay": -1}, {"attempts": True}):
        with pytest.raises(ValueError):
            orbit.retry_submit(FakeClient(), QID, "k", {"payload": 1}, **bad)


@pytest.mark.anyio
async def test_aretry_submit_bounds(monkeypatch):
    waits: list[float] = []

    async def asleep(seconds):
        waits.append(seconds)

    class AsyncFake(FakeClient):
        async def submit_task(self, queue_id, key, request):
            return FakeClient.submit_task(self, queue_id, key, request)

    monkeypatch.setattr(retry_module, "_asleep", asleep)
    fake = AsyncFake(full(), TransportError("lost"))
    assert await orbit.aretry_submit(fake, QID, "k", {"payload": 1}) == "accepted"
    assert len(fake.calls) == 3 and len(waits) == 2 and waits[0] >= 1.0
    with pytest.raises(APIError):
        await orbit.aretry_submit(AsyncFake(*[full()] * 3), QID, "k", {"payload": 1}, attempts=3)
    assert len(waits) == 4
