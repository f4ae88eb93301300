"""Background loops end at shutdown, even when the database driver mangles a cancel."""

import asyncio

import pytest

from orbit.server.batching import KeyedBatcher
from orbit.server.loops import BackgroundLoops

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class DriverError(Exception):
    """What asyncmy raises when a cancel lands mid-query: not a CancelledError."""


async def _query_that_mangles_cancels(seconds: float) -> None:
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        raise DriverError("Cancelled during execution") from None


async def test_stop_lets_the_running_iteration_finish_instead_of_cancelling_it():
    finished: list[int] = []

    async def iteration():
        await _query_that_mangles_cancels(0.05)
        finished.append(1)

    loops = BackgroundLoops()
    loops.every(10, "sweep", iteration)
    await asyncio.sleep(0.01)  # the first iteration is mid-query
    await asyncio.wait_for(loops.stop(grace=2), 3)
    assert finished == [1]


async def test_a_cancel_reported_as_a_driver_error_still_ends_the_loop():
    """The regression: the loop logged the driver's error and went on forever."""
    loops = BackgroundLoops()
    loops.every(0.01, "stuck", lambda: _query_that_mangles_cancels(60))
    await asyncio.sleep(0.02)
    await asyncio.wait_for(loops.stop(grace=0.05), 3)


async def test_a_wake_runs_the_loop_before_its_period():
    runs: list[float] = []
    wake = asyncio.Event()

    async def iteration():
        runs.append(asyncio.get_running_loop().time())

    loops = BackgroundLoops()
    loops.every(60, "push", iteration, wake=wake)
    await asyncio.sleep(0.01)
    wake.set()
    await asyncio.sleep(0.05)
    await loops.stop()
    assert len(runs) == 2


async def test_a_batcher_stopped_mid_transaction_ends():
    async def run(cmds: list[int]) -> list[int]:
        await _query_that_mangles_cancels(60)
        return cmds

    b: KeyedBatcher[int, int] = KeyedBatcher("t", run, max_batch=1)  # two more batches wait
    pending = [asyncio.ensure_future(b.submit("q", i)) for i in range(3)]
    await asyncio.sleep(0.01)
    await asyncio.wait_for(b.stop(), 3)
    results = await asyncio.gather(*pending, return_exceptions=True)
    assert all(isinstance(r, BaseException) for r in results)
