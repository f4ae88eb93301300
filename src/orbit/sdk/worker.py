"""The worker runtime: `orbit.Worker` owns the worker protocol so a handler only handles tasks.

```python
worker = orbit.Worker(client, queues=[queue_id], concurrency=8)

@worker.handler
async def handle(task: orbit.TaskContext):
    return {"echo": task.payload}

worker.run()        # until SIGTERM/SIGINT or worker.stop(), then drain
```

Rules the runtime follows:

- claims only up to free capacity, with long polls, plus a few tasks ahead when
  handlers are short (`prefetch`): a task claimed ahead waits for a free slot
  before its Start is asked for, and is released if none frees soon;
- asks for Start before calling the handler and never calls it without one; on
  `RATE_LIMITED` / `QUEUE_PAUSED` backs off (the server's `retry_after_ms` plus
  jitter) within the remaining lease and retries with the *same* message id,
  and releases the lease when it cannot start before the lease or the start
  deadline runs out;
- renews each running lease at a third of its length and exposes cancel
  requests (from renew replies and pushes) as `task.cancel_requested`; an async
  handler still running `cancel_grace` seconds after a cancel request is
  cancelled and the task is reported `cancelled`;
- reports outcomes with per-command message ids, keeps unacknowledged reports
  and replays them with the same ids after a reconnect;
- reconnects when its session is lost, keeping what it holds (leases stay
  valid on the server until they expire, through any node): given several
  server URLs, to the next one at once, backing off (exponentially, with
  jitter) only after a whole round of them failed (`failover.py`); on the new
  session it renews its running leases at once, so that pushes follow it;
- abandons a task whose lease was revoked (no report);
- on `stop()` or SIGTERM/SIGINT: claims nothing more, releases leases it has
  not started, lets running handlers finish within the drain deadline, then
  returns with `drained = True`;
- on a `drain` push (the node is shutting down) with one URL: claims nothing
  more through that node, finishes and reports its running work through it,
  and once the node closes the session reconnects through the same URL (a
  balancer sends it to a ready node) and goes on; with several URLs, or when
  the node lost its database (`database_unavailable`), it goes on through a new
  session at once, keeping what it holds.

Logs go to the stdlib logger ``orbit.worker`` as ``event key=value ...`` lines
(the fields are also attached as ``record.orbit``); payloads, results and
tokens are never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import gc
import inspect
import logging
import os
import random
import signal
import socket
import threading
import time
import types
import urllib.parse
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from ._threads import HandlerThreads
from .client import _read_credentials
from .errors import APIError, PermanentError, RetryableError, TransportError
from .failover import Failover
from .session import (
    SDK_NAME,
    WorkerConnectionClosed,
    WorkerProtocolError,
    WorkerSession,
    new_message_id,
    reply_result,
)

__all__ = ["TaskContext", "Worker"]

log = logging.getLogger("orbit.worker")

# Codes after which a lease is gone for good: stop working on it, report nothing more.
_LEASE_GONE = frozenset({"LEASE_EXPIRED", "LEASE_LOST", "TASK_CANCELLED", "START_DEADLINE_EXCEEDED", "NOT_FOUND"})
_START_BACKOFF = frozenset({"RATE_LIMITED", "QUEUE_PAUSED"})
_MAX_ERROR_CHARS = 4096
# With `prefetch=None`, as many tasks are claimed ahead as handlers end, on average, within this
# time: a task claimed ahead waits about that long for its slot, holding a permit meanwhile.
_PREFETCH_WAIT_S = 0.05


def _log(level: int, event: str, **fields: Any) -> None:
    if not log.isEnabledFor(level):
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    log.log(level, "%s %s", event, text, extra={"orbit": {"event": event, **fields}})


def _parse_ts(value: Any) -> datetime | None:
    if not value or not isinstance(value, str):
        return None
    try:
        ts = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC)


def _seconds_until(ts: datetime | None) -> float | None:
    if ts is None:
        return None
    return (ts - datetime.now(UTC)).total_seconds()


_tracer: Any = None
_otel: Any = None  # (trace, extract, context) once looked up; False without OpenTelemetry


def _otel_modules() -> Any:
    global _otel
    if _otel is None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.propagate import extract
        except ImportError:
            _otel = False
        else:
            _otel = (trace, extract, context)
    return _otel


_no_provider_until = 0.0  # time.monotonic() until which no tracer provider is assumed


def _provider_set(trace: Any) -> bool:
    """Whether the application set a tracer provider. Without one, asking costs an environment
    lookup per attempt: the answer "none" is kept for a second (a provider set later is seen then)."""
    global _no_provider_until
    now = time.monotonic()
    if now < _no_provider_until:
        return False
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        _no_provider_until = now + 1.0
        return False
    return True


def _start_in_attempt_span(ctx: TaskContext, start: Callable[[], Any]) -> tuple[Any, Any]:
    """`start()` (which creates the handler's task or thread job, copying the current context)
    inside a span for the attempt, child of the submit's trace context (`ctx.traceparent`);
    returns its result and the span, None when there is nothing to trace: no OpenTelemetry, or
    neither a tracer provider set nor a trace to continue."""
    otel = _otel_modules()
    if not otel:
        return start(), None
    trace, extract, context = otel
    if not ctx.traceparent and not _provider_set(trace):
        return start(), None
    global _tracer
    if _tracer is None:  # a proxy until the application sets its provider, then that provider's
        _tracer = trace.get_tracer("orbit.worker")
    parent = extract({"traceparent": ctx.traceparent}) if ctx.traceparent else None
    span = _tracer.start_span(
        "orbit.attempt", context=parent, kind=trace.SpanKind.CONSUMER,
        attributes={"orbit.task_id": ctx.id, "orbit.queue_id": ctx.queue_id, "orbit.attempt": ctx.attempt})
    token = context.attach(trace.set_span_in_context(span))
    try:
        return start(), span
    finally:
        context.detach(token)


@dataclass
class TaskContext:
    """What a handler gets for one started attempt.

    `cancel_requested` is an `asyncio.Event` for async handlers and a
    `threading.Event` for sync ones; it is set when the task's cancellation was
    requested (or its total deadline passed, or the worker is shutting down and
    the drain deadline is near). Return a JSON value to succeed; raise
    `orbit.RetryableError` (or any exception) to fail and be retried per the
    task's policy, `orbit.PermanentError` to fail for good.
    """

    id: str
    queue_id: str
    payload: Any
    attempt: int
    lease_id: str
    priority: int
    deadline_at: datetime | None
    start_deadline_at: datetime | None
    cancel_requested: Any  # asyncio.Event | threading.Event
    resource_keys: list[str] = field(default_factory=list)
    started_at: datetime | None = None
    start_receipt_id: str | None = None
    # The W3C trace context of the request that submitted the task, when it carried one.
    traceparent: str | None = None

    @property
    def task_id(self) -> str:
        return self.id


@dataclass(eq=False)
class _Link:
    """One connection to one server URL; a drain heard during its hello is kept for it."""

    url: str
    session: WorkerSession | None = None
    leaving: str | None = None  # the reason of the drain that makes the worker leave this node
    draining: bool = False  # the node drains: claim nothing through it, finish what runs, then reconnect


def _where(url: str) -> str:
    """A server URL as logged: host and port, never userinfo."""
    try:
        parts = urllib.parse.urlsplit(url)
        return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    except ValueError:
        return "?"


class _Gone(Exception):
    """Internal: the lease is no longer ours (revoked, expired, cancelled)."""


@dataclass(eq=False, slots=True)
class _Lease:
    lease: dict[str, Any]
    expires_mono: float  # conservative local estimate of the lease's expiry
    started: bool = False
    start_unknown: bool = False  # a Start was sent without a definitive answer
    resent: bool = False  # a command of this lease had to be resent after a disconnect
    revoked: bool = False
    shutdown: bool = False  # the handler was stopped by the drain deadline
    cancel_requested: bool = False
    ctx: TaskContext | None = None
    handler: asyncio.Future | None = None
    receipt: dict[str, Any] = field(default_factory=dict)
    runner: asyncio.Task | None = None
    grace_timer: asyncio.TimerHandle | None = None
    is_async: bool = True
    holds_slot: bool = False  # counted in Worker._busy
    ahead_timer: asyncio.TimerHandle | None = None  # claimed ahead: when it is given back if no slot frees
    start_msg_id: str | None = None  # one per lease: every resend of its Start is a replay
    started_mono: float = 0.0  # when its handler began
    renew_now: asyncio.Event | None = None  # set on a new session; made with its renewer
    renewer: asyncio.Task | None = None  # only once the handler has run long enough to need a renewal
    renew_at: float | None = None  # monotonic time of its first renewal, while its handler runs without one
    lease_id: str = field(init=False)
    task_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.lease_id = self.lease["lease_id"]
        self.task_id = self.lease["task_id"]


class Worker:
    """Runs one handler for tasks of `queues` with up to `concurrency` tasks at a time.

    `client` may be an `orbit.Client` / `orbit.AsyncClient` (its `url` and
    `token` are used) or a base URL string; `url=` and `token=` may be given
    directly instead. `Worker.from_env()` reads `ORBIT_URL` and
    `ORBIT_CREDENTIALS_FILE` (or `ORBIT_TOKEN`).

    `urls=[...]` gives the worker several nodes of one cluster instead of one
    URL (a client then supplies only the token). It connects to the first; when
    its session is lost (the node stopped, was killed, drains or lost its
    database) or a node refuses it, it goes on at once through the next URL,
    in order and round the list, and waits (`reconnect_initial` doubling to
    `reconnect_max`) only after a whole round without a session. Nodes share
    the database, so leases, Starts and unacknowledged reports carry over from
    one node to another. List them in a different order per worker to spread
    workers over the nodes.

    With one URL, a `drain` pushed by the server (its node is shutting down)
    makes the worker claim nothing more through that node while its running
    handlers finish and report through it; when the node closes the session,
    the worker reconnects through the same URL (a balancer sends it to a ready
    node) and goes on: a rolling restart behind a balancer never stops it. A
    `drain` whose reason is `database_unavailable` (the node lost its database)
    makes it reconnect at once, keeping what it holds. With several URLs every
    `drain` makes it go on through the next one at once.
    Sync handlers cannot be interrupted: one still running at the drain
    deadline is abandoned (its lease expires on the server) and `drained` is
    False.

    `concurrency` bounds the handlers running at once. While they are all busy
    the worker holds up to `prefetch` more tasks claimed ahead, so that a slot
    that frees takes its next task at once: by default (`None`) as many as its
    handlers end within ~50 ms on average (none for handlers that take a
    second or more), at most `concurrency`. A task claimed ahead holds a permit
    of its queue's concurrency while it waits; `prefetch=0` claims only for
    free slots (for queues whose `max_concurrency` is shared by few tasks).
    """

    def __init__(
        self,
        client: Any = None,
        *,
        queues: list[str] | tuple[str, ...],
        concurrency: int = 8,
        node_id: str | None = None,
        lease_ms: int = 30_000,
        url: str | None = None,
        urls: Sequence[str] | None = None,
        token: str | None = None,
        cancel_grace: float = 5.0,
        drain_timeout: float = 30.0,
        claim_wait_ms: int = 2_000,
        prefetch: int | None = None,
        reconnect_initial: float = 0.2,
        reconnect_max: float = 10.0,
        reply_timeout: float = 30.0,
        sdk: str = SDK_NAME,
    ) -> None:
        if urls is not None:
            if url is not None or isinstance(client, str):
                raise ValueError("give the Worker either one URL or urls=[...], not both")
            if isinstance(urls, str) or not all(isinstance(u, str) and u for u in urls):
                raise ValueError("urls must be a list of server URLs")
            # The same node twice would defeat going on through another one.
            urls = list(dict.fromkeys(urls))
        if isinstance(client, str):
            url = url or client
        elif client is not None:
            client_url = getattr(client, "url", None) or getattr(client, "base_url", None)
            url = url or (str(client_url) if client_url is not None else None)
            token = token or getattr(client, "token", None)
        if urls:
            url = None
        elif not url:
            raise ValueError("Worker needs a server URL (a client, a URL, url=... or urls=[...])")
        if not token:
            raise ValueError("Worker needs a token (a client, or token=...)")
        queues = [queues] if isinstance(queues, str) else list(queues)
        if not queues:
            raise ValueError("Worker needs at least one queue id")
        if not 1 <= concurrency <= 10_000:
            raise ValueError("concurrency must be between 1 and 10000")
        if not 1_000 <= lease_ms <= 600_000:
            raise ValueError("lease_ms must be between 1000 and 600000")
        if not 0 <= claim_wait_ms <= 30_000:
            raise ValueError("claim_wait_ms must be between 0 and 30000")
        if prefetch is not None and not 0 <= prefetch <= concurrency:
            raise ValueError("prefetch must be between 0 and concurrency (or None: as handlers allow)")
        self.urls: list[str] = [str(u) for u in urls] if urls else [str(url)]
        self._token = str(token)
        self.queues = queues
        self.concurrency = concurrency
        self.node_id = (node_id or socket.gethostname() or "worker")[:128]
        self.lease_ms = lease_ms
        self.cancel_grace = float(cancel_grace)
        self.drain_timeout = float(drain_timeout)
        self.claim_wait_ms = claim_wait_ms
        self.prefetch = prefetch
        self.reconnect_initial = reconnect_initial
        self.reconnect_max = reconnect_max
        self.reply_timeout = reply_timeout
        self.sdk = sdk
        self.drained = False
        self._handler: Callable[[TaskContext], Any] | None = None
        self._handler_is_async = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._stop_early = False
        self._finished = threading.Event()
        self._lock = threading.Lock()
        self._reset_runtime_state()

    def __repr__(self) -> str:  # never show the token
        where = f"url={self.urls[0]!r}" if len(self.urls) == 1 else f"urls={self.urls!r}"
        return f"Worker({where}, queues={self.queues!r}, concurrency={self.concurrency})"

    @property
    def url(self) -> str:
        """The server URL of the current session (while disconnected: the next one to try)."""
        failover = self._failover
        return failover.current if failover is not None else self.urls[0]

    # ------------------------------------------------------------ construction helpers

    @classmethod
    def from_env(cls, queues: list[str] | None = None, **kwargs: Any) -> Worker:
        """`ORBIT_URL` + `ORBIT_CREDENTIALS_FILE` (or `ORBIT_TOKEN`); queues default to
        `ORBIT_QUEUE_ID` or the credentials file's `queue_id`. `urls=[...]` replaces `ORBIT_URL`."""
        several = kwargs.get("urls") is not None
        url = os.environ.get("ORBIT_URL")
        if not url and not several:
            raise ValueError("ORBIT_URL is not set")
        token = os.environ.get("ORBIT_TOKEN", "").strip() or None
        creds: dict[str, Any] = {}
        path = os.environ.get("ORBIT_CREDENTIALS_FILE", "").strip()
        if path:
            # The file wins over ORBIT_TOKEN, as in Client.from_env: one process, one identity.
            creds = _read_credentials(str(Path(path).expanduser()))
            token = creds["token"]
        if not token:
            raise ValueError("set ORBIT_CREDENTIALS_FILE or ORBIT_TOKEN")
        if queues is None:
            q = os.environ.get("ORBIT_QUEUE_ID") or creds.get("queue_id")
            if not q:
                raise ValueError("no queues given and neither ORBIT_QUEUE_ID nor a queue_id in the credentials file")
            queues = [q]
        if several:
            return cls(token=token, queues=queues, **kwargs)
        return cls(url=url, token=token, queues=queues, **kwargs)

    def handler(self, fn: Callable[[TaskContext], Any]) -> Callable[[TaskContext], Any]:
        """Register the handler (decorator). Async functions run on the loop, others in a thread."""
        if self._handler is not None:
            raise RuntimeError("a Worker has exactly one handler")
        self._handler = fn
        self._handler_is_async = inspect.iscoroutinefunction(fn) or (
            not inspect.isfunction(fn) and inspect.iscoroutinefunction(type(fn).__call__)
        )
        return fn

    # ------------------------------------------------------------ public control

    def run(self) -> None:
        """Blocking: run until SIGTERM/SIGINT or `stop()`, then drain and return.

        The worker owns the process from here, so what the program built before it (modules,
        configuration) is frozen out of the garbage collector's sight (`gc.freeze`): each task's
        objects outlive a young collection while its attempt is in flight, which would otherwise
        bring a full collection, through all of it, every few hundred tasks. Its loop is uvloop's
        when uvloop is installed (as the server's is): its transports cost less per frame.
        """
        gc.freeze()
        try:
            import uvloop
        except ImportError:
            asyncio.run(self._run_with_signals())
            return
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self._run_with_signals())

    async def arun(self) -> None:
        """Run on the current event loop until a drain (stop or signal) completes."""
        if self._handler is None:
            raise RuntimeError("register a handler with @worker.handler before running")
        if self._running:
            raise RuntimeError("this Worker is already running")
        self._reset_runtime_state()
        self._finished.clear()
        self.drained = False
        self._drain_event = asyncio.Event()
        self._hard_stop = asyncio.Event()
        self._session_ready = asyncio.Event()
        self._link: _Link | None = None
        self._capacity = asyncio.Event()
        with self._lock:
            self._loop = asyncio.get_running_loop()
            self._running = True
            stop_early = self._stop_early
        if not self._handler_is_async:
            self._executor = HandlerThreads(asyncio.get_running_loop(), self.concurrency)
        _log(logging.INFO, "worker_starting", node_id=self.node_id, queues=",".join(self.queues),
             concurrency=self.concurrency)
        if stop_early:
            self._request_drain(self.drain_timeout, "stop")
        conn = asyncio.create_task(self._connection_loop(), name="orbit-worker-connection")
        claims = asyncio.create_task(self._claim_loop(), name="orbit-worker-claims")
        fatal: BaseException | None = None
        try:
            drain_wait = asyncio.create_task(self._drain_event.wait())
            try:
                await asyncio.wait({drain_wait, conn}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                drain_wait.cancel()
            if conn.done() and not conn.cancelled() and conn.exception() is not None:
                fatal = self._fatal = conn.exception()
                self._request_drain(0, "fatal")
            await self._drain(claims, conn)
        except asyncio.CancelledError:
            self._abort_all()
            raise
        finally:
            for t in (claims, conn):
                t.cancel()
            for t in (claims, conn):
                with contextlib.suppress(BaseException):
                    await t
            if self._session is not None:
                await self._session.close()
            if self._executor is not None:
                self._executor.shutdown()
            if self._renew_tick is not None:
                self._renew_tick.cancel()
                self._renew_tick = None
            with self._lock:
                self._running = False
                self._stop_early = False
            self._finished.set()
        if fatal is not None:
            _log(logging.ERROR, "worker_failed", error=type(fatal).__name__)
            raise fatal

    def stop(self) -> None:
        """Ask for a drain (thread-safe); `run()`/`arun()` return once it is done."""
        with self._lock:
            loop = self._loop
            if not self._running or loop is None or loop.is_closed():
                self._stop_early = True
                return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if current is loop:
            self._request_drain(self.drain_timeout, "stop")
        else:
            loop.call_soon_threadsafe(self._request_drain, self.drain_timeout, "stop")

    async def astop(self) -> None:
        """Ask for a drain and wait until the worker has drained."""
        self.stop()
        if not self._running:
            return
        if self._loop is asyncio.get_running_loop():
            while self._running:
                await asyncio.sleep(0.02)
        else:
            await asyncio.to_thread(self._finished.wait)

    @property
    def pending_reports(self) -> int:
        """Outcome reports sent but not acknowledged yet (kept for replay)."""
        return len(self._unacked)

    @property
    def in_flight(self) -> int:
        """Leases held right now (claimed, starting, running or reporting)."""
        return len(self._leases)

    # ------------------------------------------------------------ internals: lifecycle

    def _reset_runtime_state(self) -> None:
        self._session: WorkerSession | None = None
        self._leases: dict[str, _Lease] = {}
        self._busy = 0  # leases holding one of the `concurrency` slots: from the claim to the handler's end
        self._ahead: deque[_Lease] = deque()  # leases claimed ahead, waiting for a slot, in claim order
        self._handler_s: float | None = None  # the handlers' recent duration (moving average)
        self._unacked: dict[str, dict[str, Any]] = {}
        self._draining = False
        self._drain_deadline: float | None = None
        self._executor: HandlerThreads | None = None
        self._abandoned = 0
        self._signals = 0
        self._fatal: BaseException | None = None
        self._closing: set[asyncio.Task] = set()
        self._renew_tick: asyncio.TimerHandle | None = None
        self._failover: Failover | None = None

    async def _run_with_signals(self) -> None:
        loop = asyncio.get_running_loop()
        installed = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
        try:
            await self.arun()
        finally:
            for sig in installed:
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals == 1:
            _log(logging.INFO, "signal_received", signal=signal.Signals(sig).name, action="drain")
            self._request_drain(self.drain_timeout, "signal")
        else:
            _log(logging.WARNING, "signal_received", signal=signal.Signals(sig).name, action="stop_now")
            self._request_drain(0, "signal")

    def _request_drain(self, timeout: float, reason: str) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        if self._drain_deadline is None or deadline < self._drain_deadline:
            self._drain_deadline = deadline
        if not self._draining:
            self._draining = True
            _log(logging.INFO, "drain_requested", reason=reason, deadline_s=round(timeout, 3),
                 in_flight=len(self._leases))
        self._drain_event.set()
        self._capacity.set()
        self._give_back_ahead()
        if timeout <= 0:
            self._hard_stop.set()

    async def _drain(self, claims: asyncio.Task, conn: asyncio.Task) -> None:
        """Stop claiming, release what has not started, let handlers finish within the deadline."""

        def remaining() -> float:
            return max(0.0, (self._drain_deadline or time.monotonic()) - time.monotonic())

        # The claim loop stops on its own; an outstanding claim is awaited so that
        # leases it was granted are released rather than left to expire.
        await self._wait_until(lambda: claims.done(), remaining)
        if not claims.done():
            claims.cancel()
        await self._wait_until(lambda: not self._leases, remaining)
        if self._leases:
            # Deadline: stop async handlers (reported failed/retryable), give reports a moment.
            for st in list(self._leases.values()):
                if st.handler is not None and not st.handler.done():
                    st.shutdown = True
                    if st.ctx is not None:
                        self._set_event(st)
                    if st.is_async:
                        st.handler.cancel()
            connected = self._session is not None and not self._session.closed
            grace_end = time.monotonic() + (min(5.0, max(1.0, self.cancel_grace)) if connected else 0.5)
            await self._wait_until(lambda: not self._leases, lambda: max(0.0, grace_end - time.monotonic()))
        leftover = list(self._leases.values())
        self._leases.clear()  # what they still do is not reported
        for st in leftover:
            self._abandoned += 1
            _log(logging.WARNING, "lease_abandoned_at_shutdown", task_id=st.task_id, lease_id=st.lease_id,
                 started=st.started)
            self._drop(st)
        for st in leftover:
            if st.runner is not None:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(st.runner, 1)
        self._leases.clear()
        self.drained = self._abandoned == 0 and not self._unacked and not self._fatal
        _log(logging.INFO if self.drained else logging.WARNING, "worker_drained", drained=self.drained,
             abandoned=self._abandoned)

    @staticmethod
    async def _wait_until(cond: Callable[[], bool], remaining: Callable[[], float]) -> None:
        while not cond():
            left = remaining()
            if left <= 0:
                return
            await asyncio.sleep(min(0.05, left))

    def _abort_all(self) -> None:
        leases = list(self._leases.values())
        self._leases.clear()
        for st in leases:
            self._drop(st)

    @staticmethod
    def _drop(st: _Lease) -> None:
        """Stop everything the worker does for a lease it abandons."""
        st.renew_at = None
        for timer in (st.grace_timer, st.ahead_timer):
            if timer is not None:
                timer.cancel()
        for task in (st.runner, st.renewer):
            if task is not None:
                task.cancel()
        if st.handler is not None and st.is_async:
            st.handler.cancel()

    # ------------------------------------------------------------ internals: connection

    async def _connection_loop(self) -> None:
        failover = self._failover = Failover(self.urls, self.reconnect_initial, self.reconnect_max)
        attempt = opened = 0
        while True:
            if self._hard_stop.is_set() or (self._draining and not self._leases and not self._unacked):
                return
            attempt += 1
            link = _Link(failover.current)
            try:
                session = await WorkerSession.connect(
                    link.url, self._token, self.node_id, self.queues, sdk=self.sdk,
                    on_push=functools.partial(self._on_push, link), reply_timeout=self.reply_timeout,
                )
            except APIError as exc:
                if exc.status_code in (401, 403, 404):
                    _log(logging.ERROR, "connect_refused", server=_where(link.url), status=exc.status_code,
                         code=exc.code)
                    raise
                wait = failover.failed(exc.retry_after)
                _log(logging.WARNING, "connect_failed", server=_where(link.url), status=exc.status_code,
                     code=exc.code, attempt=attempt, retry_in_s=round(wait, 2))
            except WorkerProtocolError as exc:
                if exc.code in ("NOT_FOUND", "PERMISSION_DENIED", "INVALID_ARGUMENT", "UNAUTHENTICATED"):
                    _log(logging.ERROR, "hello_refused", server=_where(link.url), code=exc.code)
                    raise
                wait = failover.failed()
                _log(logging.WARNING, "hello_failed", server=_where(link.url), code=exc.code, attempt=attempt,
                     retry_in_s=round(wait, 2))
            except TransportError as exc:
                wait = failover.failed()
                _log(logging.WARNING, "connect_failed", server=_where(link.url), error=type(exc).__name__,
                     attempt=attempt, retry_in_s=round(wait, 2))
            else:
                failover.connected(time.monotonic())
                opened += 1
                if opened > 1:
                    _log(logging.INFO, "reconnected", server=_where(link.url), session_id=session.session_id,
                         attempts=attempt, pending_reports=len(self._unacked), in_flight=len(self._leases))
                else:
                    _log(logging.INFO, "connected", server=_where(link.url), session_id=session.session_id)
                attempt = 0
                link.session = session
                if link.leaving:  # the node drained while it answered the hello
                    self._leave(link)
                else:
                    self._link = link
                    self._session = session
                    self._session_ready.set()
                    if opened > 1:
                        self._renew_running_leases()
                try:
                    await session.wait_closed()
                finally:
                    self._session_ready.clear()
                    self._session = None
                    await session.close()
                wait = failover.lost(time.monotonic())
                _log(logging.WARNING if not (self._draining or link.leaving or link.draining) else logging.INFO,
                     "disconnected",
                     server=_where(link.url), code=session.close_code, in_flight=len(self._leases),
                     retry_in_s=round(wait, 2))
                if session.close_code == 4401:
                    raise APIError("UNAUTHENTICATED", "the credential was revoked", status_code=401)
            await asyncio.sleep(wait)

    def _renew_running_leases(self) -> None:
        """On a new session: renew every running lease now, so that the server sends its pushes
        (cancel requests, revocations) here rather than to the session that is gone."""
        for st in self._leases.values():
            if st.started:
                if st.renew_now is not None:
                    st.renew_now.set()
                if st.renewer is None and st.renew_at is not None:
                    st.renew_at = None
                    self._start_renewer(st)

    async def _current_session(self, abort_on_drain: bool = False) -> WorkerSession:
        while True:
            s = self._session
            if s is not None and not s.closed:
                return s
            if abort_on_drain and self._draining:
                raise _Gone()
            if s is not None:  # closed, and the connection loop has not noticed yet
                await asyncio.sleep(0.02)
                continue
            if abort_on_drain:
                await self._sleep_unless_draining(0.5)
                continue
            await self._session_ready.wait()

    async def _command(self, kind: str, msg_id: str, st: _Lease | None = None, *, abort_on_drain: bool = False,
                       **fields: Any) -> dict[str, Any]:
        """Send one command and return its reply, resending the SAME message id across
        disconnects and `UNAVAILABLE` answers until the server answers definitively.

        Raises `_Gone` when the lease was revoked meanwhile (or, with
        `abort_on_drain`, when a drain began while no session was open)."""
        backoff = 0.2
        while True:
            if st is not None and st.revoked:
                raise _Gone()
            session = await self._current_session(abort_on_drain)
            try:
                if kind == "claim":
                    return {"tasks": await session.claim(msg_id=msg_id, **fields)}
                return await session.call(kind, msg_id=msg_id, **fields)
            except WorkerConnectionClosed:
                if st is not None:
                    st.resent = True
                if not session.closed:  # a reply timed out on a live socket: resend on it
                    await asyncio.sleep(min(backoff, 2.0) * random.uniform(0.5, 1.5))
                    backoff = min(backoff * 2, 5.0)
                continue
            except WorkerProtocolError as exc:
                if exc.code != "UNAVAILABLE":
                    raise
                backoff = await self._wait_unavailable(kind, exc, backoff)

    @staticmethod
    async def _wait_unavailable(kind: str, exc: WorkerProtocolError, backoff: float) -> float:
        """Wait before sending a command the server answered UNAVAILABLE again; the next backoff."""
        wait = max(backoff, (exc.retry_after_ms or 0) / 1000) * random.uniform(0.8, 1.3)
        _log(logging.WARNING, "server_unavailable", command=kind, retry_in_s=round(wait, 2))
        await asyncio.sleep(wait)
        return min(backoff * 2, 5.0)

    def _on_push(self, link: _Link, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "drain" and (msg.get("reason") == "database_unavailable" or len(self.urls) > 1):
            link.leaving = str(msg.get("reason") or "draining")
            self._leave(link)
            return
        if kind == "drain":
            if not link.draining:
                link.draining = True
                _log(logging.INFO, "server_draining", server=_where(link.url), action="finish_then_reconnect",
                     in_flight=len(self._leases))
            return
        st = self._leases.get(str(msg.get("lease_id")))
        if st is None:
            return
        if kind == "cancel_requested":
            self._cancel_requested(st, "push")
        elif kind == "lease_revoked":
            self._revoke(st, str(msg.get("reason") or "revoked"))

    def _leave(self, link: _Link) -> None:
        """The node lost its database or drains: keep the handlers running and go on through a
        new session, on the next URL when there are several (with one, a balancer gives the same
        URL to a node that is ready; this one's readiness fails meanwhile). Leases, pending
        Starts and unacknowledged reports carry over with their message ids."""
        session = link.session
        if session is None or session.closed:
            return  # still in its hello: closed as soon as it is open
        event = "server_lost_database" if link.leaving == "database_unavailable" else "server_draining"
        _log(logging.WARNING, event, server=_where(link.url), action="reconnect", in_flight=len(self._leases))
        task = asyncio.get_running_loop().create_task(session.close(1001, "reconnecting elsewhere"))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # ------------------------------------------------------------ internals: claiming

    def _free_slot(self, st: _Lease) -> None:
        """The lease's handler ended (or it will never run): its slot takes the next task while
        its report, if any, is still on its way."""
        if not st.holds_slot:
            return
        st.holds_slot = False
        while self._ahead:
            nxt = self._ahead.popleft()
            if nxt.ahead_timer is not None:
                nxt.ahead_timer.cancel()
                nxt.ahead_timer = None
            if self._leases.get(nxt.lease_id) is not nxt:
                continue
            nxt.holds_slot = True
            self._capacity.set()
            self._begin(nxt)
            return
        self._busy -= 1
        self._capacity.set()

    def _room(self) -> int:
        """How many tasks a claim may ask for now: free slots plus room to claim ahead."""
        return self.concurrency - self._busy + self._prefetch_now() - len(self._ahead)

    def _prefetch_now(self) -> int:
        """How many tasks to hold claimed ahead of a free slot now."""
        if self.prefetch is not None:
            return self.prefetch
        if self._handler_s is None:
            return 0
        return min(self.concurrency, int(self.concurrency * _PREFETCH_WAIT_S / max(self._handler_s, 1e-4)))

    def _handler_ended(self, seconds: float) -> None:
        avg = self._handler_s
        self._handler_s = seconds if avg is None else 0.8 * avg + 0.2 * seconds

    def _hold_ahead(self, st: _Lease) -> None:
        """A task claimed ahead waits for a slot, at most a quarter of its lease and never so
        long that its Start could not come in time; then it is given back."""
        wait = min(self.lease_ms / 4000, self._start_limit(st) - time.monotonic() - 1.0)
        self._ahead.append(st)
        st.ahead_timer = self._running_loop().call_later(max(0.0, wait), self._give_back, st, "no_free_slot")

    def _give_back(self, st: _Lease, reason: str) -> None:
        if st.ahead_timer is not None:
            st.ahead_timer.cancel()
            st.ahead_timer = None
        with contextlib.suppress(ValueError):
            self._ahead.remove(st)
        self._spawn(st, self._release_and_finish(st, reason))

    def _give_back_ahead(self) -> None:
        """Draining: the tasks claimed ahead go back to their queue rather than wait for a slot."""
        for st in list(self._ahead):
            self._give_back(st, "draining")

    async def _release_and_finish(self, st: _Lease, reason: str) -> None:
        try:
            if not st.revoked:
                await self._release(st, reason)
        except _Gone:
            _log(logging.INFO, "lease_abandoned", task_id=st.task_id, lease_id=st.lease_id, reason="revoked")
        finally:
            self._finish(st)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The loop `arun` runs on: asking asyncio for it is a getpid() system call each time."""
        loop = self._loop
        assert loop is not None
        return loop

    def _spawn(self, st: _Lease, work: Any) -> None:
        """Go on with the lease in a task of its own: the paths that wait (backoffs, resends,
        releases); a lease's usual path is driven by its replies, without a task."""
        st.runner = self._running_loop().create_task(work, name=f"orbit-task-{st.task_id}")

    def _finish(self, st: _Lease) -> None:
        """The lease is done with here (reported, released, refused or abandoned)."""
        if st.grace_timer is not None:
            st.grace_timer.cancel()
        if st.ahead_timer is not None:
            st.ahead_timer.cancel()
            st.ahead_timer = None
        if self._leases.get(st.lease_id) is st:
            del self._leases[st.lease_id]
        self._free_slot(st)

    async def _claim_loop(self) -> None:
        rr = 0
        backoff = 0.5
        while not self._draining:
            free = self._room()
            if free <= 0:
                self._capacity.clear()
                if self._room() <= 0 and not self._draining:
                    await self._capacity.wait()
                    # Replies that end several handlers arrive together: let them all end, so
                    # that one claim asks for all their slots rather than one claim for each.
                    for _ in range(3):
                        await asyncio.sleep(0)
                continue
            if self._link is not None and self._link.draining and self._session is self._link.session:
                # The node drains: nothing more through it; the next session (another node) claims.
                await self._sleep_unless_draining(0.1)
                continue
            if self._session is None:
                ready = asyncio.create_task(self._session_ready.wait())
                drain = asyncio.create_task(self._drain_event.wait())
                try:
                    await asyncio.wait({ready, drain}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    ready.cancel()
                    drain.cancel()
                continue
            queue_id = self.queues[rr % len(self.queues)]
            rr += 1
            wait_ms = self.claim_wait_ms if len(self.queues) == 1 else min(self.claim_wait_ms, 1_000)
            msg_id = new_message_id("claim")
            sent = time.monotonic()
            try:
                reply = await self._command("claim", msg_id, abort_on_drain=True, queue_id=queue_id,
                                            max_tasks=min(free, 100), lease_ms=self.lease_ms, wait_ms=wait_ms)
            except _Gone:
                return
            except WorkerProtocolError as exc:
                _log(logging.ERROR, "claim_refused", queue_id=queue_id, code=exc.code, retry_in_s=round(backoff, 2))
                await self._sleep_unless_draining(backoff * random.uniform(0.5, 1.5))
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 0.5
            received = time.monotonic()
            expires = received - min(received - sent, 1.0) + self.lease_ms / 1000 - 0.5
            for lease in reply["tasks"]:
                st = _Lease(lease=lease, expires_mono=expires, is_async=self._handler_is_async)
                if lease["lease_id"] in self._leases:
                    continue
                self._leases[st.lease_id] = st
                _log(logging.DEBUG, "leased", task_id=st.task_id, lease_id=st.lease_id, attempt=lease.get("attempt"))
                if self._busy < self.concurrency and not self._ahead:
                    st.holds_slot = True
                    self._busy += 1
                    self._begin(st)
                else:
                    self._hold_ahead(st)

    async def _sleep_unless_draining(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):  # not wait_for: see WorkerSession.call
                await self._drain_event.wait()

    # ------------------------------------------------------------ internals: one lease

    def _begin(self, st: _Lease) -> None:
        """The lease has a slot: ask for its Start. Its reply, the handler's end and the
        report's reply each call the next step; anything unusual goes on in `_run_lease`."""
        session = self._session
        if st.revoked or self._draining or session is None:
            self._spawn(st, self._run_lease(st))
            return
        st.start_msg_id = new_message_id("start")
        st.start_unknown = True
        if not session.send_nowait("start", st.start_msg_id, {"lease_id": st.lease_id},
                                   functools.partial(self._on_start_reply, st)):
            self._spawn(st, self._run_lease(st))

    def _on_start_reply(self, st: _Lease, reply: dict[str, Any] | BaseException) -> None:
        if self._leases.get(st.lease_id) is not st:
            return  # the worker stopped and abandoned it
        try:
            receipt = reply_result(reply)
        except (WorkerProtocolError, WorkerConnectionClosed) as exc:
            self._spawn(st, self._run_lease(st, first=exc))
            return
        except Exception:
            self._internal_error(st)
            return
        st.start_unknown = False
        st.started = True
        st.receipt = receipt
        if st.revoked:  # as in `_run_lease`: a lease revoked while its Start was on its way
            _log(logging.INFO, "lease_abandoned", task_id=st.task_id, lease_id=st.lease_id, reason="revoked")
            self._finish(st)
            return
        self._run_handler(st)

    async def _run_lease(self, st: _Lease, first: BaseException | None = None) -> None:
        """A lease's Start when it cannot be asked for at once or was not granted at once:
        backoffs, resends after a reconnect, releases. With `first`: the Start already sent
        was answered with that error."""
        running = False
        try:
            if await self._start(st, first):
                if st.resent and not await self._still_current(st):
                    return
                if st.revoked:
                    raise _Gone()
                self._run_handler(st)
                running = True
        except _Gone:
            _log(logging.INFO, "lease_abandoned", task_id=st.task_id, lease_id=st.lease_id, reason="revoked")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker internal error task_id=%s lease_id=%s", st.task_id, st.lease_id)
        finally:
            if not running:
                self._finish(st)

    def _start_limit(self, st: _Lease) -> float:
        """Local monotonic time by which a Start must be authorized (lease end or start deadline)."""
        limit = st.expires_mono
        for ts in (st.lease.get("start_deadline_at"), st.lease.get("deadline_at")):
            left = _seconds_until(_parse_ts(ts))
            if left is not None:
                limit = min(limit, time.monotonic() + left)
        return limit

    async def _start(self, st: _Lease, first: BaseException | None = None) -> bool:
        """Obtain the Start authorization (same message id on every retry), or release/abandon."""
        if st.start_msg_id is None:
            st.start_msg_id = new_message_id("start")
        msg_id = st.start_msg_id
        backoff = 0.2
        while True:
            if st.revoked:
                return False
            if self._draining and not st.start_unknown:
                await self._release(st, "draining")
                return False
            st.start_unknown = True
            try:
                if first is not None:
                    exc, first = first, None
                    raise exc
                receipt = await self._command("start", msg_id, st, lease_id=st.lease_id)
            except WorkerConnectionClosed:  # the Start sent by `_begin`: resend it, same id
                st.resent = True
                continue
            except WorkerProtocolError as exc:
                if exc.code == "UNAVAILABLE":  # the Start sent by `_begin`, as `_command` does for its own
                    backoff = await self._wait_unavailable("start", exc, backoff)
                    continue
                if exc.code in _START_BACKOFF:
                    st.start_unknown = False
                    delay = max(0.05, (exc.retry_after_ms or 1000) / 1000) * random.uniform(1.0, 1.25) + 0.01
                    left = self._start_limit(st) - time.monotonic()
                    if delay + 0.5 >= left:
                        _log(logging.INFO, "start_gave_up", task_id=st.task_id, lease_id=st.lease_id, code=exc.code,
                             lease_left_s=round(left, 2))
                        await self._release(st, exc.code.lower())
                        return False
                    _log(logging.DEBUG, "start_backoff", task_id=st.task_id, code=exc.code,
                         retry_in_s=round(delay, 3))
                    await self._sleep_unless_draining(delay)
                    if self._draining:
                        await self._release(st, "draining")
                        return False
                    continue
                _log(logging.INFO, "start_refused", task_id=st.task_id, lease_id=st.lease_id, code=exc.code)
                return False
            st.start_unknown = False
            st.started = True
            st.receipt = receipt
            return True

    async def _release(self, st: _Lease, reason: str) -> None:
        """Give the lease back; bounded by the lease itself (after it the server recovers the task)."""
        msg_id = new_message_id("release")
        try:
            async with asyncio.timeout(max(1.0, st.expires_mono - time.monotonic())):
                await self._command("release", msg_id, st, lease_id=st.lease_id)
            _log(logging.INFO, "released", task_id=st.task_id, lease_id=st.lease_id, reason=reason)
        except WorkerProtocolError as exc:
            _log(logging.INFO, "release_refused", task_id=st.task_id, lease_id=st.lease_id, code=exc.code)
        except TimeoutError:
            self._abandoned += 1
            _log(logging.WARNING, "release_unconfirmed", task_id=st.task_id, lease_id=st.lease_id)

    def _make_context(self, st: _Lease) -> TaskContext:
        lease = st.lease
        receipt = st.receipt
        event: Any = asyncio.Event() if st.is_async else threading.Event()
        return TaskContext(
            id=lease["task_id"],
            queue_id=lease["queue_id"],
            payload=lease.get("payload"),
            attempt=int(receipt.get("attempt") or lease.get("attempt") or 1),
            lease_id=lease["lease_id"],
            priority=int(lease.get("priority") or 0),
            deadline_at=_parse_ts(receipt.get("deadline_at") or lease.get("deadline_at")),
            start_deadline_at=_parse_ts(lease.get("start_deadline_at")),
            cancel_requested=event,
            resource_keys=list(lease.get("resource_keys") or []),
            started_at=_parse_ts(receipt.get("started_at")),
            start_receipt_id=receipt.get("start_receipt_id"),
            traceparent=lease.get("traceparent"),
        )

    def _run_handler(self, st: _Lease) -> None:
        """Call the handler for the started attempt; `_handler_done` follows it."""
        assert self._handler is not None
        st.ctx = self._make_context(st)
        st.started_mono = time.monotonic()
        _log(logging.INFO, "task_started", task_id=st.task_id, lease_id=st.lease_id, attempt=st.ctx.attempt)
        # The handler runs in a copy of this context: with OpenTelemetry, inside the attempt's span.
        st.handler, span = _start_in_attempt_span(st.ctx, functools.partial(self._start_handler, st))
        if span is not None:
            st.handler.add_done_callback(lambda _: span.end())
        if st.cancel_requested:  # a cancel push arrived between Start and now
            self._set_event(st)
            self._arm_grace(st)
        # Most handlers end before their first renewal is due: the worker's renewal tick, not a
        # task or a timer of their own, waits for it.
        first = self._first_renewal_in(st)
        if first <= 0:
            self._running_loop().call_soon(self._start_renewer, st)
        else:
            st.renew_at = st.started_mono + first
            if self._renew_tick is None:
                self._renew_tick = self._running_loop().call_later(self._tick_every(), self._on_renew_tick)
        st.handler.add_done_callback(functools.partial(self._handler_done, st))

    def _handler_done(self, st: _Lease, _: asyncio.Future) -> None:
        if self._leases.get(st.lease_id) is not st:
            return  # the worker stopped and abandoned it
        st.renew_at = None
        if st.grace_timer is not None:
            st.grace_timer.cancel()
        if st.renewer is not None:  # a long handler: its renewals stop before the report leaves
            self._spawn(st, self._after_renewer(st))
            return
        self._attempt_ended(st)

    async def _after_renewer(self, st: _Lease) -> None:
        assert st.renewer is not None
        st.renewer.cancel()
        with contextlib.suppress(BaseException):
            await st.renewer
        self._attempt_ended(st)

    def _internal_error(self, st: _Lease) -> None:
        """A bug met on a lease's path: logged, and the lease is let go (its slot freed)."""
        log.exception("worker internal error task_id=%s lease_id=%s", st.task_id, st.lease_id)
        self._finish(st)

    def _attempt_ended(self, st: _Lease) -> None:
        """Free the slot, then report the outcome (none for a revoked lease)."""
        try:
            self._report_outcome(st)
        except Exception:
            self._internal_error(st)

    def _report_outcome(self, st: _Lease) -> None:
        self._free_slot(st)
        ran = time.monotonic() - st.started_mono
        self._handler_ended(ran)
        outcome = self._outcome(st)
        elapsed = round(ran, 3)
        if st.revoked:
            _log(logging.WARNING, "task_abandoned", task_id=st.task_id, lease_id=st.lease_id, reason="lease revoked",
                 elapsed_s=elapsed)
            self._finish(st)
            return
        msg_id = new_message_id("complete")
        fields: dict[str, Any] = {"lease_id": st.lease_id, "outcome": outcome["outcome"]}
        if outcome["outcome"] == "succeeded":
            fields["result"] = outcome.get("result")
        elif outcome["outcome"] == "failed":
            fields["error"] = {"message": outcome["error"], "retryable": outcome["retryable"]}
        self._unacked[msg_id] = {"task_id": st.task_id, "lease_id": st.lease_id, "outcome": outcome["outcome"]}
        session = self._session
        if session is None or not session.send_nowait(
                "complete", msg_id, fields, functools.partial(self._on_report_reply, st, msg_id, fields, elapsed)):
            self._spawn(st, self._report(st, msg_id, fields, elapsed))

    def _on_report_reply(self, st: _Lease, msg_id: str, fields: dict[str, Any], elapsed: float,
                         raw: dict[str, Any] | BaseException) -> None:
        if self._leases.get(st.lease_id) is not st:
            return
        try:
            reply = reply_result(raw)
        except WorkerConnectionClosed:
            self._spawn(st, self._report(st, msg_id, fields, elapsed))
            return
        except WorkerProtocolError as exc:
            if exc.code == "UNAVAILABLE":
                self._spawn(st, self._report(st, msg_id, fields, elapsed, unavailable=exc))
                return
            self._reported(st, msg_id, fields, elapsed, None, exc)
            return
        except Exception:
            self._unacked.pop(msg_id, None)
            self._internal_error(st)
            return
        self._reported(st, msg_id, fields, elapsed, reply, None)

    def _start_handler(self, st: _Lease) -> asyncio.Future:
        assert self._handler is not None and st.ctx is not None
        if st.is_async:
            work = self._handler(st.ctx)
            if type(work) is types.CoroutineType:
                return self._running_loop().create_task(work)
            return asyncio.ensure_future(work)
        assert self._executor is not None
        return self._executor.submit(contextvars.copy_context().run, self._handler, st.ctx)

    async def _still_current(self, st: _Lease) -> bool:
        """After a Start answered only on a replay, make sure the lease did not expire meanwhile
        (a replay returns the original receipt even then) before running the handler."""
        sent = time.monotonic()
        try:
            reply = await self._command("renew", new_message_id("renew"), st, lease_id=st.lease_id,
                                        lease_ms=self.lease_ms)
        except WorkerProtocolError as exc:
            if exc.code in _LEASE_GONE:
                self._revoke(st, exc.code.lower())
                return False
            return True
        st.expires_mono = sent + self.lease_ms / 1000
        if reply.get("cancel_requested"):
            st.cancel_requested = True
        return True

    def _outcome(self, st: _Lease) -> dict[str, Any]:
        fut = st.handler
        assert fut is not None
        exc: BaseException | None
        if fut.cancelled():
            exc = asyncio.CancelledError()
        else:
            exc = fut.exception()
        if exc is None:
            result = fut.result()
            try:
                orjson.dumps(result)
            except TypeError as err:
                return {"outcome": "failed", "error": f"the handler's result is not JSON: {err}"[:_MAX_ERROR_CHARS],
                        "retryable": False}
            return {"outcome": "succeeded", "result": result}
        if st.cancel_requested and not st.shutdown:
            return {"outcome": "cancelled"}
        if isinstance(exc, asyncio.CancelledError):
            message = ("the worker shut down before the handler finished" if st.shutdown
                       else "the handler was cancelled")
            return {"outcome": "failed", "error": message, "retryable": True}
        if isinstance(exc, PermanentError):
            retryable = False
        else:
            retryable = True
        if isinstance(exc, (PermanentError, RetryableError)):
            message = str(exc) or type(exc).__name__
        else:
            message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        expected = isinstance(exc, (PermanentError, RetryableError))  # control flow: no traceback
        _log(logging.WARNING, "handler_failed", task_id=st.task_id, attempt=st.ctx.attempt if st.ctx else None,
             retryable=retryable, error=type(exc).__name__)
        if not expected:
            log.warning("handler raised task_id=%s", st.task_id, exc_info=(type(exc), exc, exc.__traceback__))
        return {"outcome": "failed", "error": message[:_MAX_ERROR_CHARS], "retryable": retryable}

    async def _report(self, st: _Lease, msg_id: str, fields: dict[str, Any], elapsed: float,
                      unavailable: WorkerProtocolError | None = None) -> None:
        """Send (again, same message id) a report that could not leave, was not answered, or was
        answered `unavailable`."""
        reply: dict[str, Any] | None = None
        error: WorkerProtocolError | None = None
        try:
            if unavailable is not None:
                await self._wait_unavailable("complete", unavailable, 0.2)
            reply = await self._command("complete", msg_id, **fields)
        except WorkerProtocolError as exc:
            error = exc
        except BaseException:  # cancelled: the worker stops
            self._unacked.pop(msg_id, None)
            self._finish(st)
            raise
        self._reported(st, msg_id, fields, elapsed, reply, error)

    def _reported(self, st: _Lease, msg_id: str, fields: dict[str, Any], elapsed: float,
                  reply: dict[str, Any] | None, error: WorkerProtocolError | None) -> None:
        if error is not None:
            level = logging.WARNING if error.code == "LEASE_LOST" else logging.ERROR
            _log(level, "report_refused", task_id=st.task_id, lease_id=st.lease_id, outcome=fields["outcome"],
                 code=error.code)
        elif reply is not None:
            _log(logging.INFO, "task_reported", task_id=st.task_id, lease_id=st.lease_id, outcome=fields["outcome"],
                 task_state=reply.get("task_state"), elapsed_s=elapsed)
        self._unacked.pop(msg_id, None)
        self._finish(st)

    def _first_renewal_in(self, st: _Lease) -> float:
        """A third of the lease, or at once when the lease is nearer its end than that (e.g. a
        Start that came late in the lease after rate-limit backoffs)."""
        interval = self.lease_ms / 3000
        return max(0.0, min(interval, st.expires_mono - time.monotonic() - 2 * interval))

    def _tick_every(self) -> float:
        """How often first renewals are looked for: a twelfth of the lease (at most 1 s), so a
        renewal due at a third of the lease comes before half of it has passed."""
        return min(1.0, self.lease_ms / 12000)

    def _on_renew_tick(self) -> None:
        self._renew_tick = None
        now = time.monotonic()
        waiting = False
        for st in list(self._leases.values()):
            if st.renew_at is None:
                continue
            if st.renew_at <= now:
                st.renew_at = None
                self._start_renewer(st)
            else:
                waiting = True
        if waiting:
            self._renew_tick = asyncio.get_running_loop().call_later(self._tick_every(), self._on_renew_tick)

    def _start_renewer(self, st: _Lease) -> None:
        if st.renewer is None and st.handler is not None and not st.handler.done():
            if st.renew_now is None:
                st.renew_now = asyncio.Event()
            st.renewer = asyncio.get_running_loop().create_task(self._renew_loop(st), name=f"orbit-renew-{st.task_id}")

    async def _renew_loop(self, st: _Lease) -> None:
        assert st.renew_now is not None
        interval = self.lease_ms / 3000
        first = True
        # Stops with the handler even if a cancellation went astray: a lease renewed after its
        # attempt ended would hold its task and permits until the worker exits.
        while st.handler is None or not st.handler.done():
            if not first:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._first_renewal_in(st)):  # see WorkerSession.call
                        await st.renew_now.wait()
            first = False
            st.renew_now.clear()
            if st.handler is not None and st.handler.done():
                return
            sent = time.monotonic()
            try:
                reply = await self._command("renew", new_message_id("renew"), st, lease_id=st.lease_id,
                                            lease_ms=self.lease_ms)
            except _Gone:
                return
            except WorkerProtocolError as exc:
                if exc.code in _LEASE_GONE:
                    self._revoke(st, exc.code.lower())
                    return
                _log(logging.WARNING, "renew_refused", task_id=st.task_id, code=exc.code)
                await asyncio.sleep(min(1.0, interval))
                continue
            st.expires_mono = sent + self.lease_ms / 1000
            if reply.get("cancel_requested"):
                self._cancel_requested(st, "renew")

    # ------------------------------------------------------------ internals: cancellation

    def _set_event(self, st: _Lease) -> None:
        if st.ctx is not None:
            st.ctx.cancel_requested.set()

    def _arm_grace(self, st: _Lease) -> None:
        if not st.is_async or st.handler is None or st.handler.done() or st.grace_timer is not None:
            return
        loop = asyncio.get_running_loop()
        st.grace_timer = loop.call_later(self.cancel_grace, self._grace_expired, st)

    def _grace_expired(self, st: _Lease) -> None:
        st.grace_timer = None
        if st.handler is not None and not st.handler.done():
            _log(logging.INFO, "handler_cancelled_after_grace", task_id=st.task_id, grace_s=self.cancel_grace)
            st.handler.cancel()
            # A handler that swallows the cancellation is cancelled again after another grace period.
            st.grace_timer = asyncio.get_running_loop().call_later(self.cancel_grace, self._grace_expired, st)

    def _cancel_requested(self, st: _Lease, via: str) -> None:
        if st.cancel_requested:
            return
        st.cancel_requested = True
        _log(logging.INFO, "cancel_requested", task_id=st.task_id, lease_id=st.lease_id, via=via)
        if st.ctx is not None:
            self._set_event(st)
            self._arm_grace(st)

    def _revoke(self, st: _Lease, reason: str) -> None:
        if st.revoked:
            return
        st.revoked = True
        _log(logging.WARNING, "lease_revoked", task_id=st.task_id, lease_id=st.lease_id, reason=reason)
        if st.ctx is not None:
            self._set_event(st)
        if st.handler is not None and st.is_async and not st.handler.done():
            st.handler.cancel()
        elif st.handler is None and not st.started and not st.start_unknown:
            if st.ahead_timer is not None:  # claimed ahead: it never gets a slot
                with contextlib.suppress(ValueError):
                    self._ahead.remove(st)
                self._finish(st)
            elif st.runner is not None:
                st.runner.cancel()
