"""Request and response models shared by the server and the SDK.

Requests are strict (`extra="forbid"`, no coercion): they are the single source
of truth for validation and for the generated `/openapi.json`. Responses carry
uint64 values as decimal strings on the wire and as `int` in Python.
"""

from __future__ import annotations

import functools

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationInfo,
    WithJsonSchema,
    model_validator,
)

from ._rules import (
    NONZERO_UINT64_PATTERN,
    NOT_BLANK_PATTERN,
    UINT64_PATTERN,
    check_name,
    check_reason,
    check_timestamp,
    parse_revision,
)

__all__ = [
    "Application",
    "ConfigureApplicationRequest",
    "ConfigureApplicationResult",
    "Attempt",
    "AttemptPage",
    "BatchItemResult",
    "BatchSubmitRequest",
    "BatchSubmitResult",
    "CallerCredential",
    "CancelTaskRequest",
    "RetryPolicy",
    "ReviewTaskRequest",
    "SubmitTaskItem",
    "SubmitTaskRequest",
    "SubmitTaskResult",
    "Task",
    "TaskError",
    "TaskPage",
    "TaskState",
    "ConfigureQueueRequest",
    "CreateQueueRequest",
    "CreateQueueResult",
    "Queue",
    "QueuePage",
    "RetireQueueRequest",
    "QueueThroughput",
    "QueueUsage",
    "ThroughputCounts",
    "ThroughputPoint",
    "RateWindowUse",
    "ActiveNode",
    "TaskBlockers",
    "Blocker",
    "ConfigureResourceKeyRequest",
    "CreateResourceKeyRequest",
    "CreateResourceKeyResult",
    "ResourceKey",
    "ResourceKeyPage",
    "RetireResourceKeyRequest",
    "ConfigureScheduleRequest",
    "CreateScheduleRequest",
    "CreateScheduleResult",
    "MisfirePolicy",
    "RetireScheduleRequest",
    "Schedule",
    "SchedulePage",
    "ScheduleRun",
    "ScheduleRunPage",
    "TaskTemplate",
    "AuditRecord",
    "AuditRecordPage",
    "Event",
    "EventPage",
]


def _u64_from_wire(value: Any) -> Any:
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


U64 = Annotated[
    int,
    BeforeValidator(_u64_from_wire),
    PlainSerializer(lambda v: str(v), return_type=str),
    WithJsonSchema({"type": "string", "pattern": UINT64_PATTERN, "description": "uint64 as a decimal string"}),
]
QueueName = Annotated[
    str,
    AfterValidator(check_name),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]*$"}),
]
# A resource key's name follows the queue-name rules.
ResourceKeyName = QueueName
Reason = Annotated[
    str,
    AfterValidator(check_reason),
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 1024, "pattern": NOT_BLANK_PATTERN,
                    "description": "not blank; at most 1024 characters"}),
]
def _revision_from_python(value: Any, info: ValidationInfo) -> Any:
    """SDK code may pass `queue.revision` (an int); on the wire only a decimal string is valid."""
    wire = bool(info.context and info.context.get("wire"))
    if not wire and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


Revision = Annotated[
    str,
    BeforeValidator(_revision_from_python),
    AfterValidator(lambda v: (parse_revision(v), v)[1]),
    WithJsonSchema({"type": "string", "pattern": NONZERO_UINT64_PATTERN,
                    "description": "non-zero uint64 as a decimal string"}),
]


def _request_model(annotation: Any) -> type[StrictRequest] | None:
    """The request model a field holds (`RetryPolicy | None` -> RetryPolicy), if any."""
    if isinstance(annotation, type):
        return annotation if issubclass(annotation, StrictRequest) else None
    for arg in get_args(annotation):
        found = _request_model(arg)
        if found is not None:
            return found
    return None


def _integer_formats(schema: Any) -> None:
    """`format: int32`/`int64` on every integer: an integer is a JSON integer (`8`, not `8.0`), as
    OpenAPI 3.1 defines `integer` (a JSON number without a fraction or exponent part)."""
    if isinstance(schema, dict):
        if schema.get("type") == "integer" and "format" not in schema:
            schema["format"] = "int32" if schema.get("maximum", 1 << 63) < 1 << 31 else "int64"
        for value in schema.values():
            _integer_formats(value)
    elif isinstance(schema, list):
        for value in schema:
            _integer_formats(value)


def _nullable_optionals(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """The document says what the server takes: an optional field may be given as null; an
    integer is a JSON integer."""
    _integer_formats(schema.get("properties"))
    required = set(schema.get("required", ()))
    for name, prop in schema.get("properties", {}).items():
        if name in required or {"type": "null"} in prop.get("anyOf", ()):
            continue
        meta = {k: prop.pop(k) for k in ("title", "description", "default") if k in prop}
        schema["properties"][name] = {"anyOf": [prop, {"type": "null"}], **meta}


class StrictRequest(BaseModel):
    """A request body. Strict (no coercion, unknown fields refused), and an optional field given
    as null is the same as omitting it: it takes its default, and is digested as omitted
    (`omitted_nulls`). A required field given as null is refused."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_nullable_optionals)

    @model_validator(mode="before")
    @classmethod
    def _null_is_omitted(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if None not in data.values():  # the usual body: nothing to drop, no copy
            return data
        fields = _fields(cls)
        return {k: v for k, v in data.items() if v is not None or k not in fields or fields[k][0]}

    @classmethod
    def nested(cls, name: str) -> type[StrictRequest] | None:
        """The request model of a field's value (or of each item of a list), if it holds one."""
        field = cls.model_fields.get(name)
        return None if field is None else _request_model(field.annotation)


@functools.cache
def _fields(model: type[StrictRequest]) -> dict[str, tuple[bool, type[StrictRequest] | None]]:
    """Each field of a request model: whether it is required, and the request model it holds
    (`nested`). Looked up once per model: a batch submit asks for every key of every item."""
    return {name: (field.is_required(), model.nested(name)) for name, field in model.model_fields.items()}


@functools.cache
def _nested_keys(model: type[StrictRequest]) -> frozenset[str]:
    """The fields of a request model that hold request objects of their own."""
    return frozenset(name for name, (_, inner) in _fields(model).items() if inner is not None)


def omitted_nulls(model: type[StrictRequest], body: Any) -> Any:
    """A body as the client meant it: optional fields given as null removed, in nested request
    objects (and list items) too. What the idempotency digest is taken of, so that a null and an
    omission are the same request."""
    if not isinstance(body, dict):
        return body
    if None not in body.values() and _nested_keys(model).isdisjoint(body):
        return body  # no null to drop, no nested request object to look into: as sent
    out: dict[str, Any] = {}
    fields = _fields(model)
    for key, value in body.items():
        field = fields.get(key)
        if field is None:
            out[key] = value  # unknown: validation names it
            continue
        required, inner = field
        if value is None and not required:
            continue
        if inner is not None and isinstance(value, list):
            value = [omitted_nulls(inner, item) for item in value]
        elif inner is not None:
            value = omitted_nulls(inner, value)
        out[key] = value
    return out


class CreateQueueRequest(StrictRequest):
    """Body of `POST /v1/queues`."""

    name: QueueName = Field(description="1-128 chars; an ASCII letter or digit, then letters, digits, _ . : -")
    max_concurrency: int = Field(ge=1, le=100_000, description="execution permits (LEASED + RUNNING)")
    rate_per_second: int = Field(ge=1, le=1_000_000, description="Starts per one-second window")
    max_unfinished_tasks: int = Field(
        default=0, ge=0, le=1_000_000, description="backlog limit; omitted or 0 means 100000"
    )


class ConfigureQueueRequest(StrictRequest):
    """Body of `POST /v1/queues/{queue_id}:configure`: replaces every control at once."""

    expected_revision: Revision
    reason: Reason = Field(description="not blank, at most 1024 characters; written to the audit record")
    paused: bool
    max_concurrency: int = Field(ge=1, le=100_000)
    rate_per_second: int = Field(ge=1, le=1_000_000)
    max_unfinished_tasks: int = Field(ge=1, le=1_000_000)


def configure_controls(model: type[BaseModel]) -> dict[str, type]:
    """The controls a configure model replaces all at once (its fields but the revision and the
    reason), each with its JSON type (bool or int): the server stores each in the column of its
    name and returns it on the resource's object."""
    return {name: (bool if field.annotation is bool else int) for name, field in model.model_fields.items()
            if name not in ("expected_revision", "reason")}


class RetireQueueRequest(StrictRequest):
    """Body of `POST /v1/queues/{queue_id}:retire`."""

    expected_revision: Revision
    reason: Reason


class Queue(BaseModel):
    """A queue and its live backlog (`unfinished_tasks`)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    namespace_id: str
    name: str
    paused: bool
    max_concurrency: int
    rate_per_second: int
    max_unfinished_tasks: int
    unfinished_tasks: U64
    revision: U64
    retired_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class CreateQueueResult(BaseModel):
    """Answer of create, configure and retire: the snapshot as of that operation."""

    model_config = ConfigDict(extra="ignore")

    deduplicated: bool
    queue: Queue


class QueuePage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[Queue]
    next_cursor: str | None = None


# ---------------------------------------------------------------- applications


class ConfigureApplicationRequest(StrictRequest):
    """Body of `POST /v1/applications/{application_id}:configure`: replaces every quota at once."""

    expected_revision: Revision
    reason: Reason = Field(description="not blank, at most 1024 characters; written to the audit record")
    paused: bool = Field(description="blocks claims and Starts in every queue of the application")
    max_concurrency: int = Field(ge=1, le=1_000_000, description="execution permits shared by every queue")
    rate_per_second: int = Field(ge=1, le=10_000_000, description="Starts per one-second application window")
    max_unfinished_tasks: int = Field(ge=1, le=100_000_000, description="backlog quota shared by every queue")


class Application(BaseModel):
    """An application's quotas, shared by all its namespaces, with their live usage."""

    model_config = ConfigDict(extra="ignore")

    id: str
    name: str
    paused: bool
    max_concurrency: int
    rate_per_second: int
    max_unfinished_tasks: int
    unfinished_tasks: U64
    in_flight: U64
    revision: U64
    created_at: datetime | None = None
    updated_at: datetime | None = None


class CallerCredential(BaseModel):
    """The credential that made the call: whose it is and what it may do."""

    model_config = ConfigDict(extra="ignore")

    id: str
    application_id: str
    namespace_id: str
    permissions: list[str]
    queue_scope: str | list[str]


class ConfigureApplicationResult(BaseModel):
    """Answer of configure: the snapshot as of that operation."""

    model_config = ConfigDict(extra="ignore")

    deduplicated: bool
    application: Application


# ---------------------------------------------------------------- resource keys


class CreateResourceKeyRequest(StrictRequest):
    """Body of `POST /v1/resource-keys`."""

    name: ResourceKeyName = Field(description="1-128 chars; an ASCII letter or digit, then letters, digits, _ . : -")
    max_concurrency: int = Field(ge=1, le=100_000, description="permits: tasks holding the key at once")


class ConfigureResourceKeyRequest(StrictRequest):
    """Body of `POST /v1/resource-keys/{resource_key_id}:configure`: replaces every control at once."""

    expected_revision: Revision
    reason: Reason = Field(description="not blank, at most 1024 characters; written to the audit record")
    max_concurrency: int = Field(ge=1, le=100_000, description="lowering it revokes no permit already held")


class RetireResourceKeyRequest(StrictRequest):
    """Body of `POST /v1/resource-keys/{resource_key_id}:retire`."""

    expected_revision: Revision
    reason: Reason


class ResourceKey(BaseModel):
    """A named permit pool shared by the queues of a namespace, with its permits in use."""

    model_config = ConfigDict(extra="ignore")

    id: str
    namespace_id: str
    name: str
    max_concurrency: int
    in_use: U64
    revision: U64
    retired_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class CreateResourceKeyResult(BaseModel):
    """Answer of create, configure and retire: the snapshot as of that operation."""

    model_config = ConfigDict(extra="ignore")

    deduplicated: bool
    resource_key: ResourceKey


class ResourceKeyPage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[ResourceKey]
    next_cursor: str | None = None


# ---------------------------------------------------------------- tasks


class TaskState(StrEnum):
    """Task states; a `str` enum so that `task.state == "SUCCEEDED"` holds and it prints plainly."""

    WAITING = "WAITING"
    LEASED = "LEASED"
    RUNNING = "RUNNING"
    NEEDS_REVIEW = "NEEDS_REVIEW"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("must not be null")
    return value


Timestamp = Annotated[
    str,
    AfterValidator(check_timestamp),
    WithJsonSchema({"type": "string", "format": "date-time", "description": "RFC 3339 with an offset"}),
]
def _distinct(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ValueError("names must be distinct")
    return names


# Up to 4 distinct names of resource keys.
ResourceKeyNames = Annotated[list[ResourceKeyName], Field(max_length=4, json_schema_extra={"uniqueItems": True}),
                             AfterValidator(_distinct)]
JsonValue = Annotated[Any, AfterValidator(_not_null), WithJsonSchema(
    {"not": {"type": "null"}, "description": "any JSON value except null"})]


class RetryPolicy(StrictRequest):
    """Backoff between attempts: min(max, initial x multiplier^(n-1)) +/- jitter."""

    initial_backoff_ms: int = Field(default=1000, ge=1, le=86_400_000)
    max_backoff_ms: int = Field(default=60_000, ge=1, le=31_622_400_000)
    multiplier: float = Field(default=2.0, ge=1.0, le=10.0)
    jitter: float = Field(default=0.2, ge=0.0, le=1.0)


class SubmitTaskRequest(StrictRequest):
    """Body of `POST /v1/queues/{queue_id}/tasks`. Everything but `payload` is the frozen policy."""

    payload: JsonValue
    priority: int = Field(default=5, ge=0, le=9, description="0-9, higher first")
    max_attempts: int = Field(default=3, ge=1, le=100, description="the attempt budget")
    retry: RetryPolicy | None = Field(default=None, description="backoff policy; omitted: the defaults")
    on_lease_lost: Literal["review", "retry"] = "review"
    resource_keys: ResourceKeyNames = Field(default_factory=list)
    available_at: Timestamp | None = None
    start_deadline_at: Timestamp | None = None
    deadline_at: Timestamp | None = None
    deadline_seconds: int | None = Field(default=None, ge=1, le=31_622_400)


class SubmitTaskItem(SubmitTaskRequest):
    """One item of a batch submit: its own idempotency key plus the submit fields."""

    idempotency_key: str = Field(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")


class BatchSubmitRequest(StrictRequest):
    """Body of `POST /v1/queues/{queue_id}/tasks:batch` (each item validated on its own)."""

    tasks: list[Any] = Field(min_length=1, max_length=500, description="items: idempotency_key + submit fields")

    @classmethod
    def nested(cls, name: str) -> type[StrictRequest] | None:
        return SubmitTaskItem if name == "tasks" else None


class CancelTaskRequest(StrictRequest):
    """Body of `POST /v1/tasks/{task_id}:cancel`."""

    reason: Reason


class ReviewTaskRequest(StrictRequest):
    """Body of `POST /v1/tasks/{task_id}:review`: resolve an unknown outcome."""

    resolution: Literal["SUCCEEDED", "FAILED", "RETRY"]
    reason: Reason
    evidence: dict[str, Any] | None = None


class TaskError(BaseModel):
    model_config = ConfigDict(extra="ignore")

    code: str
    message: str


class Task(BaseModel):
    """A task with its frozen policy, state and outcome."""

    model_config = ConfigDict(extra="ignore")

    id: str
    namespace_id: str
    queue_id: str
    schedule_id: str | None = None
    trigger_at: datetime | None = None
    state: TaskState
    payload: Any = None
    priority: int
    resource_keys: list[str] = []
    max_attempts: int
    attempts: int
    retry: RetryPolicy
    on_lease_lost: str
    available_at: datetime
    start_deadline_at: datetime | None = None
    deadline_at: datetime | None = None
    cancel_requested: bool = False
    result: Any = None
    error: TaskError | None = None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class SubmitTaskResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    deduplicated: bool
    task: Task


class BatchItemResult(BaseModel):
    """Either `deduplicated` + `task`, or `error`."""

    model_config = ConfigDict(extra="ignore")

    deduplicated: bool | None = None
    task: Task | None = None
    error: TaskError | None = None


class BatchSubmitResult(BaseModel):
    model_config = ConfigDict(extra="ignore")

    deduplicated: bool
    results: list[BatchItemResult]


class TaskPage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[Task]
    next_cursor: str | None = None


class Attempt(BaseModel):
    model_config = ConfigDict(extra="ignore")

    number: int
    node_id: str | None = None
    worker_session_id: str | None = None
    lease_id: str | None = None
    leased_at: datetime | None = None
    lease_expires_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    outcome: str
    error: TaskError | None = None
    late_reports: list[Any] = []


class AttemptPage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[Attempt]
    next_cursor: str | None = None


class RateWindowUse(BaseModel):
    """The current one-second Start window of a queue."""

    model_config = ConfigDict(extra="ignore")

    started_at: datetime | None = None
    used: U64
    reserved: U64


class ActiveNode(BaseModel):
    """A worker node that claimed on the queue within the last 10 s."""

    model_config = ConfigDict(extra="ignore")

    node_id: str
    in_flight: U64
    last_claim_at: datetime | None = None


class QueueUsage(BaseModel):
    """A queue's live usage at the database clock (`at`)."""

    model_config = ConfigDict(extra="ignore")

    queue_id: str
    at: datetime | None = None
    unfinished_tasks: U64
    waiting: U64
    delayed: U64
    leased: U64
    running: U64
    needs_review: U64
    in_flight: U64
    rate_window: RateWindowUse | None = None
    active_nodes: list[ActiveNode] = []


class ThroughputCounts(BaseModel):
    """Starts authorized, tasks ended SUCCEEDED, tasks ended FAILED."""

    model_config = ConfigDict(extra="ignore")

    started: U64
    succeeded: U64
    failed: U64


class ThroughputPoint(ThroughputCounts):
    """What a queue counted in one bucket, starting at `at` (the last one is still running)."""

    at: datetime


class QueueThroughput(BaseModel):
    """A queue's throughput history at the database clock (`at`): its cumulative counters
    (`totals`) and, per `interval_seconds` bucket of the window, oldest first, what it counted
    (zero where nothing was, or where no earlier sample of the counters is kept)."""

    model_config = ConfigDict(extra="ignore")

    queue_id: str
    at: datetime | None = None
    interval_seconds: int
    totals: ThroughputCounts
    points: list[ThroughputPoint] = []


class Blocker(BaseModel):
    """One control that holds a waiting task: its layer, the control, and the figures behind it."""

    model_config = ConfigDict(extra="ignore")

    layer: str
    control: str
    name: str | None = None
    limit: int | None = None
    in_use: U64 | None = None
    used: U64 | None = None
    until: datetime | None = None


class TaskBlockers(BaseModel):
    """Why a task is not running now (`blockers` empty: the next claim on its queue can take it)."""

    model_config = ConfigDict(extra="ignore")

    task_id: str
    state: str
    at: datetime | None = None
    blockers: list[Blocker] = []


# ---------------------------------------------------------------- schedules


class MisfirePolicy(StrictRequest):
    """What becomes of trigger points the scheduler reaches late."""

    policy: Literal["catch_up", "latest"] = Field(
        default="catch_up", description="catch_up: every missed point inside the window; latest: the most recent one"
    )
    catch_up_window_seconds: int = Field(default=60, ge=0, le=604_800,
                                         description="missed points older than this are recorded SKIPPED")


class TaskTemplate(StrictRequest):
    """The tasks a schedule generates: the fields of a task submit, with deadlines counted from
    the trigger point."""

    payload: JsonValue
    priority: int = Field(default=5, ge=0, le=9, description="0-9, higher first")
    max_attempts: int = Field(default=3, ge=1, le=100, description="the attempt budget")
    retry: RetryPolicy | None = Field(default=None, description="backoff policy; omitted: the defaults")
    on_lease_lost: Literal["review", "retry"] = "review"
    resource_keys: ResourceKeyNames = Field(default_factory=list)
    deadline_seconds: int | None = Field(default=None, ge=1, le=31_622_400,
                                         description="total deadline, counted from the trigger point")
    start_deadline_seconds: int | None = Field(default=None, ge=1, le=31_622_400,
                                               description="start deadline, counted from the trigger point")


class _ScheduleSettings(StrictRequest):
    """What a configure replaces all at once (with `paused`): omitted fields take their defaults."""

    cron: str | None = Field(default=None, max_length=64, pattern=r"^[ -~]*$",
                             description="standard 5-field cron expression; exactly one of cron and interval_seconds")
    interval_seconds: int | None = Field(default=None, ge=1, le=31_622_400, description="fixed interval")
    timezone: str = Field(default="UTC", min_length=1, max_length=64, description="IANA zone cron is evaluated in")
    start_at: Timestamp | None = Field(default=None, description="no trigger point before it")
    end_at: Timestamp | None = Field(default=None, description="no trigger point after it; after start_at")
    misfire: MisfirePolicy = Field(default_factory=MisfirePolicy)
    overlap: Literal["allow", "skip"] = Field(
        default="allow", description="skip: no new task while the schedule's previous one is unfinished"
    )
    task: TaskTemplate


class CreateScheduleRequest(_ScheduleSettings):
    """Body of `POST /v1/schedules`."""

    name: QueueName = Field(description="unique in the namespace; the queue-name rules")
    queue_id: str = Field(pattern=r"^[0-9a-f]{32}$", description="the queue the generated tasks go to")
    paused: bool = False


class ConfigureScheduleRequest(_ScheduleSettings):
    """Body of `POST /v1/schedules/{schedule_id}:configure`: replaces every field but the name and
    the queue at once."""

    expected_revision: Revision
    reason: Reason = Field(description="not blank, at most 1024 characters; written to the audit record")
    paused: bool


class RetireScheduleRequest(StrictRequest):
    """Body of `POST /v1/schedules/{schedule_id}:retire`."""

    expected_revision: Revision
    reason: Reason


class Schedule(BaseModel):
    """A schedule with its cursor (`next_trigger_at`: the next trigger point it handles)."""

    model_config = ConfigDict(extra="ignore")

    id: str
    namespace_id: str
    queue_id: str
    name: str
    paused: bool
    cron: str | None = None
    interval_seconds: int | None = None
    timezone: str
    start_at: datetime | None = None
    end_at: datetime | None = None
    misfire: MisfirePolicy
    overlap: str
    task: TaskTemplate
    next_trigger_at: datetime | None = None
    last_trigger_at: datetime | None = None
    revision: U64
    retired_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class CreateScheduleResult(BaseModel):
    """Answer of create, configure and retire: the snapshot as of that operation."""

    model_config = ConfigDict(extra="ignore")

    deduplicated: bool
    schedule: Schedule


class SchedulePage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[Schedule]
    next_cursor: str | None = None


class ScheduleRun(BaseModel):
    """One trigger point a schedule handled: the task it submitted, or why it skipped the point."""

    model_config = ConfigDict(extra="ignore")

    trigger_at: datetime
    outcome: str
    task_id: str | None = None
    reason: str | None = None
    created_at: datetime


class ScheduleRunPage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    items: list[ScheduleRun]
    next_cursor: str | None = None


class Event(BaseModel):
    """One event of the feed: `seq` is strictly increasing per namespace and never reused."""

    model_config = ConfigDict(extra="ignore")

    seq: U64
    type: str
    time: datetime | None = None
    resource_type: str
    resource_id: str
    data: Any = None


class EventPage(BaseModel):
    """Events after a cursor, oldest first; persist `next_after` and pass it as `after` next time."""

    model_config = ConfigDict(extra="ignore")

    items: list[Event]
    next_after: U64


# ---------------------------------------------------------------- audit


class AuditRecord(BaseModel):
    """One management operation: who (`actor_credential_id`, or `actor` for orbit-admin), what, on which
    resource, through which request, with JSON snapshots of the resource before and after."""

    model_config = ConfigDict(extra="ignore")

    id: str
    time: datetime
    actor_credential_id: str | None = None
    actor: str | None = None
    action: str
    resource_type: str
    resource_id: str
    reason: str | None = None
    request_id: str | None = None
    idempotency_key: str | None = None
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None


class AuditRecordPage(BaseModel):
    """Records after a cursor, oldest first; pass `next_after` as `after` for the next page (it stays the
    given `after` when nothing is newer)."""

    model_config = ConfigDict(extra="ignore")

    items: list[AuditRecord]
    next_after: str | None = None
