"""A TCP proxy a test can cut and restore: a database outage without touching the database.

`TcpProxy(target_port).start()` listens on a free local port and forwards every connection to
the target. `cut()` closes every forwarded connection and refuses new ones (the listening port
is closed, so connects are refused, as when the database host's process is gone); `restore()`
listens on the same port again. It runs its own event loop in a thread, so sync and async
tests can both drive it.

`TcpProxy(pick=fn)` asks `fn()` for the (host, port) of each new connection: a load balancer
in front of several nodes (see `ReadyBalancer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Sequence

import httpx


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class TcpProxy:
    def __init__(self, target_port: int | None = None, target_host: str = "127.0.0.1", *, host: str = "127.0.0.1",
                 pick: Callable[[], tuple[str, int]] | None = None) -> None:
        if pick is None:
            assert target_port is not None
            target = (target_host, target_port)
            pick = lambda: target  # noqa: E731
        self.pick = pick
        self.host = host
        self.port = _free_port(host)
        self.connections = 0  # accepted since start, for the tests' own checks
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._serving: set[asyncio.Task] = set()

    # ------------------------------------------------------------ control (any thread)

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def cut(self) -> None:
        """Refuse new connections and drop every open one."""
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def close(self) -> None:
        if self._thread.is_alive():
            self._call(self._cut())
            self._call(self._finish())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    @property
    def is_cut(self) -> bool:
        return self._server is None

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # ------------------------------------------------------------ the proxy's loop

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    async def _finish(self) -> None:
        for t in list(self._serving):
            t.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)
        if self._server is None:
            writer.transport.abort()
            return
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.pick())
        except OSError:
            writer.transport.abort()
            return
        pair = {writer, up_writer}
        self._writers |= pair

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers -= pair


class ReadyBalancer:
    """A health-checking balancer in front of HTTP nodes: every new connection goes to the first
    node (in the given order) whose `GET /readyz` answered 200 at the last check, every 0.2 s;
    to the first node when none is ready. `served` counts connections per node."""

    def __init__(self, ports: Sequence[int], host: str = "127.0.0.1", interval: float = 0.2) -> None:
        self.nodes = [(host, p) for p in ports]
        self.ready = list(self.nodes)
        self.served: dict[int, int] = {p: 0 for p in ports}
        self._interval = interval
        self._stop = threading.Event()
        self._checker = threading.Thread(target=self._check, name="balancer-health", daemon=True)
        self.proxy = TcpProxy(pick=self._pick)

    @property
    def base_url(self) -> str:
        return f"http://{self.proxy.host}:{self.proxy.port}"

    def start(self) -> ReadyBalancer:
        self._checker.start()
        self.proxy.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self.proxy.close()
        self._checker.join(5)

    def _pick(self) -> tuple[str, int]:
        node = (self.ready or self.nodes)[0]
        self.served[node[1]] += 1
        return node

    def _check(self) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not self._stop.is_set():
                ready = []
                for host, port in self.nodes:
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(f"http://{host}:{port}/readyz").status_code == 200:
                            ready.append((host, port))
                self.ready = ready
                self._stop.wait(self._interval)
