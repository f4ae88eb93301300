"""Resource key routes.

A key belongs to the namespace, not to a queue: its routes need its permission only, like the
application's, whatever the credential's queue scope.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from ...models import (
    ConfigureResourceKeyRequest,
    CreateResourceKeyRequest,
    CreateResourceKeyResult,
    ResourceKey,
    ResourceKeyPage,
    RetireResourceKeyRequest,
)
from ..services import resource_keys as svc
from .common import Call, authorized, decode_cursor
from .openapi import Envelope, body_spec, error_responses
from .params import Cursor, Flag, Limit, Name

router = APIRouter(prefix="/v1/resource-keys", tags=["resource-keys"])
WRITE_ERRORS = error_responses(400, 401, 403, 404, 409, 413, 415, 503)


@router.post(
    "",
    status_code=201,
    openapi_extra=body_spec(CreateResourceKeyRequest),
    responses={201: {"model": Envelope[CreateResourceKeyResult]}, 200: {"model": Envelope[CreateResourceKeyResult]},
               **WRITE_ERRORS},
    summary="Create a resource key",
)
async def create_resource_key(request: Request):
    async with Call(request) as call:
        call.require("resource_keys:manage")
        raw, req = await call.body(CreateResourceKeyRequest)
        outcome = await svc.create_resource_key(call.db, call.write(svc.OP_CREATE, {}, raw), req)
        return call.outcome(outcome, 201)


@router.get(
    "",
    responses={200: {"model": Envelope[ResourceKeyPage]}, **error_responses(400, 401, 403, 503)},
    summary="List resource keys in creation order",
)
async def list_resource_keys(
    call: Call = Depends(authorized("resource_keys:read")),
    limit: Annotated[Limit, Query()] = 100,
    cursor: Annotated[Cursor | None, Query()] = None,
    name: Annotated[Name | None, Query(description="only the key of this exact name")] = None,
    include_retired: Annotated[Flag, Query()] = False,
):
    who = call.who
    items, last = await svc.list_resource_keys(call.db, who, name=name, include_retired=include_retired,
                                               limit=limit, after_id=decode_cursor(cursor))
    return call.page(items, last)


@router.get(
    "/{resource_key_id}",
    responses={200: {"model": Envelope[ResourceKey]}, **error_responses(401, 403, 404, 503)},
    summary="Get a resource key with its permits in use",
)
async def get_resource_key(request: Request, resource_key_id: str):
    async with Call(request) as call:
        who = call.require("resource_keys:read")
        return call.answer(await svc.get_resource_key(call.db, who, resource_key_id))


@router.post(
    "/{resource_key_id}:configure",
    openapi_extra=body_spec(ConfigureResourceKeyRequest),
    responses={200: {"model": Envelope[CreateResourceKeyResult]}, **WRITE_ERRORS},
    summary="Replace every control of a resource key",
)
async def configure_resource_key(request: Request, resource_key_id: str):
    async with Call(request) as call:
        call.require("resource_keys:manage")
        raw, req = await call.body(ConfigureResourceKeyRequest)
        write = call.write(svc.OP_CONFIGURE, {"resource_key_id": resource_key_id}, raw)
        return call.outcome(await svc.configure_resource_key(call.db, write, resource_key_id, req))


@router.post(
    "/{resource_key_id}:retire",
    openapi_extra=body_spec(RetireResourceKeyRequest),
    responses={200: {"model": Envelope[CreateResourceKeyResult]}, **WRITE_ERRORS},
    summary="Retire a resource key permanently",
)
async def retire_resource_key(request: Request, resource_key_id: str):
    async with Call(request) as call:
        call.require("resource_keys:manage")
        raw, req = await call.body(RetireResourceKeyRequest)
        write = call.write(svc.OP_RETIRE, {"resource_key_id": resource_key_id}, raw)
        return call.outcome(await svc.retire_resource_key(call.db, write, resource_key_id, req))
