"""Request and response models shared by the server and the SDK.

Requests are strict (`extra="forbid"`, no coercion): they are the single source
of truth for validation and for the generated `/openapi.json`. Responses carry
uint64 values as decimal strings on the wire and as `int` in Python.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

from ._rules import check_name, check_reason, parse_revision

__all__ = [
    "ConfigureQueueRequest",
    "CreateQueueRequest",
    "CreateQueueResult",
    "Queue",
    "QueuePage",
    "RetireQueueRequest",
]


def _u64_from_wire(value: Any) -> Any:
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


U64 = Annotated[
    int,
    BeforeValidator(_u64_from_wire),
    PlainSerializer(lambda v: str(v), return_type=str),
    WithJsonSchema({"type": "string", "pattern": "^[0-9]{1,20}$", "description": "uint64 as a decimal string"}),
]
QueueName = Annotated[str, AfterValidator(check_name)]
Reason = Annotated[str, AfterValidator(check_reason)]
Revision = Annotated[
    str,
    AfterValidator(lambda v: (parse_revision(v), v)[1]),
    WithJsonSchema({"type": "string", "pattern": "^[1-9][0-9]{0,19}$", "description": "non-zero uint64 as a decimal string"}),
]


class StrictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


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
