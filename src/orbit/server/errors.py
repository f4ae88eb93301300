"""The error vocabulary of the domain: a stable code, a message for people, details.

Services raise (or, in grouped worker commands, return) `DomainError`; `http/` maps the
code to a status and an envelope, `ws/` to an error reply. Nothing here knows a protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError


class DomainError(Exception):
    """A refusal; `retry_after_ms` says when a retry may succeed (rate, pause, overload)."""

    def __init__(self, code: str, message: str, *, details: dict[str, Any] | None = None,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
        self.retry_after_ms = retry_after_ms

    def __repr__(self) -> str:
        return f"DomainError({self.code!r}, {self.message!r})"


class DatabaseUnavailable(DomainError):
    """The database could not be reached or kept refusing; safe to retry with the same identity.
    `reason` is for the logs: clients hear the same UNAVAILABLE whatever it was."""

    def __init__(self, reason: str = "", *, retry_after_ms: int = 1000) -> None:
        super().__init__("UNAVAILABLE", "the database is unavailable; retry with the same identity",
                         retry_after_ms=retry_after_ms)
        self.reason = reason


class Overloaded(DatabaseUnavailable):
    """The node has more work in progress than it can serve soon: refused before anything was
    done, so the same identity may be sent again (after the hint, here or to another node). A
    kind of `DatabaseUnavailable` (the same UNAVAILABLE, as quiet in the logs), not an outage."""

    def __init__(self, reason: str = "", *, retry_after_ms: int = 1000) -> None:
        DomainError.__init__(self, "UNAVAILABLE", "the node is overloaded; retry with the same identity",
                             retry_after_ms=retry_after_ms)
        self.reason = reason


def overloaded(reason: str = "") -> Overloaded:
    return Overloaded(reason)


class ValueRefused(DomainError):
    """The database refused a value of the request (a character, a length, a number or a date it
    cannot hold or compare): the request is at fault, not the service, so it is never retryable."""

    def __init__(self) -> None:
        super().__init__("INVALID_ARGUMENT",
                         "a value of the request is outside what the server can store or compare; nothing was changed")


def invalid_argument(message: str, field: str | None = None, **details: Any) -> DomainError:
    d = dict(details)
    if field is not None:
        d["field"] = field
    return DomainError("INVALID_ARGUMENT", message, details=d or None)


def unauthenticated(message: str = "missing, malformed, unknown or revoked bearer token") -> DomainError:
    return DomainError("UNAUTHENTICATED", message)


def permission_denied(message: str) -> DomainError:
    return DomainError("PERMISSION_DENIED", message)


def not_found(what: str = "resource") -> DomainError:
    return DomainError("NOT_FOUND", f"{what} not found")


def state_conflict(message: str, **details: Any) -> DomainError:
    return DomainError("STATE_CONFLICT", message, details=details or None)


def stale_revision(expected: str, current: int, what: str) -> DomainError:
    return DomainError("STATE_CONFLICT", f"expected_revision {expected} is stale; the {what} is at revision {current}",
                       details={"current_revision": str(current)})


def idempotency_conflict() -> DomainError:
    return DomainError("IDEMPOTENCY_CONFLICT", "the idempotency key was already used with different content")


def queue_full() -> DomainError:
    return DomainError("QUEUE_FULL", "queue unfinished task limit reached; retry later using the original identity",
                      retry_after_ms=1000)


def application_full() -> DomainError:
    return DomainError("APPLICATION_FULL",
                      "application unfinished task quota reached; retry later using the original identity",
                      retry_after_ms=1000)


def payload_too_large(limit: int) -> DomainError:
    return DomainError("PAYLOAD_TOO_LARGE", f"request body exceeds the {limit}-byte limit")


def unsupported_media_type() -> DomainError:
    return DomainError("UNSUPPORTED_MEDIA_TYPE", "requests with a body must send Content-Type: application/json")


def describe_validation_error(exc: ValidationError) -> DomainError:
    """The refusal of a body that failed its model."""
    return describe_errors(exc.errors(include_url=False))


_PARAMETER_PLACES = ("query", "path", "header", "cookie")


def describe_errors(errors: Sequence[Mapping[str, Any]]) -> DomainError:
    """One refusal for a request's validation errors, with a message that names the field: an
    unknown field first (a misspelt name is why its correct spelling is then 'required'), else
    the first error in the order the fields were declared. A query parameter is named without
    its place (`state`, not `query.state.0`); a body field by its path (`retry.jitter`)."""
    if not errors:
        return invalid_argument("invalid request")
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = list(err.get("loc", ()))
    if loc and loc[0] in _PARAMETER_PLACES:
        loc = [p for p in loc[1:] if not isinstance(p, int)]
    field = ".".join(str(p) for p in loc) or None
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
