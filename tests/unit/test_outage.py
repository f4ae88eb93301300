"""A node without its database: backoff, log lines and retry hints (core/outage.py), the node's
one view of the database (store/health.py) and the background loops' reaction, without I/O."""

from __future__ import annotations

import asyncio
import functools

import pytest
from structlog.testing import capture_logs

from orbit.server import loops as loops_module
from orbit.server.core.outage import BACKOFF_CAP_S, Backoff, Outage
from orbit.server.errors import DatabaseUnavailable
from orbit.server.loops import BackgroundLoops
from orbit.server.store import health as health_module
from orbit.server.store.health import DatabaseHealth

# ---------------------------------------------------------------- core/outage.py


def test_backoff_doubles_from_one_second_up_to_its_cap():
    b = Backoff()
    assert [b.next() for _ in range(8)] == [1, 2, 4, 8, 16, 30, 30, 30]
    b.reset()
    assert b.next() == 1


def test_an_outage_is_logged_once_then_once_per_step_then_once_when_it_ends():
    o = Outage()
    reports = []
    # A failed attempt every 50 ms for four minutes: what a node's loops and probe would see.
    for i in range(240 * 20):
        t = 100.0 + i / 20
        r = o.failed(t, "OperationalError 2003")
        if r is not None:
            reports.append((round(t - 100.0, 2), r.event))
    t += 0.05
    assert reports[0] == (0.0, "database_unavailable")
    assert all(event == "database_still_unavailable" for _, event in reports[1:])
    times = [at for at, _ in reports]
    assert times[:6] == [0, 1, 3, 7, 15, 31]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) <= BACKOFF_CAP_S + 0.06  # never quieter than one line per 30 s
    assert len(reports) == 12  # 0, 1, 3, 7, 15, 31, then every 30 s: 61, 91, … 211
    assert sum(1 for at in times if at < 10) == 4  # the first ten seconds: four lines, whatever the load

    back = o.recovered(t)
    assert back is not None and back.event == "database_available"
    assert back.fields["failed_attempts"] == 4800 and back.fields["down_s"] == pytest.approx(240, abs=0.1)
    assert o.recovered(t + 1) is None and not o.down


def test_log_lines_never_carry_the_error_message():
    o = Outage()
    began = o.failed(0, "OperationalError 2003")
    assert began is not None and began.fields == {"error": "OperationalError 2003"}


def test_a_new_outage_starts_its_backoff_again():
    o = Outage()
    for t in range(0, 100):
        o.failed(float(t), "E")
    o.recovered(100.0)
    assert o.failed(200.0, "E").event == "database_unavailable"
    assert o.failed(200.5, "E") is None
    assert o.failed(201.0, "E").event == "database_still_unavailable"


def test_clients_are_told_to_wait_longer_as_the_outage_lasts_but_never_over_five_seconds():
    o = Outage()
    assert o.retry_after_ms() == 1000  # no outage: contention, one second
    hints = []
    t = 0.0
    while t < 60:
        o.failed(t, "E")
        hints.append(o.retry_after_ms())
        t += 0.5
    assert hints[0] == 1000 and max(hints) == 5000 and hints == sorted(hints)
    o.recovered(t)
    assert o.retry_after_ms() == 1000


# ---------------------------------------------------------------- store/health.py


class FakeProbe:
    """A probe that fails while `down` is set; counts its calls."""

    def __init__(self) -> None:
        self.down = False
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.down:
            raise ConnectionRefusedError(111, "refused")


@pytest.fixture
def fast_probe(monkeypatch):
    monkeypatch.setattr(health_module, "PROBE_INTERVAL_S", 0.01)


async def _until(cond, timeout: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def test_one_lost_connection_with_a_database_that_answers_is_no_outage(fast_probe):
    async def scenario():
        probe = FakeProbe()
        health = DatabaseHealth(probe)
        heard: list[bool] = []
        health.subscribe(heard.append)
        with capture_logs() as logs:
            health.lost(ConnectionResetError())
            await _until(lambda: probe.calls == 1)
            await asyncio.sleep(0.05)
        assert health.available and heard == [] and logs == []
        await health.close()

    asyncio.run(scenario())


def test_a_confirmed_outage_refuses_at_once_and_ends_by_itself(fast_probe):
    async def scenario():
        probe = FakeProbe()
        order: list[str] = []

        async def drop_pools() -> None:
            order.append("pools dropped")

        health = DatabaseHealth(probe, drop_pools)
        health.subscribe(lambda available: order.append(f"available={available}"))
        probe.down = True
        with capture_logs() as logs:
            health.lost(ConnectionResetError())
            health.lost(ConnectionResetError())  # a second failure does not start a second probe
            await _until(lambda: not health.available)
            refusal = health.unavailable()
            assert isinstance(refusal, DatabaseUnavailable) and refusal.code == "UNAVAILABLE"
            assert refusal.retry_after_ms >= 1000
            await _until(lambda: probe.calls >= 5)
            waiter = asyncio.ensure_future(health.wait_available())
            await asyncio.sleep(0.02)
            assert not waiter.done()
            probe.down = False
            await asyncio.wait_for(waiter, 2)
        assert health.available
        assert order == ["available=False", "pools dropped", "available=True"]
        events = [e["event"] for e in logs]
        assert events[0] == "database_unavailable" and events[-1] == "database_available"
        assert events.count("database_unavailable") == 1 and events.count("database_available") == 1
        assert logs[0]["error"] == "ConnectionRefusedError"
        assert not any("exc_info" in e for e in logs)
        await health.close()

    asyncio.run(scenario())


# ---------------------------------------------------------------- loops.py


class Gate:
    def __init__(self) -> None:
        self.available = True
        self._back = asyncio.Event()
        self._back.set()

    def close(self) -> None:
        self.available = False
        self._back.clear()

    def open(self) -> None:
        self.available = True
        self._back.set()

    async def wait_available(self) -> None:
        await self._back.wait()


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(loops_module, "Backoff", functools.partial(Backoff, initial=0.01, cap=0.04))


def test_loops_do_not_run_while_the_database_is_down_and_resume_at_once(fast_backoff):
    async def scenario():
        gate = Gate()
        runs: list[float] = []

        async def iteration():
            runs.append(asyncio.get_running_loop().time())

        loops = BackgroundLoops(gate=gate)
        gate.close()
        loops.every(0.01, "sweep", iteration)
        await asyncio.sleep(0.1)
        assert runs == []
        gate.open()
        await _until(lambda: len(runs) >= 3)
        await asyncio.wait_for(loops.stop(), 2)

    asyncio.run(scenario())


def test_a_loop_stops_promptly_while_it_waits_for_the_database():
    async def scenario():
        gate = Gate()
        gate.close()
        loops = BackgroundLoops(gate=gate)
        loops.every(0.01, "sweep", lambda: asyncio.sleep(0))
        await asyncio.sleep(0.02)
        await asyncio.wait_for(loops.stop(grace=1), 2)

    asyncio.run(scenario())


def test_a_failing_loop_backs_off_and_logs_once_per_step_then_once_when_it_works(fast_backoff):
    async def scenario():
        calls: list[float] = []
        failing = True

        async def iteration():
            calls.append(asyncio.get_running_loop().time())
            if failing:
                raise RuntimeError("boom")

        with capture_logs() as logs:
            loops = BackgroundLoops()
            loops.every(0.001, "sweep", iteration)
            await _until(lambda: len(calls) >= 6)
            failing = False
            n = len(calls)
            await _until(lambda: len(calls) >= n + 3)
            await asyncio.wait_for(loops.stop(), 2)
        gaps = [b - a for a, b in zip(calls, calls[1:6])]
        assert gaps[0] >= 0.009 and gaps[-1] >= 0.039  # 10 ms, 20, 40, 40: backed off, capped
        events = [e["event"] for e in logs]
        assert events[0] == "background_loop_failed" and logs[0].get("exc_info")  # the first: traceback
        still = [e for e in logs if e["event"] == "background_loop_still_failing"]
        assert still and all("exc_info" not in e and e["error"] == "RuntimeError" for e in still)
        assert len(events) == n + 1  # one line per failure (one per step), plus one on recovery
        assert events[-1] == "background_loop_recovered"

    asyncio.run(scenario())


def test_a_loop_refused_by_the_database_leaves_the_reporting_to_the_database(fast_backoff):
    async def scenario():
        calls = 0

        async def iteration():
            nonlocal calls
            calls += 1
            raise DatabaseUnavailable("lock conflicts outlasted the retries")

        with capture_logs() as logs:
            loops = BackgroundLoops(gate=Gate())
            loops.every(0.001, "sweep", iteration)
            await _until(lambda: calls >= 4)
            await asyncio.wait_for(loops.stop(), 2)
        assert logs == []

    asyncio.run(scenario())
