"""`GET /v1/workers/connect`: authenticate the upgrade, then hand over to a session."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket
from fastapi.responses import Response

from ..errors import ApiError
from ..http.common import error_body
from ..services.auth import authenticate
from ..store.db import DatabaseUnavailable
from .session import WorkerSession

router = APIRouter()


async def _deny(ws: WebSocket, status: int, code: str, message: str) -> None:
    """Refuse the upgrade with an HTTP error envelope where the server supports it."""
    body = error_body("", code, message)
    try:
        await ws.send_denial_response(Response(body, status_code=status, media_type="application/json"))
    except Exception:
        await ws.close(4000 + status, message[:120])


@router.websocket("/v1/workers/connect")
async def connect(ws: WebSocket) -> None:
    hub = ws.app.state.hub
    try:
        who = await authenticate(ws.app.state.db, ws.headers.get("authorization"))
        who.require("worker")
    except ApiError as exc:
        await _deny(ws, exc.status, exc.code, exc.message)
        return
    except DatabaseUnavailable:
        await _deny(ws, 503, "UNAVAILABLE", "the database is unavailable")
        return
    await ws.accept()
    session = WorkerSession(ws, hub, who)
    await session.run()
