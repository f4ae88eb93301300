"""`GET /metrics`: the node's metrics in the Prometheus text format.

Unauthenticated, like /healthz beside it: scrapers carry no Orbit credential and
the figures name queues by id only, never a payload. Where that is too open, `metrics_listen`
serves them on a separate address (an internal interface) and takes them off the public
listener (see `Settings.metrics_on_public_listener`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from ..node import Node
from ..services.metrics import CONTENT_TYPE, NodeMetrics

router = APIRouter(tags=["health"])


@router.get("/metrics", summary="The node's metrics (Prometheus text format)", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
                             "description": "Prometheus text exposition format 0.0.4"}})
async def metrics(request: Request) -> Response:
    node: Node = request.app.state.node
    return Response(await node.metrics.render(), media_type=CONTENT_TYPE)


class MetricsOnly:
    """The ASGI app of the separate metrics listener: `GET /metrics` and nothing else."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            status, body, ctype = 404, b"not found\n", "text/plain; charset=utf-8"
        elif scope["method"] not in ("GET", "HEAD"):
            status, body, ctype = 405, b"method not allowed\n", "text/plain; charset=utf-8"
        else:
            status, body, ctype = 200, await self.metrics.render(), CONTENT_TYPE
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


@contextlib.asynccontextmanager
async def separate_listener(metrics: NodeMetrics, host: str, port: int) -> AsyncIterator[None]:
    """Serve `MetricsOnly` on host:port for as long as the context lasts. The socket is bound
    here, so that an address in use fails the node's start-up instead of a background task."""

    class Server(uvicorn.Server):
        def capture_signals(self):  # the node's own server handles the process's signals
            return contextlib.nullcontext()

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    server = Server(uvicorn.Config(MetricsOnly(metrics), lifespan="off", log_config=None, access_log=False,
                                   ws="none"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 5)
        sock.close()
