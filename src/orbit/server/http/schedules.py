"""Schedule routes.

A schedule is seen through its queue: a credential scoped to some queues creates schedules only
for them and finds no other (404, or left out of lists).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from ...models import (
    ConfigureScheduleRequest,
    CreateScheduleRequest,
    CreateScheduleResult,
    RetireScheduleRequest,
    Schedule,
    SchedulePage,
    ScheduleRunPage,
)
from ..services import schedules as svc
from .common import Call, authorized, decode_cursor
from .openapi import Envelope, body_spec, error_responses
from .params import Cursor, Flag, Id, Limit, Name

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
WRITE_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 415, 503)


@router.post(
    "",
    status_code=201,
    openapi_extra=body_spec(CreateScheduleRequest),
    responses={201: {"model": Envelope[CreateScheduleResult]}, 200: {"model": Envelope[CreateScheduleResult]},
               **WRITE_ERRORS},
    summary="Create a schedule that generates tasks into a queue",
)
async def create_schedule(request: Request):
    async with Call(request) as call:
        call.require("schedules:manage")
        raw, req = await call.body(CreateScheduleRequest)
        call.who.require_queue(req.queue_id)
        outcome = await svc.create_schedule(call.db, call.write(svc.OP_CREATE, {}, raw), req,
                                            payload_limit=call.node.settings.max_payload_bytes)
        return call.outcome(outcome, 201)


@router.get(
    "",
    responses={200: {"model": Envelope[SchedulePage]}, **error_responses(400, 401, 403, 503)},
    summary="List schedules in creation order",
)
async def list_schedules(
    call: Call = Depends(authorized("schedules:read")),
    limit: Annotated[Limit, Query()] = 100,
    cursor: Annotated[Cursor | None, Query()] = None,
    queue_id: Annotated[Id | None, Query(description="only the schedules of this queue")] = None,
    name: Annotated[Name | None, Query(description="only the schedule of this exact name")] = None,
    include_retired: Annotated[Flag, Query()] = False,
):
    who = call.who
    items, last = await svc.list_schedules(call.db, who, queue_id=queue_id, name=name,
                                           include_retired=include_retired, limit=limit,
                                           after_id=decode_cursor(cursor))
    return call.page(items, last)


@router.get(
    "/{schedule_id}",
    responses={200: {"model": Envelope[Schedule]}, **error_responses(401, 403, 404, 503)},
    summary="Get a schedule with its next trigger point",
)
async def get_schedule(request: Request, schedule_id: str):
    async with Call(request) as call:
        who = call.require("schedules:read")
        return call.answer(await svc.get_schedule(call.db, who, schedule_id))


@router.get(
    "/{schedule_id}/runs",
    responses={200: {"model": Envelope[ScheduleRunPage]}, **error_responses(400, 401, 403, 404, 503)},
    summary="List the trigger points a schedule handled, oldest first",
)
async def list_schedule_runs(
    schedule_id: str,
    call: Call = Depends(authorized("schedules:read")),
    limit: Annotated[Limit, Query()] = 100,
    cursor: Annotated[Cursor | None, Query()] = None,
):
    who = call.who
    items, last = await svc.list_runs(call.db, who, schedule_id, limit=limit, after=decode_cursor(cursor, valid=bool))
    return call.page(items, last)


@router.post(
    "/{schedule_id}:configure",
    openapi_extra=body_spec(ConfigureScheduleRequest),
    responses={200: {"model": Envelope[CreateScheduleResult]}, **WRITE_ERRORS},
    summary="Replace every field of a schedule but its name and queue",
)
async def configure_schedule(request: Request, schedule_id: str):
    async with Call(request) as call:
        call.require("schedules:manage")
        raw, req = await call.body(ConfigureScheduleRequest)
        write = call.write(svc.OP_CONFIGURE, {"schedule_id": schedule_id}, raw)
        outcome = await svc.configure_schedule(call.db, write, schedule_id, req,
                                               payload_limit=call.node.settings.max_payload_bytes)
        return call.outcome(outcome)


@router.post(
    "/{schedule_id}:retire",
    openapi_extra=body_spec(RetireScheduleRequest),
    responses={200: {"model": Envelope[CreateScheduleResult]}, **WRITE_ERRORS},
    summary="Retire a schedule permanently",
)
async def retire_schedule(request: Request, schedule_id: str):
    async with Call(request) as call:
        call.require("schedules:manage")
        raw, req = await call.body(RetireScheduleRequest)
        write = call.write(svc.OP_RETIRE, {"schedule_id": schedule_id}, raw)
        return call.outcome(await svc.retire_schedule(call.db, write, schedule_id, req))
