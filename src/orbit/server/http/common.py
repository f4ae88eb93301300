"""Request plumbing shared by every route: envelopes, bodies, keys, auth, cursors."""

from __future__ import annotations

import base64
from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from ..._rules import is_idempotency_key
from ..errors import ApiError, describe_validation_error, invalid_argument
from ..services.auth import Principal, authenticate, authenticate_for_write
from ..services.idempotency import IdempotencyScope, Outcome, request_digest
from ..services.outbox import Actor

M = TypeVar("M", bound=BaseModel)


def request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or ""


def json_response(request: Request, data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = orjson.dumps({"request_id": request_id(request), "data": data})
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error_body(rid: str, code: str, message: str, details: dict[str, Any] | None = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if details:
        err["details"] = details
    return orjson.dumps({"request_id": rid, "error": err})


def error_response(request: Request, exc: ApiError) -> Response:
    return Response(
        error_body(request_id(request), exc.code, exc.message, exc.details),
        status_code=exc.status,
        media_type="application/json",
        headers=exc.headers,
    )


def outcome_response(request: Request, outcome: Outcome, created_status: int = 200) -> Response:
    """Replays are always 200 with the original snapshot and `deduplicated: true`."""
    data = {"deduplicated": outcome.deduplicated, **outcome.data}
    return json_response(request, data, 200 if outcome.deduplicated else created_status)


async def principal(request: Request) -> Principal:
    return await authenticate(request.app.state.db, request.headers.get("authorization"))


async def principal_for_write(request: Request) -> tuple[Principal, bool]:
    """For writes that re-check revocation in their transaction: (principal, verified)."""
    return await authenticate_for_write(request.app.state.db, request.app.state.tokens,
                                        request.headers.get("authorization"))


async def read_json_object(request: Request) -> dict[str, Any]:
    """Enforce the media type and the size limit, then parse a JSON object."""
    limit: int = request.app.state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "PAYLOAD_TOO_LARGE", f"request body exceeds the {limit}-byte limit")
    ctype = request.headers.get("content-type", "")
    if ctype.split(";", 1)[0].strip().lower() != "application/json":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE", "requests with a body must send Content-Type: application/json")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "PAYLOAD_TOO_LARGE", f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_argument(f"malformed JSON body: {exc.msg}") from None
    if not isinstance(value, dict):
        raise invalid_argument("the request body must be a JSON object")
    return value


async def read_body(request: Request, model: type[M]) -> tuple[dict[str, Any], M]:
    raw = await read_json_object(request)
    try:
        return raw, model.model_validate(raw, context={"wire": True})
    except ValidationError as exc:
        raise describe_validation_error(exc) from None


def idempotency_key(request: Request) -> str:
    key = request.headers.get("idempotency-key")
    if key is None:
        raise invalid_argument("the Idempotency-Key header is required", "Idempotency-Key")
    if not is_idempotency_key(key):
        raise invalid_argument(
            "the Idempotency-Key header must be 1-128 visible ASCII characters", "Idempotency-Key"
        )
    return key


def write_context(
    request: Request, who: Principal, operation: str, path_params: dict[str, Any], raw_body: Any
) -> tuple[Actor, IdempotencyScope]:
    key = idempotency_key(request)
    actor = Actor(credential_id=who.credential_id, request_id=request_id(request), idempotency_key=key)
    scope = IdempotencyScope(who.namespace_id, operation, key, request_digest(path_params, raw_body))
    return actor, scope


def encode_cursor(last_id: str | None) -> str | None:
    if last_id is None:
        return None
    return base64.urlsafe_b64encode(orjson.dumps({"after": last_id})).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> str | None:
    if cursor is None:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = orjson.loads(base64.urlsafe_b64decode(padded.encode()))
        after = value["after"]
        if isinstance(after, str) and len(after) <= 64:
            return after
    except Exception:
        pass
    raise invalid_argument("cursor is not valid", "cursor")


def parse_bool_param(value: str | None, name: str, default: bool = False) -> bool:
    if value is None:
        return default
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise invalid_argument(f"{name}: must be true or false", name)


def parse_limit(value: str | None) -> int:
    if value is None:
        return 100
    if not value.isdigit() or not 1 <= int(value) <= 1000:
        raise invalid_argument("limit: must be an integer between 1 and 1000", "limit")
    return int(value)
