"""Task routes (`tasks.md`): submit, batch submit, reads, cancel."""

from __future__ import annotations

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
    TaskPage,
)

from ..errors import ApiError, invalid_argument
from ..services import tasks as svc
from ..services.auth import Principal, TokenCache
from ..services.idempotency import IdempotencyScope, request_digest
from .common import (
    decode_cursor,
    encode_cursor,
    idempotency_key,
    json_response,
    outcome_response,
    principal,
    principal_for_write,
    read_body,
    write_context,
)
from .openapi import Envelope, body_spec, error_responses

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
    who, verified = await principal_for_write(request)
    try:
        who.require("tasks:submit")
        who.require_queue(queue_id)
        raw, req = await read_body(request, SubmitTaskRequest)
        svc.check_payload_size(req, request.app.state.settings.max_payload_bytes)
        key = idempotency_key(request)
    except ApiError:
        if not verified:  # a revoked token hears 401, whatever else is wrong with the request
            await _forget_if_revoked(request)
        raise
    cmd = svc.SubmitCommand(key, svc.submit_digest(queue_id, raw), req, raw)
    queued = svc.QueuedSubmit(who, queue_id, cmd, verified)
    admission = await request.app.state.submits.submit(queued.group, queued)
    if admission.error is not None:
        if admission.error.code == "UNAUTHENTICATED":
            _forget_token(request)
        raise admission.error
    outcome = admission.outcome
    if not outcome.deduplicated:
        request.app.state.hub.notifier.notify(queue_id, 1)
    return outcome_response(request, outcome, 201)


async def _forget_if_revoked(request: Request) -> None:
    """Authenticate against the database; a token that fails is dropped from the cache."""
    try:
        await principal(request)
    except ApiError:
        _forget_token(request)
        raise


def _forget_token(request: Request) -> None:
    request.app.state.tokens.forget(TokenCache.key(request.headers.get("authorization")))


@router.post(
    "/v1/queues/{queue_id}/tasks:batch",
    openapi_extra=body_spec(BatchSubmitRequest),
    responses={200: {"model": Envelope[BatchSubmitResult]}, **WRITE_ERRORS},
    summary="Submit up to 500 tasks in one transaction",
)
async def submit_batch(request: Request, queue_id: str):
    who = await principal(request)
    who.require("tasks:submit")
    who.require_queue(queue_id)
    raw, req = await read_body(request, BatchSubmitRequest)
    items = req.tasks
    key = idempotency_key(request)
    limit = request.app.state.settings.max_payload_bytes
    commands = [svc.batch_item_command(queue_id, i, item, limit) for i, item in enumerate(items)]
    scope = IdempotencyScope(who.namespace_id, svc.OP_SUBMIT_BATCH, key, request_digest({"queue_id": queue_id}, raw))
    outcome = await svc.submit_batch(request.app.state.db, who, queue_id, scope, commands)
    request.app.state.hub.notifier.notify(queue_id, len(commands))
    return outcome_response(request, outcome)


@router.get(
    "/v1/tasks/{task_id}",
    responses={200: {"model": Envelope[Task]}, **error_responses(401, 403, 404, 503)},
    summary="Get a task",
)
async def get_task(request: Request, task_id: str):
    who = await principal(request)
    who.require("tasks:read")
    return json_response(request, await svc.get_task(request.app.state.db, who, task_id))


@router.get(
    "/v1/queues/{queue_id}/tasks",
    responses={200: {"model": Envelope[TaskPage]}, **error_responses(400, 401, 403, 404, 503)},
    summary="List a queue's tasks, newest first",
)
async def list_tasks(
    request: Request,
    queue_id: str,
    who: Principal = Depends(principal),
    limit: int = Query(100, ge=1, le=1000),
    cursor: str | None = Query(None),
    state: list[str] = Query([], description="repeatable state filter"),
    schedule_id: str | None = Query(None),
    created_after: str | None = Query(None, description="RFC 3339"),
    created_before: str | None = Query(None, description="RFC 3339"),
):
    who.require("tasks:read")
    flt = svc.parse_task_filter(state, schedule_id, created_after, created_before)
    items, last = await svc.list_tasks(
        request.app.state.db, who, queue_id, flt, limit=limit, before_id=decode_cursor(cursor)
    )
    return json_response(request, {"items": items, "next_cursor": encode_cursor(last)})


@router.get(
    "/v1/tasks/{task_id}/attempts",
    responses={200: {"model": Envelope[AttemptPage]}, **error_responses(400, 401, 403, 404, 503)},
    summary="List a task's attempts",
)
async def list_attempts(
    request: Request,
    task_id: str,
    who: Principal = Depends(principal),
    limit: int = Query(100, ge=1, le=1000),
    cursor: str | None = Query(None),
):
    who.require("tasks:read")
    after = decode_cursor(cursor)
    if after is not None and not after.isdigit():
        raise invalid_argument("cursor is not valid", "cursor")
    items, last = await svc.list_attempts(
        request.app.state.db, who, task_id, limit=limit, after_number=int(after) if after else None
    )
    return json_response(request, {"items": items, "next_cursor": encode_cursor(None if last is None else str(last))})


@router.post(
    "/v1/tasks/{task_id}:cancel",
    openapi_extra=body_spec(CancelTaskRequest),
    responses={200: {"model": Envelope[SubmitTaskResult]}, **WRITE_ERRORS},
    summary="Cancel a task",
)
async def cancel_task(request: Request, task_id: str):
    who = await principal(request)
    who.require("tasks:cancel")
    raw, req = await read_body(request, CancelTaskRequest)
    actor, scope = write_context(request, who, svc.OP_CANCEL, {"task_id": task_id}, raw)
    outcome = await svc.cancel_task(request.app.state.db, who, actor, scope, task_id, req)
    request.app.state.hub.wake_pushes()
    request.app.state.hub.notifier.notify(outcome.data["task"]["queue_id"], 1)
    return outcome_response(request, outcome)


@router.post(
    "/v1/tasks/{task_id}:review",
    openapi_extra=body_spec(ReviewTaskRequest),
    responses={200: {"model": Envelope[SubmitTaskResult]}, **WRITE_ERRORS},
    summary="Resolve a task whose outcome is unknown (NEEDS_REVIEW)",
)
async def review_task(request: Request, task_id: str):
    who = await principal(request)
    who.require("tasks:review")
    raw, req = await read_body(request, ReviewTaskRequest)
    actor, scope = write_context(request, who, svc.OP_REVIEW, {"task_id": task_id}, raw)
    outcome = await svc.review_task(request.app.state.db, who, actor, scope, task_id, req)
    request.app.state.hub.notifier.notify(outcome.data["task"]["queue_id"], 1)
    return outcome_response(request, outcome)



