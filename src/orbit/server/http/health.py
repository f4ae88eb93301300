"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from ..envelope import error_body
from ..node import Node
from .common import json_response, request_id

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz(request: Request):
    return json_response(request, {"status": "ok"})


@router.get("/readyz", summary="The database answers and the schema is current")
async def readyz(request: Request):
    node: Node = request.app.state.node
    ok = await node.db.ping() and await node.schema_is_current()
    if ok and not node.draining:
        return json_response(request, {"status": "ready", "node_id": node.settings.node_id})
    message = "the node is draining" if node.draining else "the database is unreachable or the schema is not current"
    return Response(
        error_body(request_id(request), "UNAVAILABLE", message),
        status_code=503,
        media_type="application/json",
        headers={"Retry-After": "1"},
    )
