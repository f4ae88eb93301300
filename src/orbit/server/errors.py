"""The error vocabulary shared by services and protocol layers.

Services raise `ApiError`; the HTTP layer renders it in the spec's envelope and
the WebSocket layer as an error reply. Nothing here knows about HTTP objects.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers or {}


def invalid_argument(message: str, field: str | None = None, **details: Any) -> ApiError:
    d = dict(details)
    if field is not None:
        d["field"] = field
    return ApiError(400, "INVALID_ARGUMENT", message, details=d or None)


def unauthenticated(message: str = "missing, malformed, unknown or revoked bearer token") -> ApiError:
    return ApiError(401, "UNAUTHENTICATED", message)


def permission_denied(message: str) -> ApiError:
    return ApiError(403, "PERMISSION_DENIED", message)


def not_found(what: str = "resource") -> ApiError:
    return ApiError(404, "NOT_FOUND", f"{what} not found")


def state_conflict(message: str, **details: Any) -> ApiError:
    return ApiError(409, "STATE_CONFLICT", message, details=details or None)


def idempotency_conflict() -> ApiError:
    return ApiError(
        409,
        "IDEMPOTENCY_CONFLICT",
        "the idempotency key was already used with different content",
    )


def queue_full() -> ApiError:
    return ApiError(
        429,
        "QUEUE_FULL",
        "queue unfinished task limit reached; retry later using the original identity",
        headers={"Retry-After": "1"},
    )


def application_full() -> ApiError:
    return ApiError(
        429,
        "APPLICATION_FULL",
        "application unfinished task quota reached; retry later using the original identity",
        headers={"Retry-After": "1"},
    )


def unavailable(message: str = "the database is unavailable; retry with the same identity") -> ApiError:
    return ApiError(503, "UNAVAILABLE", message, headers={"Retry-After": "1"})


def describe_validation_error(exc: ValidationError) -> ApiError:
    """Turn the first pydantic error into a message that names the field."""
    err = exc.errors(include_url=False)[0]
    field = ".".join(str(p) for p in err.get("loc", ())) or None
    kind = err.get("type", "")
    if kind == "missing":
        message = "is required"
    elif kind == "extra_forbidden":
        message = "is not a known field"
    elif err.get("input", ...) is None:
        message = "must not be null"
    elif kind == "value_error":
        message = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
    else:
        message = err["msg"][0].lower() + err["msg"][1:]
    text = f"{field}: {message}" if field else message
    return invalid_argument(text, field)
