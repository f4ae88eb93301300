"""Which methods a path has, answered before routing (`MethodGate`).

Action endpoints end in `:action` on a resource path (`/v1/queues/{queue_id}:configure`) and a
path parameter never holds a colon (ids are hex). The router does not know that: it matches
`GET /v1/queues/x:configure` to `GET /v1/queues/{queue_id}` with `queue_id="x:configure"` and the
client hears "queue not found"; and for a method no route of a path has, its 405 names the
methods of the first route it tried only (`OPTIONS /v1/queues` heard `Allow: POST`). The gate
reads every route's template with parameters that stop at a colon, and answers a method that
no route of the path has with 405 and an `Allow` header listing the methods of all of them.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import invalid_argument
from .common import error_response

try:  # FastAPI >= 0.165 keeps included routers as routes of their own
    from fastapi.routing import iter_route_contexts
except ImportError:  # pragma: no cover - older FastAPI: the routes are the app's
    def iter_route_contexts(routes: Any) -> Any:  # type: ignore[misc]
        return routes

_PARAM = re.compile(r"{([a-zA-Z_][a-zA-Z0-9_]*)(?::([a-z]+))?}")


def _template(path: str) -> re.Pattern[str]:
    """A route's path as a regular expression; a plain parameter is one segment up to a colon."""
    out, last = [], 0
    for m in _PARAM.finditer(path):
        out.append(re.escape(path[last:m.start()]))
        out.append(".*" if m.group(2) == "path" else "[^/:]+" if m.group(2) is None else "[^/]+")
        last = m.end()
    out.append(re.escape(path[last:]))
    return re.compile("".join(out) + r"\Z")


def _routes(api: FastAPI) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    table = getattr(api.state, "method_table", None)
    if table is None:
        table = []
        for route in iter_route_contexts(api.router.routes):
            path, methods = getattr(route, "path", None), getattr(route, "methods", None)
            if isinstance(path, str) and methods:
                table.append((_template(path), frozenset(methods)))
        api.state.method_table = table
    return table


def allowed_methods(api: FastAPI, path: str) -> list[str]:
    """The methods of every HTTP route whose template matches `path` (none: no such route)."""
    return sorted({m for template, methods in _routes(api) if template.match(path) for m in methods})


def method_not_allowed(request: Request, allowed: list[str]) -> Any:
    error = invalid_argument(f"method {request.method} is not allowed here; allowed: {', '.join(allowed)}")
    return error_response(request, error, status=405, headers={"Allow": ", ".join(allowed)})


class MethodGate:
    """405 with the right `Allow` for a path some route has, asked with a method none of its
    routes has; everything else goes on to the router."""

    def __init__(self, app: ASGIApp, api: FastAPI) -> None:
        self.app = app
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            allowed = allowed_methods(self.api, scope["path"])
            if allowed and scope["method"] not in allowed:
                await method_not_allowed(Request(scope, receive), allowed)(scope, receive, send)
                return
        await self.app(scope, receive, send)
