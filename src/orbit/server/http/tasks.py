"""Task routes: submit, batch submit, reads, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from ...models import (
    AttemptPage,
    BatchSubmitRequest,
    BatchSubmitResult,
    CancelTaskRequest,
    ReviewTaskRequest,
    SubmitTaskRequest,
    SubmitTaskResult,
    Task,
    TaskBlockers,
    TaskPage,
)
from ..core.tracing import parse_traceparent
from ..errors import DomainError
from ..services import live
from ..services import tasks as svc
from ..services.idempotency import IdempotencyScope, request_digest
from .admission import holding
from .common import Call, authorized, decode_cursor
from .openapi import Envelope, body_spec, error_responses
from .params import Cursor, Id, Limit, Stamp, State

router = APIRouter(tags=["tasks"])
WRITE_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 415, 503)


@router.post(
    "/v1/queues/{queue_id}/tasks",
    status_code=201,
    openapi_extra=body_spec(SubmitTaskRequest),
    responses={
        201: {"model": Envelope[SubmitTaskResult]},
        200: {"model": Envelope[SubmitTaskResult]},
        **WRITE_ERRORS,
        **error_responses(429),
    },
    summary="Submit a task",
)
async def submit_task(request: Request, queue_id: str):
    # Trusts a token seen before: the submit's transaction re-checks its revocation.
    async with Call(request, trust_cache=True) as call:
        who = call.require("tasks:submit", queue_id=queue_id)
        raw, req = await call.body(SubmitTaskRequest)
        payload_text = svc.check_payload_size(req, call.node.settings.max_payload_bytes)
        cmd = svc.SubmitCommand(call.idempotency_key(), svc.submit_digest(queue_id, raw), req, raw,
                                traceparent=parse_traceparent(request.headers.get("traceparent")),
                                payload_text=payload_text)
        queued = svc.QueuedSubmit(who, queue_id, cmd, call.verified)
        admission = await call.node.submits.submit(queued.group, queued)
        call.revocation_checked(admission.error)
        if admission.error is not None:
            raise admission.error
        return call.outcome(admission.outcome, 201)


@router.post(
    "/v1/queues/{queue_id}/tasks:batch",
    openapi_extra=body_spec(BatchSubmitRequest),
    responses={200: {"model": Envelope[BatchSubmitResult]}, **WRITE_ERRORS},
    summary="Submit up to 500 tasks in one transaction",
)
async def submit_task_batch(request: Request, queue_id: str):
    # A batch is up to 500 submits' work: the node runs only a few at once (`node.batch_submits`),
    # from reading the body to the commit; the others wait their turn within the request's budget.
    # Trusts a token seen before: the batch's transaction re-checks its revocation.
    async with Call(request, trust_cache=True) as call, holding(call.node.batch_submits):
        who = call.require("tasks:submit", queue_id=queue_id)
        raw, req = await call.body(BatchSubmitRequest)
        limit = call.node.settings.max_payload_bytes
        trace = parse_traceparent(request.headers.get("traceparent"))
        commands = [svc.batch_item_command(queue_id, i, item, limit, trace) for i, item in enumerate(req.tasks)]
        scope = IdempotencyScope(who.namespace_id, svc.OP_SUBMIT_BATCH, call.idempotency_key(),
                                 request_digest({"queue_id": queue_id}, raw))
        try:
            outcome = await call.node.submit_batch(who, queue_id, scope, commands, verified=call.verified)
        except DomainError as exc:  # the transaction checked the token before it could refuse anything
            call.revocation_checked(exc)
            raise
        return call.outcome(outcome)


@router.get(
    "/v1/tasks/{task_id}/blockers",
    responses={200: {"model": Envelope[TaskBlockers]}, **error_responses(401, 403, 404, 503)},
    summary="Why a task is not running now: every control that holds it",
)
async def get_task_blockers(request: Request, task_id: str):
    async with Call(request) as call:
        who = call.require("tasks:read")
        return call.answer(await live.task_blockers(call.db, who, task_id))


@router.get(
    "/v1/tasks/{task_id}",
    responses={200: {"model": Envelope[Task]}, **error_responses(401, 403, 404, 503)},
    summary="Get a task",
)
async def get_task(request: Request, task_id: str):
    async with Call(request) as call:
        who = call.require("tasks:read")
        return call.answer(await svc.get_task(call.db, who, task_id))


@router.get(
    "/v1/queues/{queue_id}/tasks",
    responses={200: {"model": Envelope[TaskPage]}, **error_responses(400, 401, 403, 404, 503)},
    summary="List a queue's tasks, newest first",
)
async def list_tasks(
    queue_id: str,
    call: Call = Depends(authorized("tasks:read")),
    limit: Annotated[Limit, Query()] = 100,
    cursor: Annotated[Cursor | None, Query()] = None,
    state: Annotated[list[State], Query(description="repeatable state filter")] = [],
    schedule_id: Annotated[Id | None, Query(description="only the tasks this schedule generated")] = None,
    created_after: Annotated[Stamp | None, Query(description="only tasks accepted after this time")] = None,
    created_before: Annotated[Stamp | None, Query(description="only tasks accepted before this time")] = None,
):
    who = call.who
    flt = svc.parse_task_filter(state, schedule_id, created_after, created_before)
    items, last = await svc.list_tasks(call.db, who, queue_id, flt, limit=limit, before_id=decode_cursor(cursor))
    return call.page(items, last)


@router.get(
    "/v1/tasks/{task_id}/attempts",
    responses={200: {"model": Envelope[AttemptPage]}, **error_responses(400, 401, 403, 404, 503)},
    summary="List a task's attempts",
)
async def list_attempts(
    task_id: str,
    call: Call = Depends(authorized("tasks:read")),
    limit: Annotated[Limit, Query()] = 100,
    cursor: Annotated[Cursor | None, Query()] = None,
):
    who = call.who
    after = decode_cursor(cursor, valid=lambda text: text.isdigit() and len(text) <= 9)
    items, last = await svc.list_attempts(call.db, who, task_id, limit=limit,
                                          after_number=int(after) if after else None)
    return call.page(items, None if last is None else str(last))


@router.post(
    "/v1/tasks/{task_id}:cancel",
    openapi_extra=body_spec(CancelTaskRequest),
    responses={200: {"model": Envelope[SubmitTaskResult]}, **WRITE_ERRORS},
    summary="Cancel a task",
)
async def cancel_task(request: Request, task_id: str):
    async with Call(request) as call:
        call.require("tasks:cancel")
        raw, req = await call.body(CancelTaskRequest)
        outcome = await svc.cancel_task(call.db, call.write(svc.OP_CANCEL, {"task_id": task_id}, raw), task_id, req)
        call.node.wakeups.push()
        call.node.wakeups.work_in(outcome.data["task"]["queue_id"], 1)
        return call.outcome(outcome)


@router.post(
    "/v1/tasks/{task_id}:review",
    openapi_extra=body_spec(ReviewTaskRequest),
    responses={200: {"model": Envelope[SubmitTaskResult]}, **WRITE_ERRORS},
    summary="Resolve a task whose outcome is unknown (NEEDS_REVIEW)",
)
async def review_task(request: Request, task_id: str):
    async with Call(request) as call:
        call.require("tasks:review")
        raw, req = await call.body(ReviewTaskRequest)
        outcome = await svc.review_task(call.db, call.write(svc.OP_REVIEW, {"task_id": task_id}, raw), task_id, req)
        call.node.wakeups.work_in(outcome.data["task"]["queue_id"], 1)
        return call.outcome(outcome)
