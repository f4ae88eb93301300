"""Refusing HTTP requests while the node drains: 503 UNAVAILABLE, "the node is draining".

After SIGTERM a node keeps serving its worker sessions until they hold no lease, which can take
seconds; meanwhile a load balancer may still send it requests. Answering them 503 with
`Retry-After` (and `/readyz` 503, so the balancer takes the node out) lets clients resend the same
identity to another node instead of starting work this node would cut short. `/healthz` keeps
answering: the process is up. Worker sessions (WebSocket) are drained by the hub, not here.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import DomainError
from ..node import Node
from .common import error_response

ALWAYS_SERVED = frozenset({"/healthz", "/metrics"})  # a draining node stays observable


def draining() -> DomainError:
    return DomainError("UNAVAILABLE", "the node is draining; retry with the same identity", retry_after_ms=1000)


class DrainingGate:
    """ASGI middleware: one check of `node.draining` per HTTP request, before routing (the submit
    fast path included). The answer closes the connection so that the client's next request opens
    a new one, which the balancer sends to a node that is ready."""

    def __init__(self, app: ASGIApp, node: Node) -> None:
        self.app = app
        self.node = node

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.node.draining or scope["path"] in ALWAYS_SERVED:
            await self.app(scope, receive, send)
            return
        response = error_response(Request(scope), draining(), headers={"Connection": "close"})
        await response(scope, receive, send)
