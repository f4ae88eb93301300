"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .common import error_body, json_response, request_id

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz(request: Request):
    return json_response(request, {"status": "ok"})


@router.get("/readyz", summary="The database answers and the schema is current")
async def readyz(request: Request):
    state = request.app.state
    ok = await state.db.ping() and await state.schema_is_current()
    if ok and not state.draining:
        return json_response(request, {"status": "ready", "node_id": state.settings.node_id})
    message = "the node is draining" if state.draining else "the database is unreachable or the schema is not current"
    return Response(
        error_body(request_id(request), "UNAVAILABLE", message),
        status_code=503,
        media_type="application/json",
        headers={"Retry-After": "1"},
    )
