"""Queue routes (`queues.md`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request

from ...models import ConfigureQueueRequest, CreateQueueRequest, CreateQueueResult, Queue, QueuePage, RetireQueueRequest
from ..services import queues as svc
from ..services.auth import Principal
from .common import (
    decode_cursor,
    encode_cursor,
    json_response,
    outcome_response,
    principal,
    read_body,
    write_context,
)
from .openapi import Envelope, body_spec, error_responses

router = APIRouter(prefix="/v1/queues", tags=["queues"])
WRITE_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 415, 503)


@router.post(
    "",
    status_code=201,
    openapi_extra=body_spec(CreateQueueRequest),
    responses={201: {"model": Envelope[CreateQueueResult]}, 200: {"model": Envelope[CreateQueueResult]}, **WRITE_ERRORS},
    summary="Create a queue",
)
async def create_queue(request: Request):
    who = await principal(request)
    who.require("queues:manage", all_queues=True)
    raw, req = await read_body(request, CreateQueueRequest)
    actor, scope = write_context(request, who, "queues.create", {}, raw)
    outcome = await svc.create_queue(request.app.state.db, svc.WriteRequest(who, actor, scope), req)
    return outcome_response(request, outcome, 201)


@router.get(
    "",
    responses={200: {"model": Envelope[QueuePage]}, **error_responses(400, 401, 403, 503)},
    summary="List queues in creation order",
)
async def list_queues(
    request: Request,
    who: Principal = Depends(principal),
    limit: int = Query(100, ge=1, le=1000),
    cursor: str | None = Query(None),
    name: str | None = Query(None, max_length=128),
    include_retired: bool = Query(False),
):
    who.require("queues:read", all_queues=True)
    items, last = await svc.list_queues(
        request.app.state.db, who, name=name, include_retired=include_retired, limit=limit,
        after_id=decode_cursor(cursor),
    )
    return json_response(request, {"items": items, "next_cursor": encode_cursor(last)})


@router.get(
    "/{queue_id}",
    responses={200: {"model": Envelope[Queue]}, **error_responses(401, 403, 404, 503)},
    summary="Get a queue with its live backlog",
)
async def get_queue(request: Request, queue_id: str):
    who = await principal(request)
    who.require("queues:read")
    return json_response(request, await svc.get_queue(request.app.state.db, who, queue_id))


@router.post(
    "/{queue_id}:configure",
    openapi_extra=body_spec(ConfigureQueueRequest),
    responses={200: {"model": Envelope[CreateQueueResult]}, **WRITE_ERRORS},
    summary="Replace every control of a queue",
)
async def configure_queue(request: Request, queue_id: str):
    who = await principal(request)
    who.require("queues:manage")
    who.require_queue(queue_id)
    raw, req = await read_body(request, ConfigureQueueRequest)
    actor, scope = write_context(request, who, "queues.configure", {"queue_id": queue_id}, raw)
    outcome = await svc.configure_queue(request.app.state.db, svc.WriteRequest(who, actor, scope), queue_id, req)
    return outcome_response(request, outcome)


@router.post(
    "/{queue_id}:retire",
    openapi_extra=body_spec(RetireQueueRequest),
    responses={200: {"model": Envelope[CreateQueueResult]}, **WRITE_ERRORS},
    summary="Retire a queue permanently",
)
async def retire_queue(request: Request, queue_id: str):
    who = await principal(request)
    who.require("queues:manage")
    who.require_queue(queue_id)
    raw, req = await read_body(request, RetireQueueRequest)
    actor, scope = write_context(request, who, "queues.retire", {"queue_id": queue_id}, raw)
    outcome = await svc.retire_queue(request.app.state.db, svc.WriteRequest(who, actor, scope), queue_id, req)
    return outcome_response(request, outcome)
