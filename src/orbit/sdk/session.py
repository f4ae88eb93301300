"""The raw worker protocol for low-level users: one WebSocket session.

`WorkerSession` sends a command frame with a unique message id and awaits the
reply carrying `reply_to` that id. Pushed frames (`cancel_requested`,
`lease_revoked`, `drain`) go to the `on_push` callback, or to the `pushes`
queue when there is none. Error replies raise `WorkerProtocolError`; a socket
that closes before the reply arrived raises `WorkerConnectionClosed` (a
`TransportError`: the outcome is unknown).

Message ids name *commands*, scoped per credential on the server: resending a
command with the same id (after a reconnect or a backoff) is a replay that the
server answers with the original outcome and never executes twice. Every
method therefore accepts an explicit `msg_id`; generated ids are UUID-based so
that they are globally unique.

A low-level client must never run a task without a successful `start` reply
and must respect the remaining lease. `orbit.Worker` does all
of that for you.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import itertools
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.frames import Frame, Opcode, apply_mask
from websockets.protocol import State

from .._cork import CorkedTransport
from .._frames import at_frame_boundary, frame_head
from .errors import APIError, OrbitError, TransportError, parse_retry_after

__all__ = [
    "WorkerConnectionClosed",
    "WorkerProtocolError",
    "WorkerSession",
    "new_message_id",
    "worker_connect_url",
]

log = logging.getLogger("orbit.worker")

SDK_NAME = "orbit-python"
CONNECT_PATH = "/v1/workers/connect"
DEFAULT_REPLY_TIMEOUT = 30.0

PushHandler = Callable[[dict[str, Any]], "Awaitable[None] | None"]


class WorkerProtocolError(OrbitError):
    """The server answered a worker command with `ok: false`.

    `code` is one of the protocol error codes (`RATE_LIMITED`, `QUEUE_PAUSED`,
    `LEASE_EXPIRED`, `LEASE_LOST`, `TASK_CANCELLED`, `START_DEADLINE_EXCEEDED`,
    `STATE_CONFLICT`, `NOT_FOUND`, `INVALID_ARGUMENT`, `UNAVAILABLE`, ...);
    `retry_after_ms` is the server's hint (None when absent).
    """

    def __init__(self, code: str, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms


def reply_result(reply: dict[str, Any] | BaseException) -> dict[str, Any]:
    """A command's reply without `reply_to`/`ok`; `WorkerProtocolError` for `ok: false`; the
    exception itself when there was no reply (what `send_nowait` passes on)."""
    if isinstance(reply, BaseException):
        raise reply
    if not reply.get("ok"):
        err = reply.get("error") or {}
        raise WorkerProtocolError(str(err.get("code") or "UNKNOWN"), str(err.get("message") or ""),
                                  err.get("retry_after_ms"))
    return {k: v for k, v in reply.items() if k not in ("reply_to", "ok")}


class WorkerConnectionClosed(TransportError):
    """The session closed (or a reply did not come in time) before the command was answered.

    The outcome is unknown: resend the *same* message id on a new session.
    """


class _Ids:
    """128 random bits drawn once per process (again in a forked child), then a counter: as
    unique as a uuid4 per id, without a system call for every frame."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self.prefix = os.urandom(16).hex()
        self.next = itertools.count(1).__next__


_ids = _Ids()


def new_message_id(kind: str = "m") -> str:
    """A globally unique message id (visible ASCII, well under 128 characters)."""
    return f"{kind}-{_ids.prefix}{_ids.next():x}"


def worker_connect_url(url: str) -> str:
    """`http(s)://host[:port][/prefix]` (or `ws(s)://...`) → the worker WebSocket URL."""
    base = url.strip().rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base[len("https://"):]
    elif base.startswith("http://"):
        base = "ws://" + base[len("http://"):]
    elif not base.startswith(("ws://", "wss://")):
        raise ValueError(f"not an http(s) or ws(s) URL: {url!r}")
    if not base.endswith(CONNECT_PATH):
        base += CONNECT_PATH
    return base


class _Masks:
    """Frame masks (RFC 6455: unpredictable to the network) drawn from the system's CSPRNG a
    few kilobytes at a time rather than with a system call per frame."""

    def __init__(self) -> None:
        self.reseed()
        os.register_at_fork(after_in_child=self.reseed)

    def reseed(self) -> None:
        self._pool = b""
        self._at = 0

    def next(self) -> bytes:
        if self._at + 4 > len(self._pool):
            self._pool, self._at = os.urandom(4096), 0
        self._at += 4
        return self._pool[self._at - 4:self._at]


_masks = _Masks()


def _text_frame(payload: bytes) -> bytes:
    """One final, masked text frame (what `send_text` would write, without its checks and
    allocations: the connection is known to be open and not inside a fragmented message)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x81, 0x80 | n))
    elif n < 65536:
        head = bytes((0x81, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x81, 0x80 | 127)) + n.to_bytes(8, "big")
    mask = _masks.next()
    return head + mask + apply_mask(payload, mask)


class _Connection(ClientConnection):
    """websockets' client connection with a worker's two hot paths made direct: a text frame is
    written at once (`send_now`), through a transport that joins what one loop iteration writes
    into one `send()`; and each whole text message goes to `on_text` as it arrives, instead of
    through a queue read by a task. Once the session reads its messages that way and the library's
    parser rests between two frames, the frames are cut here (`data_received`): an unfragmented
    text frame goes to `on_text`, any other frame, whole, to the library, whose parser thus
    always starts at a frame's first byte. Everything else (handshake, TLS, proxies, pings,
    close, flow control) is the library's."""

    on_text: Callable[[bytes], None] | None = None
    _parts: list[bytes] | None = None
    _own: bytearray | None = None  # bytes of frames not whole yet, once frames are cut here
    _owned = False  # frames were cut here, and no longer are (the connection is closing)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(CorkedTransport(transport, asyncio.get_running_loop()))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        own = self._own
        if own is None:
            super().data_received(data)
            if (self.on_text is not None and not self._owned and self.response is not None
                    and self.protocol.state is State.OPEN and at_frame_boundary(self.protocol)):
                self._own = bytearray()
            return
        own += data
        pos, end = 0, len(own)
        while (head := frame_head(own, pos, end)) is not None:
            head1, head2, at, stop = head
            if stop > end:
                break
            if head1 == 0x81 and not head2 & 0x80 and self._parts is None:  # final text, no extension bit
                self.on_text(bytes(own[at:stop]))
            else:
                super().data_received(bytes(own[pos:stop]))
                if self.protocol.state is not State.OPEN:
                    rest = bytes(own[stop:])
                    self._own, self._owned = None, True
                    if rest:
                        super().data_received(rest)
                    return
            pos = stop
        del own[:pos]

    def process_event(self, event: Any) -> None:
        if self.on_text is None or self.response is None or not isinstance(event, Frame):
            super().process_event(event)
            return
        opcode = event.opcode
        if opcode is Opcode.TEXT or (opcode is Opcode.CONT and self._parts is not None):
            if event.fin and self._parts is None:
                self.on_text(event.data)
            elif event.fin:
                self._parts.append(event.data)
                data, self._parts = b"".join(self._parts), None
                self.on_text(data)
            else:
                self._parts = [*(self._parts or []), event.data]
            return
        super().process_event(event)

    def send_now(self, text: bytes) -> bool:
        """Write one text frame without waiting, if the socket takes it now; False when the
        caller must use `send` (the connection is closing, or its buffer is full)."""
        if self.protocol.state is not State.OPEN or self.paused or self.send_in_progress is not None:
            return False
        self.transport.write(_text_frame(text))
        return True


class _Callback:
    """Who waits for the reply of a command sent with `send_nowait`."""

    __slots__ = ("on_reply", "type_")

    def __init__(self, on_reply: Callable[[Any], None], type_: str) -> None:
        self.on_reply = on_reply
        self.type_ = type_


def _no_reply(type_: str, limit: float) -> WorkerConnectionClosed:
    """What a command whose reply did not come within `limit` seconds ends with, whichever way it was sent."""
    return WorkerConnectionClosed(f"no reply to {type_} within {limit:.0f}s; resend the same message id")


def _retrieve(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _denied(exc: InvalidStatus) -> APIError:
    """An upgrade refused with an HTTP status: the server's error envelope as an APIError."""
    response = exc.response
    status = int(getattr(response, "status_code", 0) or 0)
    code, message, request_id, details = "UNAVAILABLE" if status >= 500 else "HTTP_ERROR", f"HTTP {status}", None, None
    with contextlib.suppress(Exception):
        body = json.loads(bytes(response.body or b"").decode())
        err = body.get("error") or {}
        code = err.get("code") or code
        message = err.get("message") or message
        details = err.get("details")
        request_id = body.get("request_id") or None
    retry_after = 0.0
    with contextlib.suppress(Exception):
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
    return APIError(code, message, status_code=status, request_id=request_id, details=details,
                    retry_after=retry_after)


class WorkerSession:
    """One worker WebSocket session (async). Use `await WorkerSession.connect(...)`.

    ```python
    async with await WorkerSession.connect(url, token, node_id="host-1", queues=[qid]) as s:
        leases = await s.claim(qid, max_tasks=1, wait_ms=10_000)
        for lease in leases:
            await s.start(lease["lease_id"], msg_id=start_id)   # never run without it
            ...
            await s.complete(lease["lease_id"], "succeeded", result={"ok": True}, msg_id=report_id)
    ```
    """

    def __init__(self, ws: Any, *, on_push: PushHandler | None = None,
                 reply_timeout: float = DEFAULT_REPLY_TIMEOUT) -> None:
        self._ws = ws
        self._on_push = on_push
        # Sessions live on the loop that opened them; asking asyncio for it is a getpid() each time.
        self._loop = asyncio.get_running_loop()
        self.reply_timeout = reply_timeout
        self.pushes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        # Each command's reply goes to its caller's future (`call`) or callback (`send_nowait`).
        self._waiting: dict[str, asyncio.Future | _Callback] = {}
        # (deadline, msg_id, callback) of the commands sent with `send_nowait`, in sending order.
        self._due: collections.deque[tuple[float, str, _Callback]] = collections.deque()
        self._sweeper: asyncio.TimerHandle | None = None
        self._send_lock = asyncio.Lock()
        self._closed = asyncio.Event()
        self._direct = isinstance(ws, _Connection)
        if self._direct:
            ws.on_text = self._on_text
        self._push_tasks: set[asyncio.Task] = set()
        self.close_code: int | None = None
        self.close_reason: str = ""
        # Filled in by hello.
        self.session_id: str | None = None
        self.default_lease_ms: int = 30_000
        self.max_lease_ms: int = 600_000
        self.heartbeat_ms: int = 10_000
        self._reader = asyncio.create_task(self._read(), name="orbit-worker-session-reader")

    # ------------------------------------------------------------ lifecycle

    @classmethod
    async def connect(
        cls,
        url: str,
        token: str,
        node_id: str,
        queues: list[str] | tuple[str, ...] = (),
        *,
        sdk: str = SDK_NAME,
        on_push: PushHandler | None = None,
        open_timeout: float = 10.0,
        reply_timeout: float = DEFAULT_REPLY_TIMEOUT,
        hello_msg_id: str | None = None,
    ) -> WorkerSession:
        """Open the socket (`Authorization: Bearer` on the upgrade) and send `hello`.

        Raises `APIError` when the upgrade is refused (401/403/503, ...),
        `TransportError` when the server cannot be reached, and
        `WorkerProtocolError` when `hello` is refused (e.g. a queue out of scope).
        """
        target = worker_connect_url(url)
        try:
            ws = await websockets.connect(
                target,
                additional_headers={"Authorization": f"Bearer {token}"},
                open_timeout=open_timeout,
                max_size=None,
                compression=None,  # small frames on a local network: zlib per frame costs more than it saves
                user_agent_header=f"{SDK_NAME} orbit-worker",
                create_connection=_Connection,
            )
        except InvalidStatus as exc:
            raise _denied(exc) from None
        except InvalidURI as exc:
            raise ValueError(f"invalid worker URL: {exc}") from None
        except (TimeoutError, OSError, InvalidHandshake, ConnectionClosed) as exc:
            raise TransportError(f"could not open the worker session: {type(exc).__name__}: {exc}") from None
        session = cls(ws, on_push=on_push, reply_timeout=reply_timeout)
        try:
            reply = await session.hello(node_id, list(queues), sdk=sdk, msg_id=hello_msg_id)
        except BaseException:
            await session.close()
            raise
        log.debug("worker session opened session_id=%s", reply.get("session_id"))
        return session

    async def __aenter__(self) -> WorkerSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Close the socket; commands still waiting fail with `WorkerConnectionClosed`."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._ws.close(code, reason), 5)
        if not self._reader.done():
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        self._mark_closed()

    def _mark_closed(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._due.clear()
        with contextlib.suppress(Exception):
            self.close_code = self._ws.close_code
            self.close_reason = self._ws.close_reason or ""
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            exc = WorkerConnectionClosed(f"the worker session closed (code {self.close_code}) before the reply; "
                                         "resend the same message id")
            if type(waiter) is _Callback:
                self._loop.call_soon(waiter.on_reply, exc)
            elif not waiter.done():
                waiter.set_exception(exc)

    async def _read(self) -> None:
        try:
            if self._direct:  # messages arrive through _on_text
                await self._ws.wait_closed()
                return
            async for raw in self._ws:
                self._on_text(raw)
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("worker session reader failed", exc_info=True)
        finally:
            self._mark_closed()

    def _on_text(self, raw: bytes | str) -> None:
        try:
            msg = orjson.loads(raw)
        except orjson.JSONDecodeError:
            log.warning("worker session: ignoring a frame that is not JSON")
            return
        if not isinstance(msg, dict):
            return
        reply_to = msg.get("reply_to")
        if reply_to is not None:
            waiter = self._waiting.pop(reply_to, None)
            if waiter is None:
                return
            if type(waiter) is not _Callback:
                if not waiter.done():
                    waiter.set_result(msg)
                return
            try:
                waiter.on_reply(msg)
            except Exception:
                log.exception("worker session: a reply's callback failed type=%s", waiter.type_)
            return
        self._dispatch_push(msg)

    def _dispatch_push(self, msg: dict[str, Any]) -> None:
        if self._on_push is None:
            self.pushes.put_nowait(msg)
            return
        try:
            result = self._on_push(msg)
        except Exception:
            log.warning("worker push handler failed type=%s", msg.get("type"), exc_info=True)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._push_tasks.add(task)
            task.add_done_callback(self._push_tasks.discard)

    # ------------------------------------------------------------ commands

    async def call(self, type_: str, *, msg_id: str | None = None, timeout: float | None = None,
                   **fields: Any) -> dict[str, Any]:
        """Send one command frame and return its successful reply (without `reply_to`/`ok`).

        Raises `WorkerProtocolError` for `ok: false`, `WorkerConnectionClosed`
        when the session ends (or `timeout` passes) before the reply.
        """
        msg_id = msg_id or new_message_id(type_)
        if self._closed.is_set():
            raise WorkerConnectionClosed("the worker session is closed; resend the same message id")
        frame = orjson.dumps({"type": type_, "id": msg_id, **fields})
        loop = self._loop
        fut = self._waiter(msg_id)
        try:
            if not (self._direct and self._ws.send_now(frame)):
                async with self._send_lock:
                    await self._ws.send(frame, text=True)
        except ConnectionClosed:
            self._waiting.pop(msg_id, None)
            raise WorkerConnectionClosed("the worker session closed while sending; resend the same message id") \
                from None
        # A timer, not `wait_for` (on Python 3.11 it swallows a cancellation that arrives together
        # with the reply, and a cancelled renew loop would then renew forever) nor a timeout
        # context (a task lookup and a rescheduled handle per command).
        limit = timeout or self.reply_timeout
        timer = loop.call_later(limit, self._expire, msg_id, fut, type_, limit)
        try:
            reply = await fut
        finally:
            timer.cancel()
            if fut.cancelled() and self._waiting.get(msg_id) is fut:  # its caller was cancelled
                self._waiting.pop(msg_id, None)
        return reply_result(reply)

    def send_nowait(self, type_: str, msg_id: str, fields: dict[str, Any],
                    on_reply: Callable[[dict[str, Any] | BaseException], None]) -> bool:
        """Send one command frame now, without a task or a future waiting for it: `on_reply` gets
        its raw reply (pass it to `reply_result`) as the frame that carries it is read, or the
        `WorkerConnectionClosed` that `call` would raise. False when the frame cannot leave at
        once (closing, or the socket's buffer is full): use `call` then."""
        if self._closed.is_set() or not self._direct:
            return False
        frame = orjson.dumps({"type": type_, "id": msg_id, **fields})
        try:
            if not self._ws.send_now(frame):
                return False
        except ConnectionClosed:
            return False
        waiter = _Callback(on_reply, type_)
        self._waiting[msg_id] = waiter
        # One timer per session, not per command: commands share the reply timeout, so their
        # deadlines come in the order they were sent, and answered ones are dropped as they lead.
        due = self._due
        waiting = self._waiting
        while due and waiting.get(due[0][1]) is not due[0][2]:
            due.popleft()
        due.append((self._loop.time() + self.reply_timeout, msg_id, waiter))
        if self._sweeper is None:
            self._sweeper = self._loop.call_later(self._sweep_every(), self._sweep_due)
        return True

    def _waiter(self, msg_id: str) -> asyncio.Future:
        """The future the reply to `msg_id` resolves: the one still pending for a resend of the
        same id, else a new one."""
        fut = self._waiting.get(msg_id)
        if fut is None or type(fut) is _Callback or fut.done():
            fut = self._loop.create_future()
            # A close that fails it after its caller gave up must not leave an exception nobody retrieves.
            fut.add_done_callback(_retrieve)
            self._waiting[msg_id] = fut
        return fut

    def _sweep_every(self) -> float:
        return min(1.0, self.reply_timeout / 4)

    def _sweep_due(self) -> None:
        """Fail the commands sent with `send_nowait` whose reply did not come in time."""
        self._sweeper = None
        now = self._loop.time()
        due = self._due
        waiting = self._waiting
        while due and (waiting.get(due[0][1]) is not due[0][2] or due[0][0] <= now):
            _, msg_id, waiter = due.popleft()
            if waiting.get(msg_id) is waiter:
                del waiting[msg_id]
                self._loop.call_soon(waiter.on_reply, _no_reply(waiter.type_, self.reply_timeout))
        if due and not self._closed.is_set():
            self._sweeper = self._loop.call_later(self._sweep_every(), self._sweep_due)

    def _expire(self, msg_id: str, fut: asyncio.Future, type_: str, limit: float) -> None:
        if fut.done():
            return
        if self._waiting.get(msg_id) is fut:
            self._waiting.pop(msg_id, None)
        fut.set_exception(_no_reply(type_, limit))

    async def hello(self, node_id: str, queues: list[str], *, sdk: str = SDK_NAME,
                    msg_id: str | None = None) -> dict[str, Any]:
        reply = await self.call("hello", msg_id=msg_id, node_id=node_id, queues=list(queues), sdk=sdk)
        self.session_id = reply.get("session_id")
        self.default_lease_ms = int(reply.get("default_lease_ms", self.default_lease_ms))
        self.max_lease_ms = int(reply.get("max_lease_ms", self.max_lease_ms))
        self.heartbeat_ms = int(reply.get("heartbeat_ms", self.heartbeat_ms))
        return reply

    async def claim(self, queue_id: str, *, max_tasks: int = 1, lease_ms: int = 30_000, wait_ms: int = 0,
                    msg_id: str | None = None) -> list[dict[str, Any]]:
        """Lease up to `max_tasks` tasks; long-polls up to `wait_ms`. Returns the leases (maybe none)."""
        reply = await self.call("claim", msg_id=msg_id, timeout=self.reply_timeout + wait_ms / 1000,
                                queue_id=queue_id, max_tasks=max_tasks, lease_ms=lease_ms, wait_ms=wait_ms)
        return list(reply.get("tasks") or [])

    async def start(self, lease_id: str, *, msg_id: str | None = None) -> dict[str, Any]:
        """Ask for the Start authorization: `attempt`, `started_at`, `start_receipt_id`, `deadline_at`."""
        return await self.call("start", msg_id=msg_id, lease_id=lease_id)

    async def renew(self, lease_id: str, lease_ms: int = 30_000, *, msg_id: str | None = None) -> dict[str, Any]:
        """Extend the lease: `lease_expires_at`, `cancel_requested`."""
        return await self.call("renew", msg_id=msg_id, lease_id=lease_id, lease_ms=lease_ms)

    async def complete(self, lease_id: str, outcome: str, *, result: Any = None, error: str | None = None,
                       retryable: bool = True, msg_id: str | None = None) -> dict[str, Any]:
        """Report `succeeded` (with `result`), `failed` (with `error`, `retryable`) or `cancelled`."""
        fields: dict[str, Any] = {"lease_id": lease_id, "outcome": outcome}
        if outcome == "succeeded":
            fields["result"] = result
        elif outcome == "failed":
            fields["error"] = {"message": error or "handler failed", "retryable": bool(retryable)}
        elif outcome != "cancelled":
            raise ValueError("outcome must be succeeded, failed or cancelled")
        return await self.call("complete", msg_id=msg_id, **fields)

    async def release(self, lease_id: str, *, msg_id: str | None = None) -> dict[str, Any]:
        """Give back a leased, not-started task (WAITING again, no attempt consumed)."""
        return await self.call("release", msg_id=msg_id, lease_id=lease_id)

    async def ping(self, *, msg_id: str | None = None) -> dict[str, Any]:
        return await self.call("ping", msg_id=msg_id)
