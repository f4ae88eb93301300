"""Queue routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from ...models import (
    ConfigureQueueRequest,
    CreateQueueRequest,
    CreateQueueResult,
    Queue,
    QueuePage,
    QueueThroughput,
    QueueUsage,
    RetireQueueRequest,
)
from ..core import throughput as rules
from ..services import live, throughput
from ..services import queues as svc
from .common import Call, authorized, decode_cursor
from .openapi import Envelope, body_spec, error_responses
from .params import Cursor, Flag, Limit, Name, number

router = APIRouter(prefix="/v1/queues", tags=["queues"])
WRITE_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 415, 503)


@router.post(
    "",
    status_code=201,
    openapi_extra=body_spec(CreateQueueRequest),
    responses={201: {"model": Envelope[CreateQueueResult]}, 200: {"model": Envelope[CreateQueueResult]},
               **WRITE_ERRORS},
    summary="Create a queue",
)
async def create_queue(request: Request):
    async with Call(request) as call:
        call.require("queues:manage", all_queues=True)
        raw, req = await call.body(CreateQueueRequest)
        outcome = await svc.create_queue(call.db, call.write("queues.create", {}, raw), req)
        return call.outcome(outcome, 201)


@router.get(
    "",
    responses={200: {"model": Envelope[QueuePage]}, **error_responses(400, 401, 403, 503)},
    summary="List queues in creation order",
)
async def list_queues(
    call: Call = Depends(authorized("queues:read", all_queues=True)),
    limit: Annotated[Limit, Query()] = 100,
    cursor: Annotated[Cursor | None, Query()] = None,
    name: Annotated[Name | None, Query(description="only the queue of this exact name")] = None,
    include_retired: Annotated[Flag, Query()] = False,
):
    who = call.who
    items, last = await svc.list_queues(call.db, who, name=name, include_retired=include_retired, limit=limit,
                                        after_id=decode_cursor(cursor))
    return call.page(items, last)


@router.get(
    "/{queue_id}",
    responses={200: {"model": Envelope[Queue]}, **error_responses(401, 403, 404, 503)},
    summary="Get a queue with its live backlog",
)
async def get_queue(request: Request, queue_id: str):
    async with Call(request) as call:
        who = call.require("queues:read")
        return call.answer(await svc.get_queue(call.db, who, queue_id))


@router.get(
    "/{queue_id}/usage",
    responses={200: {"model": Envelope[QueueUsage]}, **error_responses(401, 403, 404, 503)},
    summary="A queue's live usage: tasks per state, permits held, rate window, active worker nodes",
)
async def get_queue_usage(request: Request, queue_id: str):
    async with Call(request) as call:
        who = call.require("queues:read")
        return call.answer(await live.queue_usage(call.db, who, queue_id))


@router.get(
    "/{queue_id}/throughput",
    responses={200: {"model": Envelope[QueueThroughput]}, **error_responses(400, 401, 403, 404, 503)},
    summary="A queue's throughput history: Starts, successes and failures per 5-second bucket",
)
async def get_queue_throughput(
    queue_id: str,
    call: Call = Depends(authorized("queues:read")),
    minutes: Annotated[number(rules.MIN_MINUTES, rules.MAX_MINUTES), Query(
        description="the window: this many minutes of buckets, ending with the current one")] = rules.DEFAULT_MINUTES,
):
    who = call.who
    return call.answer(await throughput.queue_throughput(call.db, who, queue_id, minutes))


@router.post(
    "/{queue_id}:configure",
    openapi_extra=body_spec(ConfigureQueueRequest),
    responses={200: {"model": Envelope[CreateQueueResult]}, **WRITE_ERRORS},
    summary="Replace every control of a queue",
)
async def configure_queue(request: Request, queue_id: str):
    async with Call(request) as call:
        call.require("queues:manage", queue_id=queue_id)
        raw, req = await call.body(ConfigureQueueRequest)
        write = call.write("queues.configure", {"queue_id": queue_id}, raw)
        outcome = await svc.configure_queue(call.db, write, queue_id, req)
        # Resumed, or given more room: this node's waiting claims look again now, not at its next poll.
        call.node.wakeups.work_in(queue_id)
        return call.outcome(outcome)


@router.post(
    "/{queue_id}:retire",
    openapi_extra=body_spec(RetireQueueRequest),
    responses={200: {"model": Envelope[CreateQueueResult]}, **WRITE_ERRORS},
    summary="Retire a queue permanently",
)
async def retire_queue(request: Request, queue_id: str):
    async with Call(request) as call:
        call.require("queues:manage", queue_id=queue_id)
        raw, req = await call.body(RetireQueueRequest)
        write = call.write("queues.retire", {"queue_id": queue_id}, raw)
        return call.outcome(await svc.retire_queue(call.db, write, queue_id, req))
