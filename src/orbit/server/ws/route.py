"""`GET /v1/workers/connect`: authenticate the upgrade, then hand over to a session."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket
from fastapi.responses import Response

from ..core.ids import new_id
from ..envelope import error_body, status_of
from ..errors import DomainError
from ..services.auth import authenticate
from .session import WorkerSession

router = APIRouter()


def _state(ws: WebSocket) -> dict:
    """The upgrade's request state: its id (set by the request-id middleware) and credential."""
    return ws.scope.setdefault("state", {})


async def _deny(ws: WebSocket, error: DomainError) -> None:
    """Refuse the upgrade with an HTTP error envelope where the server supports it."""
    status = status_of(error)
    rid = _state(ws).setdefault("request_id", new_id())
    body = error_body(rid, error.code, error.message)
    retry = {"Retry-After": str(max(1, -(-error.retry_after_ms // 1000)))} if error.retry_after_ms else None
    try:
        await ws.send_denial_response(Response(body, status_code=status, media_type="application/json",
                                               headers=retry))
    except Exception:
        # A close reason holds 123 bytes: the request id first, then as much of the message as fits.
        await ws.close(4000 + status, f"request {rid}: {error.message}".encode()[:123].decode(errors="ignore"))


@router.websocket("/v1/workers/connect")
async def connect(ws: WebSocket) -> None:
    node = ws.app.state.node
    try:
        who = await authenticate(node.db, ws.headers.get("authorization"))
        who.require("worker")
    except DomainError as exc:  # DatabaseUnavailable included: 503
        await _deny(ws, exc)
        return
    _state(ws)["credential_id"] = who.credential_id  # named in the upgrade's log line
    await ws.accept()
    await WorkerSession(ws, node.hub, who).run()
