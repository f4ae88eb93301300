"""Request plumbing shared by every route: the request pipeline (`Call`), envelopes, bodies,
keys, cursors."""

from __future__ import annotations

import base64
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from ..._rules import is_idempotency_key
from ...models import StrictRequest, omitted_nulls
from ..core.ids import is_id
from ..envelope import error_body, status_of
from ..errors import (
    DomainError,
    describe_validation_error,
    invalid_argument,
    payload_too_large,
    unsupported_media_type,
)
from ..node import Node
from ..services.auth import Principal, TokenCache, authenticate, authenticate_for_write
from ..services.idempotency import IdempotencyScope, Outcome, WriteRequest, request_digest
from ..services.outbox import Actor

if TYPE_CHECKING:
    from ..store.db import Database

M = TypeVar("M", bound=StrictRequest)


def request_id(request: Request) -> str:
    return request.scope.get("state", {}).get("request_id") or ""


def json_response(request: Request, data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = orjson.dumps({"request_id": request_id(request), "data": data})
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error_response(request: Request, exc: DomainError, *, status: int | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    headers = dict(headers or {})
    if exc.retry_after_ms is not None:
        headers["Retry-After"] = str(max(1, -(-exc.retry_after_ms // 1000)))
    return Response(
        error_body(request_id(request), exc.code, exc.message, exc.details),
        status_code=status or status_of(exc),
        media_type="application/json",
        headers=headers,
    )


def outcome_response(request: Request, outcome: Outcome, created_status: int = 200) -> Response:
    """Replays are always 200 with the original snapshot and `deduplicated: true`."""
    data = {"deduplicated": outcome.deduplicated, **outcome.data}
    return json_response(request, data, 200 if outcome.deduplicated else created_status)


async def read_json_object(request: Request, limit: int) -> dict[str, Any]:
    """Enforce the media type and the size limit, then parse a JSON object."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise payload_too_large(limit)
    ctype = request.headers.get("content-type", "")
    if ctype.split(";", 1)[0].strip().lower() != "application/json":
        raise unsupported_media_type()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise payload_too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_argument(f"malformed JSON body: {exc.msg}") from None
    if not isinstance(value, dict):
        raise invalid_argument("the request body must be a JSON object")
    return value


def idempotency_key(request: Request) -> str:
    key = request.headers.get("idempotency-key")
    if key is None:
        raise invalid_argument("the Idempotency-Key header is required", "Idempotency-Key")
    if not is_idempotency_key(key):
        raise invalid_argument(
            "the Idempotency-Key header must be 1-128 visible ASCII characters", "Idempotency-Key"
        )
    return key


class Call:
    """One request's way through the protocol layer: authenticate once, then parse the body
    once, call the service once and answer once (`async with Call(request) as call:`).

    A write that re-checks revocation in its own transaction may trust a token this node
    has already seen (`trust_cache`), saving a lookup. If such a request fails before its
    transaction could check, the token is confirmed first, so that a revoked token hears
    401 whatever else is wrong with the request; a token found revoked leaves the cache.
    An UNAVAILABLE refusal is the exception: it changed nothing, and the retry will hear 401.
    """

    def __init__(self, request: Request, *, trust_cache: bool = False) -> None:
        self.request = request
        self.node: Node = request.app.state.node
        self._header = request.headers.get("authorization")
        self._trust_cache = trust_cache
        self.verified = True

    async def __aenter__(self) -> Call:
        node = self.node
        if self._trust_cache:
            self.who, self.verified = await authenticate_for_write(node.db, node.tokens, self._header)
        else:
            self.who = await authenticate(node.db, self._header)
        self.request.state.credential_id = self.who.credential_id  # named in the request's log line
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        # UNAVAILABLE (overloaded, or no database) changed nothing and says nothing of the token:
        # confirming it would only add a read where the node or the database is short of time.
        if self.verified or not isinstance(exc, DomainError) or exc.code == "UNAVAILABLE":
            return False
        key = TokenCache.key(self._header)
        if exc.code == "UNAUTHENTICATED":
            self.node.tokens.forget(key)
            return False
        try:
            await authenticate(self.node.db, self._header)
        except DomainError:
            self.node.tokens.forget(key)
            raise
        return False

    def revocation_checked(self, error: DomainError | None) -> None:
        """The service's transaction checked the token's revocation: nothing is left to confirm,
        and a token it found revoked leaves the cache."""
        if error is not None and error.code == "UNAUTHENTICATED":
            self.node.tokens.forget(TokenCache.key(self._header))
        self.verified = True

    @property
    def db(self) -> Database:
        return self.node.db

    def require(self, permission: str, *, all_queues: bool = False, queue_id: str | None = None) -> Principal:
        self.who.require(permission, all_queues=all_queues)
        if queue_id is not None:
            self.who.require_queue(queue_id)
        return self.who

    async def body(self, model: type[M]) -> tuple[dict[str, Any], M]:
        """The body as sent (optional fields given as null left out: the same request as without
        them, for the digest too) and as validated."""
        raw = omitted_nulls(model, await read_json_object(self.request, self.node.settings.max_body_bytes))
        try:
            return raw, model.model_validate(raw, context={"wire": True})
        except ValidationError as exc:
            raise describe_validation_error(exc) from None

    def idempotency_key(self) -> str:
        return idempotency_key(self.request)

    def write(self, operation: str, path_params: dict[str, Any], raw_body: Any) -> WriteRequest:
        """Who writes, through which request, under which idempotency scope."""
        key = self.idempotency_key()
        actor = Actor(credential_id=self.who.credential_id, request_id=request_id(self.request), idempotency_key=key)
        scope = IdempotencyScope(self.who.namespace_id, operation, key, request_digest(path_params, raw_body))
        return WriteRequest(self.who, actor, scope)

    def answer(self, data: Any, status: int = 200) -> Response:
        return json_response(self.request, data, status)

    def outcome(self, outcome: Outcome, created_status: int = 200) -> Response:
        return outcome_response(self.request, outcome, created_status)

    def page(self, items: list[Any], last: str | None) -> Response:
        return json_response(self.request, {"items": items, "next_cursor": encode_cursor(last)})


def authorized(permission: str, *, all_queues: bool = False) -> Callable[[Request], Awaitable[Call]]:
    """The `Call` of a route whose query parameters FastAPI validates, as a dependency that
    authenticates and checks the permission: FastAPI solves dependencies before it checks
    parameters, so a bad token (401) and a missing permission (403) are heard before a bad
    parameter (400), as on the routes that parse their own body."""

    async def dependency(request: Request) -> Call:
        call = await Call(request).__aenter__()
        call.require(permission, all_queues=all_queues)
        return call

    return dependency


def encode_cursor(last_id: str | None) -> str | None:
    if last_id is None:
        return None
    return base64.urlsafe_b64encode(orjson.dumps({"after": last_id})).decode().rstrip("=")


_POSITION = re.compile(r"[\x21-\x7e]{1,64}\Z")


def decode_cursor(cursor: str | None, valid: Callable[[str], bool] = is_id) -> str | None:
    """The position a cursor holds (an id unless `valid` says otherwise); a cursor this server
    did not hand out is a 400, never a value that reaches a statement."""
    if cursor is None:
        return None
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = orjson.loads(base64.urlsafe_b64decode(padded.encode()))
        after = value["after"]
        if isinstance(after, str) and _POSITION.match(after) and valid(after):
            return after
    except Exception:
        pass
    raise invalid_argument("cursor is not valid", "cursor")
