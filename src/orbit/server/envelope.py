"""The error envelope and each code's HTTP status, shared by the HTTP routes and the
worker endpoint's refused upgrades (both answer HTTP)."""

from __future__ import annotations

from typing import Any

import orjson

from .errors import DomainError

STATUS = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "IDEMPOTENCY_CONFLICT": 409,
    "STATE_CONFLICT": 409,
    "CURSOR_EXPIRED": 410,
    "PAYLOAD_TOO_LARGE": 413,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "QUEUE_FULL": 429,
    "APPLICATION_FULL": 429,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
}


def status_of(error: DomainError) -> int:
    return STATUS.get(error.code, 500)


def error_body(rid: str, code: str, message: str, details: dict[str, Any] | None = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if details:
        err["details"] = details
    return orjson.dumps({"request_id": rid, "error": err})
