"""Bounded admission of HTTP requests: a node under more load than it can serve answers the excess
at once with 503 UNAVAILABLE and `Retry-After`, instead of holding every request for as long as
the queue ahead of it takes. At most `limit` requests are in progress (`node.admission`, `Slots` in
overload.py); up to four times as many more wait at most `wait_s` for a slot, in arrival order.

The refusal is decided before routing, from a counter in memory: no token check, no body read, no
database. `/healthz`, `/readyz`, `/metrics` and the static files (the dashboard, the OpenAPI
document) are never refused; worker sessions (WebSocket) are not HTTP requests in progress and are
not counted; their commands are bounded by the group commits' own wait (batching.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import overloaded
from ..node import Node
from ..overload import WAIT_BUDGET_S, set_deadline, time_left, waits_until
from ..services.events import Waiter
from .common import error_response

if TYPE_CHECKING:
    from ..overload import Slots

ALWAYS_ADMITTED = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
_STATIC = "/ui"
HELD = "admission_slot"  # in the request's state: True while the request holds its slot


def _always_admitted(path: str) -> bool:
    return path in ALWAYS_ADMITTED or path == _STATIC or path.startswith(_STATIC + "/")


class AdmissionGate:
    """ASGI middleware: take a slot of `node.admission` for each HTTP request, or refuse it."""

    def __init__(self, app: ASGIApp, node: Node) -> None:
        self.app = app
        self.node = node

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _always_admitted(scope["path"]):
            await self.app(scope, receive, send)
            return
        admission = self.node.admission
        if not admission.try_enter() and not await admission.enter():
            response = error_response(Request(scope), overloaded())
            await response(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state[HELD] = True
        try:
            # Its waits inside (connections, the writer, group commits) end by this deadline.
            with waits_until(time.monotonic() + WAIT_BUDGET_S):
                await self.app(scope, receive, send)
        finally:
            if state.pop(HELD, False):
                admission.leave()


class WaitingWithoutSlot:
    """A long poll's waiter (the event feed's `Sequencer`) that gives the request's slot back while
    it waits, and takes one again (or answers UNAVAILABLE) before the request reads once more: a
    client polling with `wait_ms` holds no slot while nothing happens."""

    def __init__(self, request: Request, admission: Slots, waiter: Waiter) -> None:
        self._state = request.scope.setdefault("state", {})
        self._admission = admission
        self._waiter = waiter

    async def wait(self, key: str, timeout: float) -> None:
        if not self._state.get(HELD):
            await self._waiter.wait(key, timeout)
            return
        self._state[HELD] = False
        self._admission.leave()
        await self._waiter.wait(key, timeout)
        if not self._admission.try_enter() and not await self._admission.enter():
            raise overloaded()
        self._state[HELD] = True
        set_deadline(time.monotonic() + WAIT_BUDGET_S)  # a new budget for the next read


@contextlib.asynccontextmanager
async def holding(slots: Slots) -> AsyncIterator[None]:
    """One of `slots` (a narrower limit, such as the node's batch submits in progress) for the
    block, waited for within the request's budget; UNAVAILABLE when none came in time."""
    if not slots.try_enter() and not await slots.enter(time_left(slots.wait_s)):
        raise overloaded()
    try:
        yield
    finally:
        slots.leave()
