"""One worker WebSocket session: frame codec and the command state machine.

States: CONNECTED (only `hello` and `ping` accepted) -> READY -> CLOSED. Every
client frame is answered with `reply_to`; frames are handled concurrently so a
long-polling claim never delays a Start or a complete on the same socket.
A malformed frame gets an error reply, or closes the socket with 1008 when it
has no usable `id` (not JSON text, not an object, too large, too deep); it never
affects other sessions. Frame checks are total: whatever a frame holds, they
answer or close, and a check that fails unexpectedly is answered as malformed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
import structlog
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..._rules import IDEMPOTENCY_KEY_RE
from ..core.ids import NODE_ID_RULE, is_id, is_node_id, new_id
from ..errors import DatabaseUnavailable, DomainError
from ..services import dispatch, workers
from ..services.auth import Principal
from ..wakeups import TIMED_OUT
from .corked import RECEIVE_TEXT_NOW, SEND_TEXT_NOW
from .hub import WorkerHub

log = structlog.get_logger("orbit.ws")

MAX_FRAME_BYTES = 1024 * 1024
MAX_IN_FLIGHT = 256
# A socket that authenticated but has not sent a successful `hello` within this many seconds is
# closed with 1008. Real workers send hello as their first frame (one round trip after the
# upgrade); a socket that never does holds a connection, a session and a slot in the node's
# registry for nothing, and a client that keeps opening such sockets could exhaust them. A few
# seconds is ample for one frame even on a slow link or after a GC pause.
HELLO_TIMEOUT_S = 5.0
# Leases a session remembers having granted (see `_granted`); beyond this the oldest are forgotten.
MAX_REMEMBERED_LEASES = 10_000


def _shown(value: str, limit: int = 64) -> str:
    """A client's string as quoted back in an error message: bounded, so that a reply never grows
    with what the client sent."""
    return repr(value if len(value) <= limit else value[:limit] + "…")


def _log_unexpected(event: str, session_id: str, exc: BaseException, **fields: Any) -> None:
    """An unexpected failure while checking a frame: its class and where it happened, without
    its message (a TypeError or KeyError can quote the frame's values)."""
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    log.error(event, session_id=session_id, error=type(exc).__qualname__,
              at=f"{where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno} in {where[0].name}" if where else None,
              **fields)


def _check_storable(result: Any) -> None:
    """Refuse a result the encoder cannot write back (nested beyond its 254 levels; the parser
    accepts 1024), here: inside the group commit it would fail the other sessions' reports too.
    Encoded as a late report holds it (two levels down), the deepest place it is ever stored."""
    try:
        orjson.dumps([{"result": result}])
    except orjson.JSONEncodeError:
        raise _invalid("result: nested too deeply to store (at most 250 levels)") from None


def _too_large(raw: str | bytes) -> bool:
    """Whether a text frame is over the limit in bytes (a character may take four of them);
    encoded only when its length in characters leaves any doubt."""
    if not isinstance(raw, str):
        return len(raw) > MAX_FRAME_BYTES
    return len(raw) > MAX_FRAME_BYTES or (len(raw) > MAX_FRAME_BYTES // 4 and len(raw.encode()) > MAX_FRAME_BYTES)


def _read(raw: str | bytes) -> tuple[dict[str, Any], str] | str:
    """A text frame's object and id; or why the socket closes for it (1008): too large, not a
    JSON object (not JSON, nested too deep, a number out of range), no usable id."""
    if _too_large(raw):
        return f"frame too large (at most {MAX_FRAME_BYTES} bytes)"
    try:
        frame = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "malformed frame without a usable id"
    msg_id = frame.get("id") if isinstance(frame, dict) else None
    if not isinstance(msg_id, str) or not IDEMPOTENCY_KEY_RE.match(msg_id):
        return "every frame needs an id of 1-128 visible ASCII characters"
    return frame, msg_id


class _Slots:
    """The frames of a session in flight: one is taken as a frame is read and given back once it
    is answered. A client that sends faster than it reads its replies is slowed down, whatever
    its frames are: the reader waits (`acquire`), or the socket is no longer read (`on_free`
    reads on once one is back)."""

    def __init__(self, n: int, on_free: Callable[[], None]) -> None:
        self.free = n
        self._on_free = on_free
        self._waiter: asyncio.Future[None] | None = None

    def take(self) -> None:
        self.free -= 1

    async def acquire(self) -> None:
        while not self.free:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        self.free -= 1

    def release(self) -> None:
        self.free += 1
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._on_free()


def _debug_enabled() -> bool:
    """Whether per-frame debug lines would be written: checked once per session, not per frame."""
    return logging.getLogger("orbit.ws").isEnabledFor(logging.DEBUG)


def _unavailable(retry_after_ms: int = 1000) -> DomainError:
    return DomainError("UNAVAILABLE", "temporarily unavailable; resend the same message id",
                       retry_after_ms=retry_after_ms)


def _failed(exc: BaseException, session_id: str, kind: str) -> DomainError:
    """A command that raised: a refusal is its answer (a value the database refused included:
    INVALID_ARGUMENT, never to be resent); only an outage, or a bug, is UNAVAILABLE."""
    if isinstance(exc, DatabaseUnavailable):  # its retry_after_ms grows with an outage
        return _unavailable(exc.retry_after_ms or 1000)
    if isinstance(exc, DomainError):
        return exc
    log.error("frame_failed", session_id=session_id, type=kind, exc_info=exc)
    return _unavailable()


def reply_frame(msg_id: str, result: dispatch.Result) -> dict[str, Any]:
    """The one place a command's result becomes its reply frame."""
    if isinstance(result, DomainError):
        error: dict[str, Any] = {"code": result.code, "message": result.message}
        if result.retry_after_ms is not None:
            error["retry_after_ms"] = int(result.retry_after_ms)
        return {"reply_to": msg_id, "ok": False, "error": error}
    return {"reply_to": msg_id, "ok": True, **result}


def _invalid(message: str) -> DomainError:
    return DomainError("INVALID_ARGUMENT", message)


def _int(frame: dict[str, Any], name: str, lo: int, hi: int, default: int | None = None) -> int:
    value = frame.get(name, default)
    if value is None:
        raise _invalid(f"{name}: is required")
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise _invalid(f"{name}: must be an integer between {lo} and {hi}")
    return value


def _id_field(frame: dict[str, Any], name: str) -> str:
    value = frame.get(name)
    if not isinstance(value, str):
        raise _invalid(f"{name}: is required")
    if not is_id(value):
        raise DomainError("NOT_FOUND", f"{name}: no such {name.removesuffix('_id')}")
    return value


def _invalid_frame() -> DomainError:
    return _invalid("malformed frame")


ALLOWED = {
    "hello": {"node_id", "queues", "sdk"},
    "claim": {"queue_id", "max_tasks", "lease_ms", "wait_ms"},
    "start": {"lease_id"},
    "renew": {"lease_id", "lease_ms"},
    "complete": {"lease_id", "outcome", "result", "error"},
    "release": {"lease_id"},
    "ping": set(),
}
# Per frame type, every key a frame may carry (checked with one subset test per frame).
_KEYS = {kind: frozenset(fields | {"id", "type"}) for kind, fields in ALLOWED.items()}
_TYPES = ", ".join(ALLOWED)
# Commands served by the node's group commits: answered from the transaction's callback, with no
# task per frame. The others (hello, claim with its long poll, ping) each run in a task.
GROUPED = ("start", "renew", "complete", "release")


class WorkerSession:
    def __init__(self, ws: WebSocket, hub: WorkerHub, principal: Principal) -> None:
        self.ws = ws
        self.hub = hub
        self.principal = principal
        self.session_id = new_id()
        self.identity: dispatch.WorkerIdentity | None = None
        self.queues: set[str] = set()
        self._send_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._in_flight = _Slots(MAX_IN_FLIGHT, self._slot_freed)
        # Text frames as the server parses them (see ws/corked.py); None: read through ASGI.
        self._receive_now = ws.scope.get("extensions", {}).get(RECEIVE_TEXT_NOW)
        self._hold: Callable[[bool], None] | None = None
        self._held: deque[bytes] = deque()  # frames read while no slot was free, in order
        self._reading_held = False
        self._refused = False  # a frame closed the socket: those after it are not read
        # lease id -> (task id, queue id) of the leases this session granted: lets their Start and
        # report skip the database lookup of where the lease lives. Only a hint for finding rows:
        # every check is made on the locked rows.
        self._granted: dict[str, tuple[str, str]] = {}
        self._handlers = {kind: getattr(self, f"_on_{kind}") for kind in ALLOWED if kind not in GROUPED}
        self._grouped = {kind: getattr(self, f"_{kind}_command") for kind in GROUPED}
        # Writes a text frame at once when the server offers it (see ws/corked.py); None: ASGI send.
        self._send_now = ws.scope.get("extensions", {}).get(SEND_TEXT_NOW)
        self._sending: set[asyncio.Task] = set()
        # Claims of one application share transactions, whatever their queues: they meet on the
        # application's usage row, which one transaction then takes once (see dispatch.claim_many).
        self._claim_group = f"{principal.namespace_id}/{principal.application_id}"
        self._log_frames = _debug_enabled()
        self._hello_running = False  # a hello is being checked: the hello deadline waits for its answer

    async def send(self, message: dict[str, Any]) -> None:
        if self._closed:
            return
        data = orjson.dumps(message).decode()
        if self._write_now(data):
            return
        async with self._send_lock:
            try:
                await self.ws.send_text(data)
            except Exception:
                self._closed = True

    def _write_now(self, data: str) -> bool:
        """Write the frame synchronously if the server allows it now; False: send it through ASGI."""
        if self._send_now is None or self._closed:
            return False
        try:
            return self._send_now(data)
        except Exception:
            self._closed = True
            return True

    def _answer(self, msg_id: str, result: dispatch.Result) -> None:
        """Reply from a callback: written at once, or by a task when the socket must drain first."""
        message = reply_frame(msg_id, result)
        if self._closed or self._write_now(orjson.dumps(message).decode()):
            return
        self._in_background(self.send(message))

    def _in_background(self, work: Any) -> None:
        """A send or close that must wait for the socket: a task of its own, kept until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def push(self, message: dict[str, Any]) -> None:
        await self.send(message)

    async def close(self, code: int, reason: str) -> None:
        if not self._closed:
            self._closed = True
            self._held.clear()
            if self._hold is not None:
                self._hold(False)  # the peer's answer to the close is read
            with contextlib.suppress(Exception):
                await self.ws.close(code, reason)

    async def run(self) -> None:
        """Read frames until the socket closes. Registered from the start, so that revoking the
        credential or draining the node reaches a socket that has not (yet) sent hello."""
        self.hub.register(self)
        if self._receive_now is not None:
            self._hold = self._receive_now(self._on_text)
        hello_by = time.monotonic() + HELLO_TIMEOUT_S
        try:
            while not self._closed:
                try:
                    if self.identity is None and not self._hello_running:
                        message = await asyncio.wait_for(self.ws.receive(), hello_by - time.monotonic())
                    else:
                        message = await self.ws.receive()
                except TimeoutError:
                    if self.identity is None and not self._hello_running:
                        await self.close(1008, f"no hello within {HELLO_TIMEOUT_S:g} s")
                        break
                    continue  # a hello arrived in time and is (or was) being answered
                except (WebSocketDisconnect, RuntimeError):
                    break
                if message.get("type") != "websocket.receive":
                    break  # websocket.disconnect
                raw = message.get("text")
                if not isinstance(raw, str):  # a binary frame
                    await self.close(1008, "frames must be JSON text")
                    break
                read = _read(raw)
                if isinstance(read, str):
                    await self.close(1008, read)
                    break
                await self._in_flight.acquire()
                self._dispatch(*read)
        finally:
            self._closed = True
            self._held.clear()
            for t in list(self._tasks):
                t.cancel()
            self.hub.unregister(self)

    def _on_text(self, raw: bytes) -> None:
        """A text frame as the server parses it, in order. With every slot taken, it waits here
        and the socket is no longer read, until a frame in flight is answered."""
        if self._refused or self._closed:
            return
        if self._held or not self._in_flight.free:
            self._held.append(raw)
            if self._hold is not None:
                self._hold(True)
            return
        self._read_now(raw)

    def _read_now(self, raw: bytes) -> None:
        read = _read(raw)
        if isinstance(read, str):
            self._refused = True
            self._held.clear()
            self._in_background(self.close(1008, read))
            return
        self._in_flight.take()
        self._dispatch(*read)

    def _slot_freed(self) -> None:
        if self._held and not self._reading_held:
            self._reading_held = True
            asyncio.get_running_loop().call_soon(self._read_held)

    def _read_held(self) -> None:
        self._reading_held = False
        while self._held and self._in_flight.free and not self._refused and not self._closed:
            self._read_now(self._held.popleft())
        if not self._held and self._hold is not None:
            self._hold(False)

    def _dispatch(self, frame: dict[str, Any], msg_id: str) -> None:
        """Check a frame with a usable id and hand it on. Whatever the frame holds, it is answered:
        a check that fails unexpectedly (a bug meeting an odd value) is answered as malformed,
        logged by its place in the code only, never by its message, which could quote the frame."""
        kind = frame.get("type")
        try:
            self._check(frame, kind)
        except Exception as exc:
            if not isinstance(exc, DomainError):
                _log_unexpected("frame_check_failed", self.session_id, exc)
                exc = _invalid_frame()
            self._track(asyncio.get_running_loop().create_task(self.send(reply_frame(msg_id, exc))))
            if self._log_frames:
                self._log_frame(msg_id, kind, exc, time.perf_counter())
            return
        if kind in self._grouped:
            self._command(frame, msg_id, kind)
            return
        self._track(asyncio.get_running_loop().create_task(self._handle(frame, msg_id, kind)))

    def _track(self, task: asyncio.Task) -> None:
        """A frame answered by a task: its in-flight slot is given back when the task ends."""
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._in_flight.release()

    def _check(self, frame: dict[str, Any], kind: Any) -> None:
        """Every frame's own checks: a known type, only its fields, and hello first."""
        if not isinstance(kind, str) or kind not in _KEYS:
            # The value is not echoed: it may be anything, of any size.
            raise _invalid(f"type: must be one of {_TYPES}")
        if not frame.keys() <= _KEYS[kind]:
            unknown = sorted(set(frame) - _KEYS[kind])
            raise _invalid(f"{_shown(unknown[0])}: is not a known field")
        if self.identity is None and kind != "hello" and kind != "ping":
            raise DomainError("STATE_CONFLICT", "send hello first")

    def _command(self, frame: dict[str, Any], msg_id: str, kind: str) -> None:
        """Queue a grouped command; its reply is written when its transaction ends.

        A lease whose claim was answered while its transaction commits: a Start goes at once
        (its locking reads wait in the database for the rows that transaction wrote and holds);
        its other commands wait here for the transaction to end."""
        committing = self.hub.committing(frame.get("lease_id")) if kind != "start" else None
        if committing is not None:
            committing.add_done_callback(lambda _: self._command(frame, msg_id, kind))
            return
        started = time.perf_counter()
        try:
            fut, lease_id = self._grouped[kind](frame, msg_id)
        except DomainError as exc:
            self._in_flight.release()
            self._answer(msg_id, exc)
            return
        except Exception as exc:
            self._in_flight.release()
            _log_unexpected("frame_failed", self.session_id, exc, type=kind)
            self._answer(msg_id, _unavailable())
            return
        fut.add_done_callback(partial(self._commanded, msg_id, kind, lease_id, started))

    def _commanded(self, msg_id: str, kind: str, lease_id: str, started: float, fut: asyncio.Future) -> None:
        self._in_flight.release()
        if fut.cancelled():
            return  # the node is stopping
        exc = fut.exception()
        if exc is None:
            result = fut.result()
            if kind == "complete" or kind == "release":
                self._freed(lease_id, result)
        else:
            result = _failed(exc, self.session_id, kind)
        self._answer(msg_id, result)
        if self._log_frames:
            self._log_frame(msg_id, kind, result, started)

    async def _handle(self, frame: dict[str, Any], msg_id: str, kind: str) -> None:
        started = time.perf_counter()
        try:
            result = await self._handlers[kind](frame, msg_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            result = _failed(exc, self.session_id, kind)
        await self.send(reply_frame(msg_id, result))
        if self._log_frames:
            self._log_frame(msg_id, kind, result, started)

    def _log_frame(self, msg_id: str, kind: Any, result: dispatch.Result, started: float) -> None:
        """One debug line per answered frame, as the request log has per request: never its
        payload, result or error message, which are the application's data."""
        log.debug("frame", session_id=self.session_id, credential_id=self.principal.credential_id,
                  type=kind if isinstance(kind, str) and kind in ALLOWED else "unknown", msg_id=msg_id,
                  code=result.code if isinstance(result, DomainError) else "OK",
                  latency_ms=round((time.perf_counter() - started) * 1000, 3))

    # ------------------------------------------------------------ commands

    async def _on_ping(self, frame: dict[str, Any], msg_id: str) -> dict[str, Any]:
        return {"type": "pong"}

    async def _on_hello(self, frame: dict[str, Any], msg_id: str) -> dict[str, Any]:
        if self.identity is not None or self._hello_running:
            raise DomainError("STATE_CONFLICT", "hello was already sent on this session")
        self._hello_running = True
        try:
            return await self._hello(frame)
        finally:
            self._hello_running = False

    async def _hello(self, frame: dict[str, Any]) -> dict[str, Any]:
        node_id = frame.get("node_id")
        if not is_node_id(node_id):
            raise _invalid(f"node_id: must be {NODE_ID_RULE}")
        queues = frame.get("queues", [])
        if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues) or len(queues) > 1000:
            raise _invalid("queues: must be a list of queue ids")
        sdk = frame.get("sdk", "")
        if not isinstance(sdk, str) or len(sdk) > 256:
            raise _invalid("sdk: must be a string of at most 256 characters")
        for q in queues:
            if not is_id(q) or not self.principal.can_see_queue(q):
                raise DomainError("NOT_FOUND", f"queues: queue {_shown(q)} not found")
        missing = await workers.missing_queues(self.hub.db, self.principal.namespace_id, queues)
        if missing:
            raise DomainError("NOT_FOUND", f"queues: queue {missing[0]!r} not found")
        self.queues = set(queues)
        self.identity = dispatch.WorkerIdentity(self.principal, self.session_id, node_id, self.hub.instance_id)
        if self.hub.draining:
            await self.push({"type": "drain", "deadline_ms": self.hub.drain_deadline_ms})
        return {
            "session_id": self.session_id,
            "default_lease_ms": dispatch.DEFAULT_LEASE_MS,
            "max_lease_ms": dispatch.MAX_LEASE_MS,
            "heartbeat_ms": dispatch.HEARTBEAT_MS,
        }

    async def _on_claim(self, frame: dict[str, Any], msg_id: str) -> dispatch.Result:
        queue_id = _id_field(frame, "queue_id")
        if not self.principal.can_see_queue(queue_id):
            raise DomainError("NOT_FOUND", "queue not found")
        max_tasks = _int(frame, "max_tasks", 1, 100, 1)
        lease_ms = _int(frame, "lease_ms", 1000, dispatch.MAX_LEASE_MS, dispatch.DEFAULT_LEASE_MS)
        wait_ms = _int(frame, "wait_ms", 0, 30_000, 0)
        assert self.identity is not None  # frames after hello only (`_check`)
        command = dispatch.ClaimCommand(self.identity, queue_id, max_tasks, lease_ms, msg_id)
        if not wait_ms:
            return await self._claim(command)
        deadline = time.monotonic() + wait_ms / 1000
        self.hub.notifier.watch(queue_id)
        try:
            reply = await self._first_claim(command)
            while True:
                remaining = deadline - time.monotonic()
                if (isinstance(reply, DomainError) or reply["tasks"] or remaining <= 0 or self.hub.draining
                        or self._closed):
                    return reply
                # Offered while it waits: a submit of this queue on this node may serve the claim in
                # its own transaction (then its reply comes back from the wait). Work committed
                # elsewhere wakes it through the node's poll (`WorkerHub._poll_waiting_claims`).
                served = await self.hub.notifier.wait(queue_id, remaining, max_tasks, command)
                if served is TIMED_OUT:
                    return reply
                reply = await self._claim(command) if served is None else self._leased(served)
        finally:
            self.hub.notifier.unwatch(queue_id)

    async def _first_claim(self, command: dispatch.ClaimCommand) -> dispatch.Result:
        """A long poll's first look: where this node's poll just found that no claim could lease
        (and nothing here changed that since), it waits without a claim transaction, unless the
        claim is a resent one, whose first answer is replayed."""
        notifier = self.hub.notifier
        if (notifier.idle(command.queue_id, self.principal.namespace_id, time.monotonic())
                and not await dispatch.claim_answered(self.hub.db, command.who, command.msg_id)):
            return {"tasks": []}
        return await self._claim(command)

    async def _claim(self, command: dispatch.ClaimCommand) -> dispatch.Result:
        """One claim transaction (shared with the claims of the application's other sessions)."""
        if self.hub.draining or self._closed:
            return {"tasks": []}
        return self._leased(await self.hub.claims.submit(self._claim_group, command))

    def _leased(self, reply: dispatch.Result) -> dispatch.Result:
        """A claim's reply, its leases remembered (their Start and report need no lookup)."""
        if not isinstance(reply, DomainError) and reply["tasks"]:
            self._remember(reply["tasks"])
        return reply

    # Grouped commands: each returns the future of its reply and the lease it is about.

    def _start_command(self, frame: dict[str, Any], msg_id: str) -> tuple[asyncio.Future, str]:
        lease_id = _id_field(frame, "lease_id")
        return self.hub.starts.enqueue(
            dispatch.StartCommand(self.principal.credential_id, msg_id, lease_id, self._granted.get(lease_id))
        ), lease_id

    def _renew_command(self, frame: dict[str, Any], msg_id: str) -> tuple[asyncio.Future, str]:
        lease_id = _id_field(frame, "lease_id")
        lease_ms = _int(frame, "lease_ms", 1000, dispatch.MAX_LEASE_MS, dispatch.DEFAULT_LEASE_MS)
        return self.hub.renews.enqueue(
            dispatch.RenewCommand(self.principal.credential_id, msg_id, lease_id, lease_ms,
                                  self.session_id, self.hub.instance_id)
        ), lease_id

    def _complete_command(self, frame: dict[str, Any], msg_id: str) -> tuple[asyncio.Future, str]:
        lease_id = _id_field(frame, "lease_id")
        outcome = frame.get("outcome")
        if outcome not in ("succeeded", "failed", "cancelled"):
            raise _invalid("outcome: must be succeeded, failed or cancelled")
        result = frame.get("result")
        error_message, retryable = None, True
        if outcome == "failed":
            err = frame.get("error", {})
            if not isinstance(err, dict) or set(err) - {"message", "retryable"}:
                raise _invalid("error: must be {message, retryable}")
            error_message = err.get("message", "handler failed")
            retryable = err.get("retryable", True)
            if not isinstance(error_message, str) or not isinstance(retryable, bool):
                raise _invalid("error: message must be a string and retryable a boolean")
            error_message = error_message[:4096]
        elif "error" in frame:
            raise _invalid("error: only allowed with outcome failed")
        if outcome != "succeeded" and "result" in frame:
            raise _invalid("result: only allowed with outcome succeeded")
        if isinstance(result, (list, dict)):
            _check_storable(result)
        return self.hub.completes.enqueue(dispatch.CompleteCommand(
            self.principal.credential_id, msg_id, lease_id, outcome, result, error_message, retryable,
            self._granted.get(lease_id),
        )), lease_id

    def _release_command(self, frame: dict[str, Any], msg_id: str) -> tuple[asyncio.Future, str]:
        lease_id = _id_field(frame, "lease_id")
        return self.hub.completes.enqueue(
            dispatch.CompleteCommand(self.principal.credential_id, msg_id, lease_id, "release",
                                     located=self._granted.get(lease_id))
        ), lease_id

    def _remember(self, granted: list[dict[str, Any]]) -> None:
        for t in granted:
            self._granted[t["lease_id"]] = (t["task_id"], t["queue_id"])
        while len(self._granted) > MAX_REMEMBERED_LEASES:
            del self._granted[next(iter(self._granted))]

    def _freed(self, lease_id: str, result: dispatch.Result) -> None:
        """A permit may have been freed: its application's too, so wake long polls of this
        session's other queues on this node (the node wakes those of the lease's own queue that
        a waiting task may follow: `Node._claimable`)."""
        located = self._granted.get(lease_id)
        if not isinstance(result, DomainError):
            self._granted.pop(lease_id, None)
        for q in self.queues:
            if located is None or q != located[1]:
                self.hub.notifier.notify(q, 1)
