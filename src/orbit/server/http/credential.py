"""`GET /v1/credential`: what the calling token is.

A client holding only a token (the dashboard after sign-in, a script) learns its application,
namespace, permissions and queue scope here instead of guessing them from refusals.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from ...models import CallerCredential
from .common import Call
from .openapi import Envelope, error_responses

router = APIRouter(prefix="/v1", tags=["credential"])


@router.get(
    "/credential",
    responses={200: {"model": Envelope[CallerCredential]}, **error_responses(401, 503)},
    summary="The calling credential: its application, namespace, permissions and queue scope",
)
async def get_credential(request: Request):
    async with Call(request) as call:
        who = call.who
        scope = who.queue_scope if isinstance(who.queue_scope, str) else list(who.queue_scope)
        return call.answer({"id": who.credential_id, "application_id": who.application_id,
                            "namespace_id": who.namespace_id, "permissions": sorted(who.permissions),
                            "queue_scope": scope})
