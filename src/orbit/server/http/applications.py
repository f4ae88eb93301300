"""Application routes: an application's quotas."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ...models import Application, ConfigureApplicationRequest, ConfigureApplicationResult
from ..services import applications as svc
from .common import Call
from .openapi import Envelope, body_spec, error_responses

router = APIRouter(prefix="/v1/applications", tags=["applications"])


@router.get(
    "/{application_id}",
    responses={200: {"model": Envelope[Application]}, **error_responses(401, 403, 404, 503)},
    summary="Get the credential's application with its live usage",
)
async def get_application(request: Request, application_id: str):
    async with Call(request) as call:
        who = call.require("applications:read")
        return call.answer(await svc.get_application(call.db, who, application_id))


@router.post(
    "/{application_id}:configure",
    openapi_extra=body_spec(ConfigureApplicationRequest),
    responses={200: {"model": Envelope[ConfigureApplicationResult]},
               **error_responses(400, 401, 403, 404, 409, 413, 415, 503)},
    summary="Replace every quota of the application",
)
async def configure_application(request: Request, application_id: str):
    async with Call(request) as call:
        call.require("applications:manage")
        raw, req = await call.body(ConfigureApplicationRequest)
        write = call.write(svc.OP_CONFIGURE, {"application_id": application_id}, raw)
        return call.outcome(await svc.configure_application(call.db, write, application_id, req))
