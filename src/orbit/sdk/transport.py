"""The HTTP seam of the SDK: one request shape, one envelope decoder, two thin executors.

`Client` and `AsyncClient` build the same `HTTPRequest` values and hand them to
`SyncTransport` or `AsyncTransport`, which own an `httpx.Client` /
`httpx.AsyncClient`. Any httpx transport (`httpx.MockTransport`,
`httpx.ASGITransport`, a custom one) can be plugged in underneath, which is
how tests run the SDK against an in-process server.

Error mapping, shared by both executors:

- an Orbit error envelope (any non-2xx status) → `APIError` with the envelope's
  code, message and details, the HTTP status, the request id and
  `retry_after` parsed from `Retry-After`;
- no answer at all (connect failure, timeout, dropped connection, protocol
  error) → `TransportError`: the request may or may not have taken effect;
- a 2xx answer that is not an Orbit envelope, or a 502/503/504 without an
  envelope (an intermediary gave up) → `TransportError` too: the outcome is
  unknown, resend the same command to find out;
- any other non-2xx answer without an envelope (a proxy's error page, a plain
  500, a redirect) → `APIError` with code `INTERNAL` and the real status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from .errors import APIError, TransportError, parse_retry_after

__all__ = ["AsyncTransport", "HTTPRequest", "Reply", "SyncTransport", "decode_response", "encode_json"]

_GATEWAY_STATUSES = frozenset({502, 503, 504})
_SNIPPET_CHARS = 200


@dataclass(frozen=True)
class HTTPRequest:
    """One API call, independent of how it is executed (sync or async).

    `path` is relative to the client's base URL and already percent-encoded;
    `body` is serialized JSON or None; `headers` are added to the client's own.
    """

    method: str
    path: str
    params: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """`METHOD path`, for error messages (never includes headers or the body)."""
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class Reply:
    """A decoded success envelope: the HTTP status, the request id and `data`."""

    status_code: int
    request_id: str | None
    data: Any


def encode_json(value: Any) -> bytes:
    """Serialize a request body with orjson (compact, UTF-8)."""
    return orjson.dumps(value)


def _snippet(response: httpx.Response) -> str:
    text = response.content[: _SNIPPET_CHARS * 4].decode("utf-8", errors="replace")
    text = " ".join(text.split())
    return text[:_SNIPPET_CHARS] + ("…" if len(text) > _SNIPPET_CHARS else "")


def _load(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def _request_id(body: Any, response: httpx.Response) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("request_id"), str) and body["request_id"]:
        return body["request_id"]
    return response.headers.get("x-request-id") or None


def decode_response(request: HTTPRequest, response: httpx.Response) -> Reply:
    """Turn an HTTP answer into a `Reply`, or raise `APIError` / `TransportError` (see the module doc)."""
    status = response.status_code
    body = _load(response.content)
    rid = _request_id(body, response)
    if 200 <= status < 300:
        if isinstance(body, dict) and "data" in body and "error" not in body:
            return Reply(status, rid, body["data"])
        raise TransportError(
            f"{request.describe()}: HTTP {status} but the answer is not an Orbit envelope "
            f"({response.headers.get('content-type', 'no content type')}: {_snippet(response)!r}); "
            "the outcome is unknown: resend the same command (same idempotency key and content) to find out"
        )
    retry_after = parse_retry_after(response.headers.get("retry-after"))
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str) and error["code"]:
        message = error.get("message")
        details = error.get("details")
        raise APIError(
            error["code"],
            message if isinstance(message, str) else "",
            status_code=status,
            request_id=rid,
            details=details if isinstance(details, dict) else None,
            retry_after=retry_after,
        )
    if status in _GATEWAY_STATUSES:
        raise TransportError(
            f"{request.describe()}: HTTP {status} from an intermediary without an Orbit envelope "
            f"({_snippet(response)!r}); the outcome is unknown: resend the same command "
            "(same idempotency key and content) to find out"
        )
    if 300 <= status < 400:
        where = response.headers.get("location", "elsewhere")
        message = f"unexpected redirect (HTTP {status}) to {where}; check the base URL"
    else:
        ctype = response.headers.get("content-type", "no content type")
        message = f"unexpected answer without an Orbit envelope (HTTP {status}, {ctype}): {_snippet(response)!r}"
    raise APIError("INTERNAL", message, status_code=status, request_id=rid, retry_after=retry_after)


def _transport_error(request: HTTPRequest, exc: httpx.RequestError) -> TransportError:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "failed"
    detail = str(exc) or type(exc).__name__
    return TransportError(
        f"{request.describe()} {kind} before an answer arrived ({type(exc).__name__}: {detail}); "
        "the outcome is unknown: resend the same command (same idempotency key and content) to find out"
    )


def _client_kwargs(base_url: str, headers: dict[str, str], timeout: float | httpx.Timeout) -> dict[str, Any]:
    return {"base_url": base_url, "headers": headers, "timeout": timeout, "follow_redirects": False}


class SyncTransport:
    """Executes `HTTPRequest`s with an `httpx.Client` (blocking)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str],
        timeout: float | httpx.Timeout,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(transport=transport, **_client_kwargs(base_url, headers, timeout))

    def send(self, request: HTTPRequest) -> Reply:
        """Send one request and decode its envelope."""
        try:
            response = self._http.request(
                request.method, request.path, params=list(request.params), content=request.body,
                headers=list(request.headers),
            )
        except httpx.RequestError as exc:
            raise _transport_error(request, exc) from exc
        return decode_response(request, response)

    def close(self) -> None:
        """Close pooled connections (and the underlying httpx transport)."""
        self._http.close()


class AsyncTransport:
    """Executes `HTTPRequest`s with an `httpx.AsyncClient`."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str],
        timeout: float | httpx.Timeout,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(transport=transport, **_client_kwargs(base_url, headers, timeout))

    async def send(self, request: HTTPRequest) -> Reply:
        """Send one request and decode its envelope."""
        try:
            response = await self._http.request(
                request.method, request.path, params=list(request.params), content=request.body,
                headers=list(request.headers),
            )
        except httpx.RequestError as exc:
            raise _transport_error(request, exc) from exc
        return decode_response(request, response)

    async def aclose(self) -> None:
        """Close pooled connections (and the underlying httpx transport)."""
        await self._http.aclose()
