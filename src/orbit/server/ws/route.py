"""`GET /v1/workers/connect`: authenticate the upgrade, then hand over to a session."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket
from fastapi.responses import Response

from ..envelope import error_body, status_of
from ..errors import DomainError
from ..services.auth import authenticate
from .session import WorkerSession

router = APIRouter()


async def _deny(ws: WebSocket, error: DomainError) -> None:
    """Refuse the upgrade with an HTTP error envelope where the server supports it."""
    status = status_of(error)
    body = error_body("", error.code, error.message)
    try:
        await ws.send_denial_response(Response(body, status_code=status, media_type="application/json"))
    except Exception:
        await ws.close(4000 + status, error.message[:120])


@router.websocket("/v1/workers/connect")
async def connect(ws: WebSocket) -> None:
    node = ws.app.state.node
    try:
        who = await authenticate(node.db, ws.headers.get("authorization"))
        who.require("worker")
    except DomainError as exc:  # DatabaseUnavailable included: 503
        await _deny(ws, exc)
        return
    await ws.accept()
    await WorkerSession(ws, node.hub, who).run()
