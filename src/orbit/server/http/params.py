"""Query parameters of the list routes.

A filter follows the rule of the field it filters on (a queue's name, an id, a timestamp, a task
state), checked before anything reaches the database: a value no resource can have is a 400
naming the parameter, never a statement the database refuses (a character an ASCII column
cannot hold would otherwise read as an outage). The same types describe the parameters in
`/openapi.json`, so the document admits exactly what is accepted.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from annotated_types import Ge, Le
from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

from ..._rules import ID_PATTERN, UINT64_PATTERN, check_id, check_uint64
from ...models import QueueName, Timestamp
from ..core import states
from ..services import audit, events

__all__ = ["Action", "Cursor", "EventTypes", "Flag", "Id", "Limit", "Name", "Seq", "State", "Stamp", "number"]


def _decimal(value: Any) -> Any:
    """Query text is an integer only when written as one: `8`, not `8.0`, `+8` or `8e0`."""
    if isinstance(value, str) and not re.fullmatch(r"-?[0-9]+", value):
        raise ValueError("must be an integer written in decimal digits")
    return value


def _flag(value: Any) -> Any:
    if isinstance(value, str) and value not in ("true", "false"):
        raise ValueError("must be true or false")
    return value


def _cursor(value: str) -> str:
    if not value:
        raise ValueError("must not be empty: pass next_cursor of the previous page, or omit it")
    return value


def _state(value: str) -> str:
    if value not in states.ALL_STATES:
        raise ValueError(f"{value!r} is not one of {', '.join(states.ALL_STATES)}")
    return value


def number(low: int, high: int) -> Any:
    """An integer parameter from `low` to `high`, written in decimal digits."""
    return Annotated[int, BeforeValidator(_decimal), Ge(low), Le(high),
                     WithJsonSchema({"type": "integer", "format": "int32", "minimum": low, "maximum": high})]


Limit = number(1, 1000)
Flag = Annotated[bool, BeforeValidator(_flag), WithJsonSchema({"type": "boolean"})]
Id = Annotated[str, AfterValidator(check_id),
               WithJsonSchema({"type": "string", "pattern": ID_PATTERN, "description": "an id: 32 lowercase hex"})]
Name = QueueName
Stamp = Timestamp
State = Annotated[str, AfterValidator(_state), WithJsonSchema({"type": "string", "enum": list(states.ALL_STATES)})]
Cursor = Annotated[str, AfterValidator(_cursor), WithJsonSchema(
    {"type": "string", "minLength": 1, "description": "opaque: next_cursor of the previous page"})]
Seq = Annotated[str, AfterValidator(check_uint64), WithJsonSchema(
    {"type": "string", "pattern": UINT64_PATTERN, "description": "a seq: uint64 as a decimal string"})]


def _pattern(pattern: str, what: str):
    """A check by the same expression the document gives (`$` read as the end of the text)."""
    compiled = re.compile(pattern.replace("$", r"\Z"))

    def check(value: str) -> str:
        if not compiled.match(value):
            raise ValueError(f"must be {what}")
        return value

    return check


Action = Annotated[str, AfterValidator(_pattern(audit.ACTION_PATTERN, "an action such as 'queue.configure'")),
                   Field(max_length=audit.ACTION_MAX),
                   WithJsonSchema({"type": "string", "pattern": audit.ACTION_PATTERN, "maxLength": audit.ACTION_MAX})]
EventTypes = Annotated[str, AfterValidator(_pattern(events.TYPES_PATTERN, "event types such as task.succeeded or "
                                                    "schedule.*, separated by commas")),
                       WithJsonSchema({"type": "string", "pattern": events.TYPES_PATTERN})]
