"""`Client` and `AsyncClient`: one typed method per HTTP endpoint.

Both clients share one request-building layer (`_Builder`): every method first
builds a `_Call` — the `HTTPRequest` plus how to read its answer — and then a
thin executor sends it, synchronously (`Client`) or with asyncio
(`AsyncClient`). Validation that can be done locally (idempotency keys, ids,
page sizes, request models) happens while building, so mistakes raise
`ValueError`/`TypeError` before anything is sent.

Request models are serialized with `model_dump(mode="json", exclude_unset=True)`:
optional fields you did not set are not sent, so the server's idempotency
digest of a request stays the same across SDK versions. The SDK never resends a
business write by itself; see `orbit.retry_submit` for the explicit helper.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from .._rules import is_idempotency_key
from ..models import (
    Application,
    Attempt,
    AttemptPage,
    AuditRecord,
    AuditRecordPage,
    CallerCredential,
    Event,
    EventPage,
    BatchSubmitResult,
    CancelTaskRequest,
    ConfigureApplicationRequest,
    ConfigureApplicationResult,
    ConfigureQueueRequest,
    ConfigureResourceKeyRequest,
    ConfigureScheduleRequest,
    CreateQueueRequest,
    CreateQueueResult,
    CreateResourceKeyRequest,
    CreateResourceKeyResult,
    CreateScheduleRequest,
    CreateScheduleResult,
    Queue,
    QueuePage,
    QueueThroughput,
    QueueUsage,
    ResourceKey,
    ResourceKeyPage,
    RetireQueueRequest,
    RetireResourceKeyRequest,
    RetireScheduleRequest,
    ReviewTaskRequest,
    Schedule,
    SchedulePage,
    ScheduleRun,
    ScheduleRunPage,
    SubmitTaskItem,
    SubmitTaskRequest,
    SubmitTaskResult,
    Task,
    TaskBlockers,
    TaskPage,
    TaskState,
)
from .errors import APIError
from .transport import AsyncTransport, HTTPRequest, Reply, SyncTransport, encode_json

__all__ = ["DEFAULT_TIMEOUT", "MAX_BATCH_ITEMS", "MAX_PAGE_SIZE", "AsyncClient", "Client"]

DEFAULT_TIMEOUT = 10.0
MAX_PAGE_SIZE = 1000
MAX_BATCH_ITEMS = 500
UINT64_MAX = (1 << 64) - 1

_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
_TOKEN_RE = re.compile(r"^[\x21-\x7e]{1,4096}\Z")

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def _sdk_version() -> str:
    try:
        return metadata.version("orbit-tasks")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"


USER_AGENT = f"orbit-python/{_sdk_version()} httpx/{httpx.__version__}"


# ---------------------------------------------------------------- local validation


def _check_key(key: str) -> str:
    if not isinstance(key, str) or not is_idempotency_key(key):
        raise ValueError("idempotency key must be 1-128 visible ASCII characters (0x21-0x7E)")
    return key


def _segment(value: str, what: str) -> str:
    """A path parameter: non-empty, URL-safe characters only (ids are 32 hex characters)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not _ID_RE.match(value):
        raise ValueError(f"{what} must be an id such as '0123456789abcdef0123456789abcdef', got {value!r}")
    return quote(value, safe="")


def _revision(value: int | str) -> str:
    """`expected_revision` as the decimal string the API wants; accepts int or str."""
    if isinstance(value, bool):
        raise TypeError("expected_revision must be an int or a decimal string, not bool")
    if isinstance(value, int):
        if not 1 <= value <= UINT64_MAX:
            raise ValueError("expected_revision must be a non-zero uint64")
        return str(value)
    if isinstance(value, str):
        return value  # the request model checks the format
    raise TypeError(f"expected_revision must be an int or a decimal string, not {type(value).__name__}")


def _page_size(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be an integer between 1 and {MAX_PAGE_SIZE}")
    return value


def _timestamp(value: datetime | str, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{what} must be timezone-aware (e.g. datetime.now(timezone.utc))")
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    raise TypeError(f"{what} must be a datetime or an RFC 3339 string, not {type(value).__name__}")


def _states(value: TaskState | str | Iterable[TaskState | str] | None) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    return [TaskState(s).value for s in items]  # ValueError on an unknown state


def _model(cls: type[M], value: M | Mapping[str, Any], what: str) -> M:
    """Accept the request model itself or a mapping of its fields (validated the same way)."""
    if type(value) is cls:
        return value
    if isinstance(value, BaseModel):
        raise TypeError(f"{what} must be a {cls.__name__}, not {type(value).__name__}")
    if isinstance(value, Mapping):
        fields = dict(value)
        if "expected_revision" in fields:
            fields["expected_revision"] = _revision(fields["expected_revision"])
        return cls.model_validate(fields)
    raise TypeError(f"{what} must be a {cls.__name__} or a mapping, not {type(value).__name__}")


def _body(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True)


# ---------------------------------------------------------------- the request-building layer


@dataclass(frozen=True)
class _Call(Generic[T]):
    """A built request plus the function that turns its `Reply` into the typed result."""

    request: HTTPRequest
    parse: Callable[[Reply], T]


def _as(model: type[M]) -> Callable[[Reply], M]:
    def parse(reply: Reply) -> M:
        try:
            return model.model_validate(reply.data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "data"
            raise APIError(
                "INTERNAL",
                f"the server's answer (HTTP {reply.status_code}) does not match {model.__name__}: "
                f"{where}: {first.get('msg')}",
                status_code=reply.status_code,
                request_id=reply.request_id,
            ) from exc

    return parse


def _as_dict(reply: Reply) -> dict[str, Any]:
    if not isinstance(reply.data, dict):
        raise APIError("INTERNAL", "the server's answer is not a JSON object", status_code=reply.status_code,
                       request_id=reply.request_id)
    return reply.data


def _get(path: str, parse: Callable[[Reply], T], params: Iterable[tuple[str, str]] = ()) -> _Call[T]:
    return _Call(HTTPRequest("GET", path, tuple(params)), parse)


def _post(path: str, key: str, body: dict[str, Any], parse: Callable[[Reply], T]) -> _Call[T]:
    headers = (("Idempotency-Key", _check_key(key)), ("Content-Type", "application/json"))
    return _Call(HTTPRequest("POST", path, (), encode_json(body), headers), parse)


def _paging(page_size: int, cursor: str | None) -> list[tuple[str, str]]:
    params = [("limit", str(_page_size(page_size)))]
    if cursor is not None:
        if not isinstance(cursor, str) or not cursor:
            raise ValueError("cursor must be a non-empty string returned as next_cursor")
        params.append(("cursor", cursor))
    return params


class _Builder:
    """Builds every endpoint's `_Call`; shared by `Client` and `AsyncClient`."""

    @staticmethod
    def health() -> _Call[dict[str, Any]]:
        return _get("/healthz", _as_dict)

    @staticmethod
    def ready() -> _Call[dict[str, Any]]:
        return _get("/readyz", _as_dict)

    @staticmethod
    def create_queue(key: str, request: CreateQueueRequest | Mapping[str, Any]) -> _Call[CreateQueueResult]:
        body = _body(_model(CreateQueueRequest, request, "request"))
        return _post("/v1/queues", key, body, _as(CreateQueueResult))

    @staticmethod
    def get_queue(queue_id: str) -> _Call[Queue]:
        return _get(f"/v1/queues/{_segment(queue_id, 'queue_id')}", _as(Queue))

    @staticmethod
    def get_queue_usage(queue_id: str) -> _Call[QueueUsage]:
        return _get(f"/v1/queues/{_segment(queue_id, 'queue_id')}/usage", _as(QueueUsage))

    @staticmethod
    def get_queue_throughput(queue_id: str, minutes: int) -> _Call[QueueThroughput]:
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 60:
            raise ValueError("minutes must be an integer between 1 and 60")
        return _get(f"/v1/queues/{_segment(queue_id, 'queue_id')}/throughput", _as(QueueThroughput),
                    [("minutes", str(minutes))])

    @staticmethod
    def list_queues_page(
        name: str | None, include_retired: bool, page_size: int, cursor: str | None
    ) -> _Call[QueuePage]:
        params = _paging(page_size, cursor)
        if name is not None:
            params.append(("name", name))
        if include_retired:
            params.append(("include_retired", "true"))
        return _get("/v1/queues", _as(QueuePage), params)

    @staticmethod
    def configure_queue(
        queue_id: str, key: str, request: ConfigureQueueRequest | Mapping[str, Any]
    ) -> _Call[CreateQueueResult]:
        path = f"/v1/queues/{_segment(queue_id, 'queue_id')}:configure"
        return _post(path, key, _body(_model(ConfigureQueueRequest, request, "request")), _as(CreateQueueResult))

    @staticmethod
    def retire_queue(queue_id: str, key: str, expected_revision: int | str, reason: str) -> _Call[CreateQueueResult]:
        path = f"/v1/queues/{_segment(queue_id, 'queue_id')}:retire"
        body = _body(RetireQueueRequest(expected_revision=_revision(expected_revision), reason=reason))
        return _post(path, key, body, _as(CreateQueueResult))

    @staticmethod
    def get_credential() -> _Call[CallerCredential]:
        return _get("/v1/credential", _as(CallerCredential))

    @staticmethod
    def get_application(application_id: str) -> _Call[Application]:
        return _get(f"/v1/applications/{_segment(application_id, 'application_id')}", _as(Application))

    @staticmethod
    def configure_application(
        application_id: str, key: str, request: ConfigureApplicationRequest | Mapping[str, Any]
    ) -> _Call[ConfigureApplicationResult]:
        path = f"/v1/applications/{_segment(application_id, 'application_id')}:configure"
        body = _body(_model(ConfigureApplicationRequest, request, "request"))
        return _post(path, key, body, _as(ConfigureApplicationResult))

    @staticmethod
    def create_resource_key(
        key: str, request: CreateResourceKeyRequest | Mapping[str, Any]
    ) -> _Call[CreateResourceKeyResult]:
        body = _body(_model(CreateResourceKeyRequest, request, "request"))
        return _post("/v1/resource-keys", key, body, _as(CreateResourceKeyResult))

    @staticmethod
    def get_resource_key(resource_key_id: str) -> _Call[ResourceKey]:
        return _get(f"/v1/resource-keys/{_segment(resource_key_id, 'resource_key_id')}", _as(ResourceKey))

    @staticmethod
    def list_resource_keys_page(
        name: str | None, include_retired: bool, page_size: int, cursor: str | None
    ) -> _Call[ResourceKeyPage]:
        params = _paging(page_size, cursor)
        if name is not None:
            params.append(("name", name))
        if include_retired:
            params.append(("include_retired", "true"))
        return _get("/v1/resource-keys", _as(ResourceKeyPage), params)

    @staticmethod
    def configure_resource_key(
        resource_key_id: str, key: str, request: ConfigureResourceKeyRequest | Mapping[str, Any]
    ) -> _Call[CreateResourceKeyResult]:
        path = f"/v1/resource-keys/{_segment(resource_key_id, 'resource_key_id')}:configure"
        body = _body(_model(ConfigureResourceKeyRequest, request, "request"))
        return _post(path, key, body, _as(CreateResourceKeyResult))

    @staticmethod
    def retire_resource_key(
        resource_key_id: str, key: str, expected_revision: int | str, reason: str
    ) -> _Call[CreateResourceKeyResult]:
        path = f"/v1/resource-keys/{_segment(resource_key_id, 'resource_key_id')}:retire"
        body = _body(RetireResourceKeyRequest(expected_revision=_revision(expected_revision), reason=reason))
        return _post(path, key, body, _as(CreateResourceKeyResult))

    @staticmethod
    def create_schedule(key: str, request: CreateScheduleRequest | Mapping[str, Any]) -> _Call[CreateScheduleResult]:
        body = _body(_model(CreateScheduleRequest, request, "request"))
        return _post("/v1/schedules", key, body, _as(CreateScheduleResult))

    @staticmethod
    def get_schedule(schedule_id: str) -> _Call[Schedule]:
        return _get(f"/v1/schedules/{_segment(schedule_id, 'schedule_id')}", _as(Schedule))

    @staticmethod
    def list_schedules_page(
        queue_id: str | None, name: str | None, include_retired: bool, page_size: int, cursor: str | None
    ) -> _Call[SchedulePage]:
        params = _paging(page_size, cursor)
        if queue_id is not None:
            params.append(("queue_id", queue_id))
        if name is not None:
            params.append(("name", name))
        if include_retired:
            params.append(("include_retired", "true"))
        return _get("/v1/schedules", _as(SchedulePage), params)

    @staticmethod
    def configure_schedule(
        schedule_id: str, key: str, request: ConfigureScheduleRequest | Mapping[str, Any]
    ) -> _Call[CreateScheduleResult]:
        path = f"/v1/schedules/{_segment(schedule_id, 'schedule_id')}:configure"
        body = _body(_model(ConfigureScheduleRequest, request, "request"))
        return _post(path, key, body, _as(CreateScheduleResult))

    @staticmethod
    def retire_schedule(
        schedule_id: str, key: str, expected_revision: int | str, reason: str
    ) -> _Call[CreateScheduleResult]:
        path = f"/v1/schedules/{_segment(schedule_id, 'schedule_id')}:retire"
        body = _body(RetireScheduleRequest(expected_revision=_revision(expected_revision), reason=reason))
        return _post(path, key, body, _as(CreateScheduleResult))

    @staticmethod
    def list_schedule_runs_page(schedule_id: str, page_size: int, cursor: str | None) -> _Call[ScheduleRunPage]:
        path = f"/v1/schedules/{_segment(schedule_id, 'schedule_id')}/runs"
        return _get(path, _as(ScheduleRunPage), _paging(page_size, cursor))

    @staticmethod
    def submit_task(queue_id: str, key: str, request: SubmitTaskRequest | Mapping[str, Any]) -> _Call[SubmitTaskResult]:
        path = f"/v1/queues/{_segment(queue_id, 'queue_id')}/tasks"
        return _post(path, key, _body(_model(SubmitTaskRequest, request, "request")), _as(SubmitTaskResult))

    @staticmethod
    def submit_tasks(
        queue_id: str, key: str, items: Iterable[SubmitTaskItem | Mapping[str, Any]]
    ) -> _Call[BatchSubmitResult]:
        if isinstance(items, (str, bytes, Mapping, BaseModel)):
            raise TypeError("items must be a list of SubmitTaskItem")
        tasks = [_body(_model(SubmitTaskItem, item, f"items[{i}]")) for i, item in enumerate(items)]
        if not 1 <= len(tasks) <= MAX_BATCH_ITEMS:
            raise ValueError(f"a batch holds 1-{MAX_BATCH_ITEMS} items, got {len(tasks)}")
        path = f"/v1/queues/{_segment(queue_id, 'queue_id')}/tasks:batch"
        return _post(path, key, {"tasks": tasks}, _as(BatchSubmitResult))

    @staticmethod
    def get_task(task_id: str) -> _Call[Task]:
        return _get(f"/v1/tasks/{_segment(task_id, 'task_id')}", _as(Task))

    @staticmethod
    def get_task_blockers(task_id: str) -> _Call[TaskBlockers]:
        return _get(f"/v1/tasks/{_segment(task_id, 'task_id')}/blockers", _as(TaskBlockers))

    @staticmethod
    def list_tasks_page(
        queue_id: str,
        state: TaskState | str | Iterable[TaskState | str] | None,
        schedule_id: str | None,
        created_after: datetime | str | None,
        created_before: datetime | str | None,
        page_size: int,
        cursor: str | None,
    ) -> _Call[TaskPage]:
        path = f"/v1/queues/{_segment(queue_id, 'queue_id')}/tasks"
        params = _paging(page_size, cursor)
        params.extend(("state", s) for s in _states(state))
        if schedule_id is not None:
            params.append(("schedule_id", schedule_id))
        if created_after is not None:
            params.append(("created_after", _timestamp(created_after, "created_after")))
        if created_before is not None:
            params.append(("created_before", _timestamp(created_before, "created_before")))
        return _get(path, _as(TaskPage), params)

    @staticmethod
    def list_attempts_page(task_id: str, page_size: int, cursor: str | None) -> _Call[AttemptPage]:
        path = f"/v1/tasks/{_segment(task_id, 'task_id')}/attempts"
        return _get(path, _as(AttemptPage), _paging(page_size, cursor))

    @staticmethod
    def cancel_task(task_id: str, key: str, reason: str) -> _Call[SubmitTaskResult]:
        path = f"/v1/tasks/{_segment(task_id, 'task_id')}:cancel"
        return _post(path, key, _body(CancelTaskRequest(reason=reason)), _as(SubmitTaskResult))

    @staticmethod
    def review_task(
        task_id: str, key: str, resolution: str, reason: str, evidence: dict[str, Any] | None
    ) -> _Call[SubmitTaskResult]:
        path = f"/v1/tasks/{_segment(task_id, 'task_id')}:review"
        fields: dict[str, Any] = {"resolution": resolution, "reason": reason}
        if evidence is not None:
            fields["evidence"] = evidence
        return _post(path, key, _body(ReviewTaskRequest(**fields)), _as(SubmitTaskResult))

    @staticmethod
    def list_audit_records_page(
        resource_id: str | None, action: str | None, after: str | None, page_size: int
    ) -> _Call[AuditRecordPage]:
        params = [("limit", str(_page_size(page_size)))]
        for name, value in (("resource_id", resource_id), ("after", after)):
            if value is not None:
                _segment(value, name)  # an id, checked like a path parameter
                params.append((name, value))
        if action is not None:
            if not isinstance(action, str) or not action:
                raise ValueError("action must be a non-empty str such as 'queue.configure'")
            params.append(("action", action))
        return _get("/v1/audit-records", _as(AuditRecordPage), params)

    @staticmethod
    def events_page(after: int | str, types: Sequence[str] | None, wait_ms: int, limit: int) -> _Call[EventPage]:
        cursor = str(after)
        if not cursor.isdigit():
            raise ValueError("after must be a seq: a non-negative integer or its decimal string")
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or not 0 <= wait_ms <= 30_000:
            raise ValueError("wait_ms must be an int from 0 to 30000")
        params = [("after", cursor), ("limit", str(_page_size(limit))), ("wait_ms", str(wait_ms))]
        for t in types or ():
            if not isinstance(t, str) or not t:
                raise ValueError("types must be event types such as 'task.succeeded' or 'schedule.*'")
            params.append(("type", t))
        return _get("/v1/events", _as(EventPage), params)


def _stuck_cursor(request: HTTPRequest) -> APIError:
    return APIError("INTERNAL", f"{request.describe()}: the server returned the same cursor twice", status_code=200)


# ---------------------------------------------------------------- configuration shared by both clients


def _read_credentials(path: str) -> dict[str, Any]:
    """The credentials file's fields, its "token" checked and stripped."""
    try:
        with open(path, "rb") as f:
            creds = json.loads(f.read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"ORBIT_CREDENTIALS_FILE {path!r} cannot be read as JSON: {type(exc).__name__}") from None
    token = creds.get("token") if isinstance(creds, dict) else None
    if not isinstance(token, str) or not token.strip():
        raise ValueError(f"ORBIT_CREDENTIALS_FILE {path!r} has no \"token\" string")
    return {**creds, "token": token.strip()}


def _credentials_token(path: str) -> str:
    return _read_credentials(path)["token"]


def _env_settings() -> tuple[str, str | None]:
    url = os.environ.get("ORBIT_URL", "").strip()
    if not url:
        raise ValueError("ORBIT_URL is not set (e.g. http://127.0.0.1:8080)")
    creds_file = os.environ.get("ORBIT_CREDENTIALS_FILE", "").strip()
    if creds_file:
        return url, _credentials_token(creds_file)
    token = os.environ.get("ORBIT_TOKEN", "").strip()
    return url, token or None


class _ClientBase:
    """Constructor, configuration and `repr` shared by `Client` and `AsyncClient`."""

    _build = _Builder

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(url, str):
            raise TypeError("url must be a str such as 'http://127.0.0.1:8080'")
        try:
            parsed = httpx.URL(url.strip())
        except httpx.InvalidURL as exc:
            raise ValueError(f"url is not a valid URL: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError(f"url must be an http:// or https:// URL with a host, got {url!r}")
        if parsed.port is not None and not 0 < parsed.port < 65536:
            raise ValueError(f"url has an invalid port: {url!r}")
        if parsed.query or parsed.fragment:
            raise ValueError("url must not carry a query or a fragment")
        if token is not None and (not isinstance(token, str) or not _TOKEN_RE.match(token)):
            raise ValueError("token must be a non-empty string of visible ASCII characters")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float, httpx.Timeout)):
            raise TypeError("timeout must be a number of seconds or an httpx.Timeout")
        if isinstance(timeout, (int, float)) and timeout <= 0:
            raise ValueError("timeout must be positive")
        self.base_url = str(parsed).rstrip("/")
        self.timeout = timeout
        self._token = token
        merged = {"Accept": "application/json", "User-Agent": USER_AGENT}
        merged.update(headers or {})
        if token is not None:
            merged["Authorization"] = f"Bearer {token}"
        self._headers = merged

    @property
    def token(self) -> str | None:
        """The bearer token (kept out of `repr`, errors and logs)."""
        return self._token

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.base_url!r})"


# ---------------------------------------------------------------- the synchronous client


class Client(_ClientBase):
    """Blocking client for the Orbit HTTP API; one typed method per endpoint.

    Use it as a context manager (`with Client(url, token=...) as client:`) or
    call `close()`. Non-2xx answers raise `orbit.APIError`; a request whose
    answer never arrived raises `orbit.TransportError` (its outcome is unknown:
    resend the same command with the same idempotency key to find out).
    `transport` accepts any `httpx.BaseTransport`, e.g. for tests. `base_url`,
    `timeout` and `token` are readable attributes (the token never appears in
    `repr` or in error messages).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(url, token=token, timeout=timeout, headers=headers)
        self._transport = SyncTransport(self.base_url, headers=self._headers, timeout=timeout, transport=transport)

    @classmethod
    def from_env(cls, **kwargs: Any) -> Client:
        """Build a client from `ORBIT_URL` plus `ORBIT_CREDENTIALS_FILE` (its "token") or `ORBIT_TOKEN`."""
        url, token = _env_settings()
        return cls(url, token=token, **kwargs)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool; the client cannot be used afterwards."""
        self._transport.close()

    def _run(self, call: _Call[T]) -> T:
        return call.parse(self._transport.send(call.request))

    def _iterate(self, call: _Call[Any], build: Callable[[str], _Call[Any]]) -> Iterator[Any]:
        cursor: str | None = None
        while True:
            page = self._run(call)
            yield from page.items
            if not page.next_cursor:
                return
            if page.next_cursor == cursor:
                raise _stuck_cursor(call.request)
            cursor = page.next_cursor
            call = build(cursor)

    def _iterate_after(self, call: _Call[Any], build: Callable[[str], _Call[Any]], page_size: int) -> Iterator[Any]:
        """Pages that resume after the last item (`next_after`); a short page is the last one."""
        while True:
            page = self._run(call)
            yield from page.items
            if len(page.items) < page_size or not page.next_after:
                return
            call = build(page.next_after)

    # -- health

    def health(self) -> dict[str, Any]:
        """`GET /healthz`: the node's process is up (no authentication needed)."""
        return self._run(self._build.health())

    def ready(self) -> dict[str, Any]:
        """`GET /readyz`: the database answers and the schema is current; raises `APIError` (UNAVAILABLE) if not."""
        return self._run(self._build.ready())

    # -- queues

    def create_queue(self, key: str, request: CreateQueueRequest | Mapping[str, Any]) -> CreateQueueResult:
        """Create a queue (`POST /v1/queues`); resending the same key and content returns the original receipt."""
        return self._run(self._build.create_queue(key, request))

    def get_queue(self, queue_id: str) -> Queue:
        """Read a queue with its live backlog (`unfinished_tasks`)."""
        return self._run(self._build.get_queue(queue_id))

    def get_queue_usage(self, queue_id: str) -> QueueUsage:
        """A queue's live usage at the database clock: tasks per state, permits held (`in_flight`), the
        current one-second rate window (None when none is open) and the worker nodes active on it."""
        return self._run(self._build.get_queue_usage(queue_id))

    def get_queue_throughput(self, queue_id: str, minutes: int = 10) -> QueueThroughput:
        """A queue's throughput over the last `minutes` (1-60): its cumulative counters (`totals`:
        Starts authorized, tasks ended SUCCEEDED, tasks ended FAILED) and what it counted in each
        5-second bucket (`points`, oldest first, the last one still running)."""
        return self._run(self._build.get_queue_throughput(queue_id, minutes))

    def list_queues(
        self, name: str | None = None, include_retired: bool = False, page_size: int = 100
    ) -> Iterator[Queue]:
        """Iterate over every queue of the namespace in creation order, fetching pages lazily."""
        first = self._build.list_queues_page(name, include_retired, page_size, None)  # bad arguments fail now
        return self._iterate(first, lambda c: self._build.list_queues_page(name, include_retired, page_size, c))

    def list_queues_page(
        self, name: str | None = None, include_retired: bool = False, page_size: int = 100, cursor: str | None = None
    ) -> QueuePage:
        """One page of queues; pass its `next_cursor` back as `cursor` for the next one."""
        return self._run(self._build.list_queues_page(name, include_retired, page_size, cursor))

    def configure_queue(
        self, queue_id: str, key: str, request: ConfigureQueueRequest | Mapping[str, Any]
    ) -> CreateQueueResult:
        """Replace every control of a queue at once, guarded by `expected_revision`."""
        return self._run(self._build.configure_queue(queue_id, key, request))

    def retire_queue(self, queue_id: str, key: str, expected_revision: int | str, reason: str) -> CreateQueueResult:
        """Retire a queue for good (it must hold no unfinished tasks); reads keep working."""
        return self._run(self._build.retire_queue(queue_id, key, expected_revision, reason))

    # -- applications

    def get_credential(self) -> CallerCredential:
        """What this client's token is: its application, namespace, permissions and queue scope."""
        return self._run(self._build.get_credential())

    def get_application(self, application_id: str) -> Application:
        """Read the application's quotas (shared by every queue) with their live usage."""
        return self._run(self._build.get_application(application_id))

    def configure_application(
        self, application_id: str, key: str, request: ConfigureApplicationRequest | Mapping[str, Any]
    ) -> ConfigureApplicationResult:
        """Replace every quota of the application at once, guarded by `expected_revision`."""
        return self._run(self._build.configure_application(application_id, key, request))

    # -- resource keys

    def create_resource_key(
        self, key: str, request: CreateResourceKeyRequest | Mapping[str, Any]
    ) -> CreateResourceKeyResult:
        """Create a resource key (`POST /v1/resource-keys`); resending the same key and content returns the
        original receipt."""
        return self._run(self._build.create_resource_key(key, request))

    def get_resource_key(self, resource_key_id: str) -> ResourceKey:
        """Read a resource key with its permits in use (`in_use`)."""
        return self._run(self._build.get_resource_key(resource_key_id))

    def list_resource_keys(
        self, name: str | None = None, include_retired: bool = False, page_size: int = 100
    ) -> Iterator[ResourceKey]:
        """Iterate over every resource key of the namespace in creation order, fetching pages lazily."""
        first = self._build.list_resource_keys_page(name, include_retired, page_size, None)  # bad arguments fail now
        return self._iterate(first, lambda c: self._build.list_resource_keys_page(name, include_retired, page_size, c))

    def list_resource_keys_page(
        self, name: str | None = None, include_retired: bool = False, page_size: int = 100, cursor: str | None = None
    ) -> ResourceKeyPage:
        """One page of resource keys; pass its `next_cursor` back as `cursor` for the next one."""
        return self._run(self._build.list_resource_keys_page(name, include_retired, page_size, cursor))

    def configure_resource_key(
        self, resource_key_id: str, key: str, request: ConfigureResourceKeyRequest | Mapping[str, Any]
    ) -> CreateResourceKeyResult:
        """Replace every control of a resource key at once, guarded by `expected_revision` (lowering
        `max_concurrency` revokes no permit already held)."""
        return self._run(self._build.configure_resource_key(resource_key_id, key, request))

    def retire_resource_key(
        self, resource_key_id: str, key: str, expected_revision: int | str, reason: str
    ) -> CreateResourceKeyResult:
        """Retire a resource key for good (no permit in use, no unfinished task naming it); reads keep working."""
        return self._run(self._build.retire_resource_key(resource_key_id, key, expected_revision, reason))

    # -- schedules

    def create_schedule(self, key: str, request: CreateScheduleRequest | Mapping[str, Any]) -> CreateScheduleResult:
        """Create a schedule (`POST /v1/schedules`) that generates tasks into its queue; resending the same key
        and content returns the original receipt."""
        return self._run(self._build.create_schedule(key, request))

    def get_schedule(self, schedule_id: str) -> Schedule:
        """Read a schedule with its next trigger point (`next_trigger_at`)."""
        return self._run(self._build.get_schedule(schedule_id))

    def list_schedules(
        self, queue_id: str | None = None, name: str | None = None, include_retired: bool = False,
        page_size: int = 100,
    ) -> Iterator[Schedule]:
        """Iterate over the schedules of the namespace (or of one queue) in creation order, fetching pages lazily."""
        first = self._build.list_schedules_page(queue_id, name, include_retired, page_size, None)  # fails now if bad
        return self._iterate(
            first, lambda c: self._build.list_schedules_page(queue_id, name, include_retired, page_size, c))

    def list_schedules_page(
        self, queue_id: str | None = None, name: str | None = None, include_retired: bool = False,
        page_size: int = 100, cursor: str | None = None,
    ) -> SchedulePage:
        """One page of schedules; pass its `next_cursor` back as `cursor` for the next one."""
        return self._run(self._build.list_schedules_page(queue_id, name, include_retired, page_size, cursor))

    def configure_schedule(
        self, schedule_id: str, key: str, request: ConfigureScheduleRequest | Mapping[str, Any]
    ) -> CreateScheduleResult:
        """Replace every field of a schedule but its name and queue at once, guarded by `expected_revision`
        (omitted fields take their defaults)."""
        return self._run(self._build.configure_schedule(schedule_id, key, request))

    def retire_schedule(
        self, schedule_id: str, key: str, expected_revision: int | str, reason: str
    ) -> CreateScheduleResult:
        """Retire a schedule for good: it generates no more tasks; reads keep working."""
        return self._run(self._build.retire_schedule(schedule_id, key, expected_revision, reason))

    def list_schedule_runs(self, schedule_id: str, page_size: int = 100) -> Iterator[ScheduleRun]:
        """Iterate over the trigger points a schedule handled (submitted or skipped), oldest first."""
        first = self._build.list_schedule_runs_page(schedule_id, page_size, None)
        return self._iterate(first, lambda c: self._build.list_schedule_runs_page(schedule_id, page_size, c))

    def list_schedule_runs_page(
        self, schedule_id: str, page_size: int = 100, cursor: str | None = None
    ) -> ScheduleRunPage:
        """One page of a schedule's run records."""
        return self._run(self._build.list_schedule_runs_page(schedule_id, page_size, cursor))

    # -- tasks

    def submit_task(self, queue_id: str, key: str, request: SubmitTaskRequest | Mapping[str, Any]) -> SubmitTaskResult:
        """Submit one task; `key` is the task's identity (a resend returns the original receipt)."""
        return self._run(self._build.submit_task(queue_id, key, request))

    def submit_tasks(
        self, queue_id: str, key: str, items: Iterable[SubmitTaskItem | Mapping[str, Any]]
    ) -> BatchSubmitResult:
        """Submit 1-500 tasks in one transaction; each item is admitted or rejected on its own (`results[i]`)."""
        return self._run(self._build.submit_tasks(queue_id, key, items))

    def get_task(self, task_id: str) -> Task:
        """Read a task with its frozen policy, state and outcome."""
        return self._run(self._build.get_task(task_id))

    def get_task_blockers(self, task_id: str) -> TaskBlockers:
        """Why a task is not running now: every control that holds it (layer, control, figures). Empty
        `blockers` for a due `WAITING` task means the next claim on its queue can take it; for any other
        state the list is empty and `state` tells where the task is."""
        return self._run(self._build.get_task_blockers(task_id))

    def list_tasks(
        self,
        queue_id: str,
        state: TaskState | str | Iterable[TaskState | str] | None = None,
        schedule_id: str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        page_size: int = 100,
    ) -> Iterator[Task]:
        """Iterate over a queue's tasks, newest first, optionally filtered; pages are fetched lazily."""
        states = _states(state)  # consumed once: `state` may be a generator
        args = (queue_id, states, schedule_id, created_after, created_before, page_size)
        first = self._build.list_tasks_page(*args, None)
        return self._iterate(first, lambda c: self._build.list_tasks_page(*args, c))

    def list_tasks_page(
        self,
        queue_id: str,
        state: TaskState | str | Iterable[TaskState | str] | None = None,
        schedule_id: str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        page_size: int = 100,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page of a queue's tasks; pass its `next_cursor` back as `cursor` for the next one."""
        return self._run(self._build.list_tasks_page(
            queue_id, state, schedule_id, created_after, created_before, page_size, cursor
        ))

    def list_attempts(self, task_id: str, page_size: int = 100) -> Iterator[Attempt]:
        """Iterate over a task's attempts in order, with any late evidence."""
        first = self._build.list_attempts_page(task_id, page_size, None)
        return self._iterate(first, lambda c: self._build.list_attempts_page(task_id, page_size, c))

    def list_attempts_page(self, task_id: str, page_size: int = 100, cursor: str | None = None) -> AttemptPage:
        """One page of a task's attempts."""
        return self._run(self._build.list_attempts_page(task_id, page_size, cursor))

    def cancel_task(self, task_id: str, key: str, reason: str) -> SubmitTaskResult:
        """Cancel a task: waiting/leased tasks end now, running ones get a cancel request."""
        return self._run(self._build.cancel_task(task_id, key, reason))

    def review_task(
        self, task_id: str, key: str, resolution: str, reason: str, evidence: dict[str, Any] | None = None
    ) -> SubmitTaskResult:
        """Resolve a `NEEDS_REVIEW` task as SUCCEEDED, FAILED or RETRY (the only way out of that state)."""
        return self._run(self._build.review_task(task_id, key, resolution, reason, evidence))

    # -- events

    def events(self, after: int | str = 0, types: Sequence[str] | None = None, wait_ms: int = 5000,
               limit: int = 100) -> Iterator[Event]:
        """Every event after `after`, in seq order, each once: long-polls (`wait_ms`, below the client's
        timeout) for newer ones and never ends by itself. Persist the last event's `seq` to resume."""
        call = self._build.events_page(after, types, wait_ms, limit)  # bad arguments fail now

        def follow(call: _Call[EventPage]) -> Iterator[Event]:
            while True:
                page = self._run(call)
                yield from page.items
                call = self._build.events_page(page.next_after, types, wait_ms, limit)

        return follow(call)

    def events_page(self, after: int | str = 0, types: Sequence[str] | None = None, wait_ms: int = 0,
                    limit: int = 100) -> EventPage:
        """One page of events; pass its `next_after` back as `after` (it also skips past other types)."""
        return self._run(self._build.events_page(after, types, wait_ms, limit))

    # -- audit

    def list_audit_records(
        self, resource_id: str | None = None, action: str | None = None, after: str | None = None,
        page_size: int = 100,
    ) -> Iterator[AuditRecord]:
        """Iterate over the namespace's audit records after `after` (an id), oldest first, optionally of one
        resource or one action; pages are fetched lazily until one comes back short."""
        first = self._build.list_audit_records_page(resource_id, action, after, page_size)  # bad arguments fail now
        return self._iterate_after(
            first, lambda a: self._build.list_audit_records_page(resource_id, action, a, page_size), page_size)

    def list_audit_records_page(
        self, resource_id: str | None = None, action: str | None = None, after: str | None = None,
        page_size: int = 100,
    ) -> AuditRecordPage:
        """One page of audit records; pass its `next_after` back as `after` for the next one."""
        return self._run(self._build.list_audit_records_page(resource_id, action, after, page_size))


# ---------------------------------------------------------------- the asyncio client


class AsyncClient(_ClientBase):
    """The asyncio twin of `Client`: the same methods, awaited; list methods return async iterators.

    Use `async with AsyncClient(url, token=...) as client:` or `await aclose()`.
    `transport` accepts any `httpx.AsyncBaseTransport`, e.g. `httpx.ASGITransport`.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(url, token=token, timeout=timeout, headers=headers)
        self._transport = AsyncTransport(self.base_url, headers=self._headers, timeout=timeout, transport=transport)

    @classmethod
    def from_env(cls, **kwargs: Any) -> AsyncClient:
        """Build a client from `ORBIT_URL` plus `ORBIT_CREDENTIALS_FILE` (its "token") or `ORBIT_TOKEN`."""
        url, token = _env_settings()
        return cls(url, token=token, **kwargs)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool; the client cannot be used afterwards."""
        await self._transport.aclose()

    async def _run(self, call: _Call[T]) -> T:
        return call.parse(await self._transport.send(call.request))

    async def _iterate(self, call: _Call[Any], build: Callable[[str], _Call[Any]]) -> AsyncIterator[Any]:
        cursor: str | None = None
        while True:
            page = await self._run(call)
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            if page.next_cursor == cursor:
                raise _stuck_cursor(call.request)
            cursor = page.next_cursor
            call = build(cursor)

    async def _iterate_after(
        self, call: _Call[Any], build: Callable[[str], _Call[Any]], page_size: int
    ) -> AsyncIterator[Any]:
        while True:
            page = await self._run(call)
            for item in page.items:
                yield item
            if len(page.items) < page_size or not page.next_after:
                return
            call = build(page.next_after)

    # -- health

    async def health(self) -> dict[str, Any]:
        return await self._run(self._build.health())

    async def ready(self) -> dict[str, Any]:
        return await self._run(self._build.ready())

    # -- queues

    async def create_queue(self, key: str, request: CreateQueueRequest | Mapping[str, Any]) -> CreateQueueResult:
        return await self._run(self._build.create_queue(key, request))

    async def get_queue(self, queue_id: str) -> Queue:
        return await self._run(self._build.get_queue(queue_id))

    async def get_queue_usage(self, queue_id: str) -> QueueUsage:
        return await self._run(self._build.get_queue_usage(queue_id))

    async def get_queue_throughput(self, queue_id: str, minutes: int = 10) -> QueueThroughput:
        return await self._run(self._build.get_queue_throughput(queue_id, minutes))

    def list_queues(
        self, name: str | None = None, include_retired: bool = False, page_size: int = 100
    ) -> AsyncIterator[Queue]:
        first = self._build.list_queues_page(name, include_retired, page_size, None)  # bad arguments fail now
        return self._iterate(first, lambda c: self._build.list_queues_page(name, include_retired, page_size, c))

    async def list_queues_page(
        self, name: str | None = None, include_retired: bool = False, page_size: int = 100, cursor: str | None = None
    ) -> QueuePage:
        return await self._run(self._build.list_queues_page(name, include_retired, page_size, cursor))

    async def configure_queue(
        self, queue_id: str, key: str, request: ConfigureQueueRequest | Mapping[str, Any]
    ) -> CreateQueueResult:
        return await self._run(self._build.configure_queue(queue_id, key, request))

    async def retire_queue(
        self, queue_id: str, key: str, expected_revision: int | str, reason: str
    ) -> CreateQueueResult:
        return await self._run(self._build.retire_queue(queue_id, key, expected_revision, reason))

    # -- applications

    async def get_credential(self) -> CallerCredential:
        return await self._run(self._build.get_credential())

    async def get_application(self, application_id: str) -> Application:
        return await self._run(self._build.get_application(application_id))

    async def configure_application(
        self, application_id: str, key: str, request: ConfigureApplicationRequest | Mapping[str, Any]
    ) -> ConfigureApplicationResult:
        return await self._run(self._build.configure_application(application_id, key, request))

    # -- resource keys

    async def create_resource_key(
        self, key: str, request: CreateResourceKeyRequest | Mapping[str, Any]
    ) -> CreateResourceKeyResult:
        return await self._run(self._build.create_resource_key(key, request))

    async def get_resource_key(self, resource_key_id: str) -> ResourceKey:
        return await self._run(self._build.get_resource_key(resource_key_id))

    def list_resource_keys(
        self, name: str | None = None, include_retired: bool = False, page_size: int = 100
    ) -> AsyncIterator[ResourceKey]:
        first = self._build.list_resource_keys_page(name, include_retired, page_size, None)  # bad arguments fail now
        return self._iterate(first, lambda c: self._build.list_resource_keys_page(name, include_retired, page_size, c))

    async def list_resource_keys_page(
        self, name: str | None = None, include_retired: bool = False, page_size: int = 100, cursor: str | None = None
    ) -> ResourceKeyPage:
        return await self._run(self._build.list_resource_keys_page(name, include_retired, page_size, cursor))

    async def configure_resource_key(
        self, resource_key_id: str, key: str, request: ConfigureResourceKeyRequest | Mapping[str, Any]
    ) -> CreateResourceKeyResult:
        return await self._run(self._build.configure_resource_key(resource_key_id, key, request))

    async def retire_resource_key(
        self, resource_key_id: str, key: str, expected_revision: int | str, reason: str
    ) -> CreateResourceKeyResult:
        return await self._run(self._build.retire_resource_key(resource_key_id, key, expected_revision, reason))

    # -- schedules

    async def create_schedule(
        self, key: str, request: CreateScheduleRequest | Mapping[str, Any]
    ) -> CreateScheduleResult:
        return await self._run(self._build.create_schedule(key, request))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._run(self._build.get_schedule(schedule_id))

    def list_schedules(
        self, queue_id: str | None = None, name: str | None = None, include_retired: bool = False,
        page_size: int = 100,
    ) -> AsyncIterator[Schedule]:
        first = self._build.list_schedules_page(queue_id, name, include_retired, page_size, None)  # fails now if bad
        return self._iterate(
            first, lambda c: self._build.list_schedules_page(queue_id, name, include_retired, page_size, c))

    async def list_schedules_page(
        self, queue_id: str | None = None, name: str | None = None, include_retired: bool = False,
        page_size: int = 100, cursor: str | None = None,
    ) -> SchedulePage:
        return await self._run(self._build.list_schedules_page(queue_id, name, include_retired, page_size, cursor))

    async def configure_schedule(
        self, schedule_id: str, key: str, request: ConfigureScheduleRequest | Mapping[str, Any]
    ) -> CreateScheduleResult:
        return await self._run(self._build.configure_schedule(schedule_id, key, request))

    async def retire_schedule(
        self, schedule_id: str, key: str, expected_revision: int | str, reason: str
    ) -> CreateScheduleResult:
        return await self._run(self._build.retire_schedule(schedule_id, key, expected_revision, reason))

    def list_schedule_runs(self, schedule_id: str, page_size: int = 100) -> AsyncIterator[ScheduleRun]:
        first = self._build.list_schedule_runs_page(schedule_id, page_size, None)
        return self._iterate(first, lambda c: self._build.list_schedule_runs_page(schedule_id, page_size, c))

    async def list_schedule_runs_page(
        self, schedule_id: str, page_size: int = 100, cursor: str | None = None
    ) -> ScheduleRunPage:
        return await self._run(self._build.list_schedule_runs_page(schedule_id, page_size, cursor))

    # -- tasks

    async def submit_task(
        self, queue_id: str, key: str, request: SubmitTaskRequest | Mapping[str, Any]
    ) -> SubmitTaskResult:
        return await self._run(self._build.submit_task(queue_id, key, request))

    async def submit_tasks(
        self, queue_id: str, key: str, items: Iterable[SubmitTaskItem | Mapping[str, Any]]
    ) -> BatchSubmitResult:
        return await self._run(self._build.submit_tasks(queue_id, key, items))

    async def get_task(self, task_id: str) -> Task:
        return await self._run(self._build.get_task(task_id))

    async def get_task_blockers(self, task_id: str) -> TaskBlockers:
        return await self._run(self._build.get_task_blockers(task_id))

    def list_tasks(
        self,
        queue_id: str,
        state: TaskState | str | Iterable[TaskState | str] | None = None,
        schedule_id: str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[Task]:
        states = _states(state)  # consumed once: `state` may be a generator
        args = (queue_id, states, schedule_id, created_after, created_before, page_size)
        first = self._build.list_tasks_page(*args, None)
        return self._iterate(first, lambda c: self._build.list_tasks_page(*args, c))

    async def list_tasks_page(
        self,
        queue_id: str,
        state: TaskState | str | Iterable[TaskState | str] | None = None,
        schedule_id: str | None = None,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        page_size: int = 100,
        cursor: str | None = None,
    ) -> TaskPage:
        return await self._run(self._build.list_tasks_page(
            queue_id, state, schedule_id, created_after, created_before, page_size, cursor
        ))

    def list_attempts(self, task_id: str, page_size: int = 100) -> AsyncIterator[Attempt]:
        first = self._build.list_attempts_page(task_id, page_size, None)
        return self._iterate(first, lambda c: self._build.list_attempts_page(task_id, page_size, c))

    async def list_attempts_page(self, task_id: str, page_size: int = 100, cursor: str | None = None) -> AttemptPage:
        return await self._run(self._build.list_attempts_page(task_id, page_size, cursor))

    async def cancel_task(self, task_id: str, key: str, reason: str) -> SubmitTaskResult:
        return await self._run(self._build.cancel_task(task_id, key, reason))

    async def review_task(
        self, task_id: str, key: str, resolution: str, reason: str, evidence: dict[str, Any] | None = None
    ) -> SubmitTaskResult:
        return await self._run(self._build.review_task(task_id, key, resolution, reason, evidence))

    # -- events

    def events(self, after: int | str = 0, types: Sequence[str] | None = None, wait_ms: int = 5000,
               limit: int = 100) -> AsyncIterator[Event]:
        call = self._build.events_page(after, types, wait_ms, limit)  # bad arguments fail now

        async def follow(call: _Call[EventPage]) -> AsyncIterator[Event]:
            while True:
                page = await self._run(call)
                for item in page.items:
                    yield item
                call = self._build.events_page(page.next_after, types, wait_ms, limit)

        return follow(call)

    async def events_page(self, after: int | str = 0, types: Sequence[str] | None = None, wait_ms: int = 0,
                          limit: int = 100) -> EventPage:
        return await self._run(self._build.events_page(after, types, wait_ms, limit))

    # -- audit

    def list_audit_records(
        self, resource_id: str | None = None, action: str | None = None, after: str | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[AuditRecord]:
        first = self._build.list_audit_records_page(resource_id, action, after, page_size)  # bad arguments fail now
        return self._iterate_after(
            first, lambda a: self._build.list_audit_records_page(resource_id, action, a, page_size), page_size)

    async def list_audit_records_page(
        self, resource_id: str | None = None, action: str | None = None, after: str | None = None,
        page_size: int = 100,
    ) -> AuditRecordPage:
        return await self._run(self._build.list_audit_records_page(resource_id, action, after, page_size))


def _share_docstrings() -> None:
    """The async twins say the same as the sync methods (awaitable / async-iterable)."""
    for name, member in vars(AsyncClient).items():
        if name.startswith("_") or getattr(member, "__doc__", None):
            continue
        sync = getattr(Client, name, None)
        if sync is not None and sync.__doc__ and callable(member):
            member.__doc__ = sync.__doc__


_share_docstrings()
