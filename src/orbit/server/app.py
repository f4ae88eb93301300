"""ASGI factory: routes, middleware, error envelopes, and the background loops."""

from __future__ import annotations

import contextlib
import inspect
import re
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .config import Settings, parse_address
from .core.ids import new_id
from .envelope import error_body
from .errors import DomainError, describe_errors, invalid_argument
from .http import applications, events, health, queues, resource_keys, schedules, tasks
from .http import audit as audit_routes
from .http import credential as credential_routes
from .http import ui as ui_routes
from .http import metrics as metrics_routes
from .http.admission import AdmissionGate
from .http.common import error_response
from .http.draining import DrainingGate
from .http.openapi import install_openapi
from .http.routing import MethodGate, allowed_methods, method_not_allowed
from .loops import BackgroundLoops
from .node import Node
from .services import dispatch, idempotency, scheduler, throughput
from .services import events as event_service
from .services import metrics
from .services import tasks as task_service
from .store.db import Database
from .ws import route as worker_route

log = structlog.get_logger("orbit.http")


class RequestIdMiddleware:
    """Assign the request id, echo it in `X-Request-Id`, and log one line per request (WebSocket
    upgrades included)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await _upgrade_with_id(self.app, scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = new_id()
        scope.setdefault("state", {})["request_id"] = rid
        started = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", rid.encode()))
                message = {**message, "headers": headers}
            await send(message)

        started_response = False

        async def send_tracked(message: Message) -> None:
            nonlocal started_response
            if message["type"] == "http.response.start":
                started_response = True
            await send_with_id(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            log.exception("internal_error", request_id=rid)
            if started_response:
                raise
            status = 500
            await send_with_id({
                "type": "http.response.start",
                "status": 500,
                "headers": [(b"content-type", b"application/json")],
            })
            await send_with_id({
                "type": "http.response.body",
                "body": error_body(rid, "INTERNAL", "internal error; the transaction was rolled back"),
            })
        finally:
            seconds = time.perf_counter() - started
            method, route = scope["method"], getattr(scope.get("route"), "path", None) or "unmatched"
            metrics.observe_request(method, route, status, seconds)
            # The route's template, never the raw path; the credential's id, never its token.
            log.info("request", request_id=rid, method=method, route=route, status=status,
                     latency_ms=round(seconds * 1000, 3), credential_id=scope["state"].get("credential_id"))


def _with_request_id(message: Message, rid: str) -> Message:
    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
    return {**message, "headers": [*headers, (b"x-request-id", rid.encode())]}


async def _upgrade_with_id(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """A WebSocket upgrade, as a request: its id in `X-Request-Id` of the handshake's answer
    (accepted or refused) and in a refusal's envelope, and one log line once it is decided. An
    upgrade closed before it was accepted (no such route: Starlette closes it) is answered with an
    error envelope too, where the server can answer the handshake with a body."""
    rid = new_id()
    state = scope.setdefault("state", {})
    state["request_id"] = rid
    started = time.perf_counter()
    can_answer = "websocket.http.response" in (scope.get("extensions") or {})
    status: int | None = None

    def decided(code: int) -> None:
        nonlocal status
        status = code
        # The route's template, never the raw path or its query; the credential's id, never its token.
        log.info("request", request_id=rid, method="GET", route=getattr(scope.get("route"), "path", None)
                 or "unmatched", status=code, latency_ms=round((time.perf_counter() - started) * 1000, 3),
                 credential_id=state.get("credential_id"), websocket=True)

    async def refuse(code: int, error: str, message: str) -> None:
        decided(code)
        await send({"type": "websocket.http.response.start", "status": code,
                    "headers": [(b"content-type", b"application/json"), (b"x-request-id", rid.encode())]})
        await send({"type": "websocket.http.response.body", "body": error_body(rid, error, message)})

    async def send_with_id(message: Message) -> None:
        kind = message["type"]
        if status is None:
            if kind == "websocket.accept":
                message = _with_request_id(message, rid)
                decided(101)
            elif kind == "websocket.http.response.start":
                message = _with_request_id(message, rid)
                decided(message["status"])
            elif kind == "websocket.close":
                if can_answer and scope.get("route") is None:
                    await refuse(404, "NOT_FOUND", "no such route")
                    return
                decided(403)
        await send(message)

    try:
        await app(scope, receive, send_with_id)
    except Exception:
        log.exception("internal_error", request_id=rid)
        if status is None and not can_answer:
            raise  # the server answers the handshake itself
        with contextlib.suppress(Exception):
            if status is None:
                await refuse(500, "INTERNAL", "internal error")
            elif status == 101:
                await send({"type": "websocket.close", "code": 1011, "reason": "internal error"})


_SUBMIT_PATH = re.compile(r"/v1/queues/([^/:]+)/tasks(:batch)?")  # a path parameter never holds a colon


class SubmitFastPath:
    """Serve `POST /v1/queues/{queue_id}/tasks` and `…/tasks:batch`, the producers' routes, without
    Starlette's router and FastAPI's endpoint machinery. The routes stay declared on the API
    (OpenAPI, fallback) and run the very same handlers and error handlers; only route matching,
    dependency solving and three middleware layers, a large share of a submit's CPU, are skipped."""

    def __init__(self, app: ASGIApp, api: FastAPI) -> None:
        self.app = app
        self.api = api
        # What the request log names.
        self.routes = (SimpleNamespace(path="/v1/queues/{queue_id}/tasks"),
                       SimpleNamespace(path="/v1/queues/{queue_id}/tasks:batch"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            m = _SUBMIT_PATH.fullmatch(scope["path"])
            if m is not None:
                queue_id, batch = m.group(1), m.group(2) is not None
                scope["route"] = self.routes[batch]
                scope["path_params"] = {"queue_id": queue_id}
                request = Request(scope, receive)
                try:
                    response = await (tasks.submit_task_batch if batch else tasks.submit_task)(request, queue_id)
                except DomainError as exc:
                    response = await self._handler(exc)(request, exc)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _handler(self, exc: Exception):
        for cls in type(exc).__mro__:
            if cls in self.api.exception_handlers:
                return self.api.exception_handlers[cls]
        raise exc


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DomainError)
    async def _orbit_error(request: Request, exc: DomainError):
        return error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return error_response(request, describe_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        # MethodGate answers a known path's other methods first; the router's 405 reaches here only
        # for a path no route has once its parameters stop at a colon (`/v1/queues/x:nothing`).
        allowed = allowed_methods(request.app, request.scope["path"]) if exc.status_code == 405 else []
        if exc.status_code == 404 or (exc.status_code == 405 and not allowed):
            return error_response(request, DomainError("NOT_FOUND", "no such route"))
        if exc.status_code == 405:
            return method_not_allowed(request, allowed)
        return error_response(request, invalid_argument(str(exc.detail)), status=exc.status_code)


def _no_fastapi_telemetry() -> dict[str, Any]:
    """Recent FastAPI releases look for an OpenTelemetry provider on every request; Orbit reports
    through its logs and metrics, so that per-request cost is switched off."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def operation_id(route: APIRoute) -> str:
    """Each operation's `operationId`: its handler's name in camelCase (`createQueue`, `submitTask`),
    which is what a generated client names its methods by."""
    head, *rest = route.name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def create_app(settings: Settings, db: Database | None = None) -> FastAPI:
    owns_db = db is None
    node = Node.create(settings, db or Database(settings.database_url, pool_size=settings.pool_size))
    database = node.db

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        listener = contextlib.AsyncExitStack()
        if settings.metrics_listen:
            await listener.enter_async_context(
                metrics_routes.separate_listener(node.metrics, *parse_address(settings.metrics_listen)))
        loops = BackgroundLoops(gate=database.health)  # paused while the database is unreachable
        node.hub.start()
        if settings.background_loops:
            retention = timedelta(seconds=settings.idempotency_retention_seconds)
            loops.every(60, "idempotency_prune", lambda: idempotency.prune(database, retention))
            loops.every(0.5, "deadline_sweep", lambda: task_service.sweep_deadlines(database))
            loops.every(0.5, "lease_recovery", lambda: dispatch.recover_expired_leases(database))
            loops.every(0.25, "scheduler", lambda: scheduler.run_once(database))
            events_kept = timedelta(seconds=settings.event_retention_seconds)
            loops.every(60, "event_retention", lambda: event_service.prune(
                database, retention=events_kept, max_rows=settings.event_retention_rows))
            loops.every(5, "queue_samples", lambda: throughput.sample(database))
            loops.every(60, "queue_samples_prune", lambda: throughput.prune(database))
        # Part of dispatch, not housekeeping: tasks parked on a resource key wait for it.
        loops.every(node.unparker.sweep_s, "unpark", node.unpark, wake=node.unparker.wake)
        # Part of the event feed: events are readable once numbered.
        loops.every(node.sequencer.sweep_s, "event_sequencer", node.sequencer.run_once, wake=node.sequencer.wake)
        try:
            yield
        finally:
            node.draining = True
            await listener.aclose()
            await loops.stop()
            await node.hub.stop()
            await node.submits.stop()
            if owns_db:
                await database.close()

    app = FastAPI(
        **_no_fastapi_telemetry(),
        title="Orbit",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        generate_unique_id_function=operation_id,
    )
    app.state.node = node
    _install_error_handlers(app)
    app.include_router(health.router)
    if settings.metrics_on_public_listener():
        app.include_router(metrics_routes.router)
    app.include_router(queues.router)
    app.include_router(tasks.router)
    app.include_router(applications.router)
    app.include_router(resource_keys.router)
    app.include_router(schedules.router)
    app.include_router(audit_routes.router)
    app.include_router(events.router)
    app.include_router(credential_routes.router)
    app.include_router(ui_routes.router)
    app.include_router(worker_route.router)
    install_openapi(app)
    app.add_middleware(MethodGate, api=app)  # inside the fast path: a submit needs no method check
    app.add_middleware(SubmitFastPath, api=app)
    app.add_middleware(AdmissionGate, node=node)  # bounded requests in progress, the fast path's too
    app.add_middleware(DrainingGate, node=node)  # outside the fast path, inside the request id
    app.add_middleware(RequestIdMiddleware)
    return app
