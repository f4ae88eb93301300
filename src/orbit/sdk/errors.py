"""Errors raised by the SDK and by handlers."""

from __future__ import annotations

from typing import Any

MAX_RETRY_AFTER_SECONDS = 3600


def parse_retry_after(value: str | None) -> float:
    """Integer seconds from `Retry-After`; missing, invalid or above one hour parse as 0."""
    if value is None:
        return 0.0
    text = value.strip()
    # ASCII digits only: str.isdigit() also accepts '²' or '٣', and int() of a
    # very long digit string raises; neither may escape as an exception.
    if not (text.isascii() and text.isdigit()):
        return 0.0
    significant = text.lstrip("0") or "0"
    if len(significant) > len(str(MAX_RETRY_AFTER_SECONDS)):
        return 0.0
    seconds = int(significant)
    return float(seconds) if seconds <= MAX_RETRY_AFTER_SECONDS else 0.0


class OrbitError(Exception):
    """Base class of every error the SDK raises."""


class APIError(OrbitError):
    """The server answered with an error envelope (any non-2xx status).

    Branch on `code` and `status_code`; `message` is for humans. `retry_after`
    is the server's hint in seconds (0 when absent).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status_code: int,
        request_id: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: float = 0.0,
    ) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.code = code
        self.message = message
        self.status_code = status_code
        self.request_id = request_id
        self.details = details or {}
        self.retry_after = retry_after


class TransportError(OrbitError):
    """The request may or may not have reached the server: its outcome is unknown.

    Resend the *same* command (same idempotency key and content) to find out.
    """


class RetryableError(Exception):
    """Raise from a handler: the attempt failed and may be retried per the task's policy."""


class PermanentError(Exception):
    """Raise from a handler: the attempt failed and must not be retried."""
