"""The threads that run a Worker's plain handlers: outcomes and errors come back to the loop,
at most `size` threads run, calls not begun at shutdown are cancelled."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from orbit.sdk._threads import HandlerThreads

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_results_and_errors_come_back():
    threads = HandlerThreads(asyncio.get_running_loop(), 4)

    def work(i):
        if i % 3 == 0:
            raise ValueError(i)
        return i * 2

    outcomes = await asyncio.gather(*(threads.submit(work, i) for i in range(300)), return_exceptions=True)
    threads.shutdown()
    for i, out in enumerate(outcomes):
        if i % 3 == 0:
            assert isinstance(out, ValueError) and out.args == (i,)
        else:
            assert out == i * 2


async def test_never_more_threads_than_its_size_and_calls_run_in_them():
    threads = HandlerThreads(asyncio.get_running_loop(), 3)
    lock = threading.Lock()
    running = peak = 0
    names = set()

    def work():
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
            names.add(threading.current_thread().name)
        time.sleep(0.01)
        with lock:
            running -= 1
        return threading.current_thread() is not threading.main_thread()

    assert all(await asyncio.gather(*(threads.submit(work) for _ in range(30))))
    threads.shutdown()
    assert peak <= 3 and 1 <= len(names) <= 3


async def test_calls_not_begun_at_shutdown_are_cancelled():
    threads = HandlerThreads(asyncio.get_running_loop(), 1)
    gate = threading.Event()
    first = threads.submit(gate.wait, 5)
    queued = [threads.submit(lambda: 1) for _ in range(3)]
    await asyncio.sleep(0.05)
    threads.shutdown()
    gate.set()
    assert await first is True
    assert all(f.cancelled() for f in queued)
