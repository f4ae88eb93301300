"""Bounded waiting (overload.py): slots in arrival order with a bounded wait, the deadline of a
request's waits, and the group commits' refusal of commands that waited too long (batching.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from orbit.server import batching
from orbit.server.batching import GroupCommitter, KeyedBatcher
from orbit.server.errors import DatabaseUnavailable, Overloaded
from orbit.server.overload import Slots, deadline, time_left, waits_until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_free_slots_are_taken_at_once_and_the_next_caller_waits_for_one():
    slots = Slots(2, 1.0)
    assert slots.try_enter() and await slots.enter()
    assert not slots.try_enter() and slots.taken == 2
    waiter = asyncio.create_task(slots.enter())
    await asyncio.sleep(0.01)
    assert slots.waiting == 1 and not waiter.done()
    slots.leave()  # handed over: still two taken
    assert await waiter is True
    assert (slots.taken, slots.waiting, slots.refused) == (2, 0, 0)
    slots.leave()
    slots.leave()
    assert slots.taken == 0 and slots.try_enter()


async def test_waiters_are_served_in_arrival_order():
    slots = Slots(1, 1.0, max_waiting=10)
    assert slots.try_enter()
    served: list[int] = []

    async def wait(i: int) -> None:
        assert await slots.enter()
        served.append(i)

    tasks = [asyncio.create_task(wait(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert not slots.try_enter()  # never ahead of a waiter
    for _ in range(5):
        slots.leave()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert served == [0, 1, 2, 3, 4]


async def test_a_wait_is_bounded_and_a_full_queue_refuses_at_once():
    slots = Slots(1, 0.05, max_waiting=1)
    assert slots.try_enter()
    started = time.monotonic()
    first = asyncio.create_task(slots.enter())
    await asyncio.sleep(0)
    assert await slots.enter() is False  # the one waiting place is taken: refused without waiting
    assert time.monotonic() - started < 0.04
    assert await first is False  # waited its 50 ms, then refused
    assert 0.04 <= time.monotonic() - started < 0.5
    assert (slots.refused, slots.waiting, slots.taken) == (2, 0, 1)
    assert await slots.enter(0.0) is False and slots.refused == 3  # a wait of its own: none at all


async def test_a_cancelled_waiter_leaks_no_slot():
    slots = Slots(1, 5.0, max_waiting=5)
    assert slots.try_enter()
    waiter = asyncio.create_task(slots.enter())
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.waiting == 0
    slots.leave()
    assert slots.taken == 0

    # Cancelled right after it was handed the slot: the slot goes on, not lost.
    assert slots.try_enter()
    waiter = asyncio.create_task(slots.enter())
    second = asyncio.create_task(slots.enter())
    await asyncio.sleep(0.01)
    slots.leave()  # to `waiter`, whose task has not run since
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await second is True
    slots.leave()
    assert slots.taken == 0


async def test_the_deadline_of_a_request_bounds_every_wait_inside_it():
    assert deadline() is None and time_left(3.0) == 3.0
    with waits_until(time.monotonic() + 0.5):
        assert 0.4 < time_left(3.0) <= 0.5
        assert time_left(0.1) == 0.1
        with waits_until(None):
            assert time_left(3.0) == 3.0
    assert deadline() is None
    with waits_until(time.monotonic() - 1):
        assert time_left(3.0) < 0


async def test_a_group_commit_answers_unavailable_to_commands_that_waited_too_long(monkeypatch):
    monkeypatch.setattr(batching, "MAX_QUEUED_S", 0.05)
    release = asyncio.Event()
    ran: list[list[int]] = []

    async def run(cmds: list[int]) -> list[dict]:
        ran.append(cmds)
        await release.wait()
        return [{"ok": c} for c in cmds]

    gc: GroupCommitter[int] = GroupCommitter("t", run, parallel=1, linger=0)
    gc.start()
    try:
        first = gc.enqueue(1)
        await asyncio.sleep(0.01)  # its transaction holds the one slot
        late = [gc.enqueue(i) for i in (2, 3)]
        await asyncio.sleep(0.1)  # they wait longer than MAX_QUEUED_S for a slot
        release.set()
        assert await first == {"ok": 1}
        for fut in late:
            reply = await fut
            assert isinstance(reply, Overloaded) and isinstance(reply, DatabaseUnavailable)
            assert reply.code == "UNAVAILABLE" and reply.retry_after_ms == 1000
        assert ran == [[1]] and gc.shed == 2  # never run
        assert await gc.enqueue(4) == {"ok": 4}  # and the node serves again
    finally:
        await gc.stop()


async def test_a_keyed_batcher_refuses_commands_past_their_time_and_serves_the_others(monkeypatch):
    monkeypatch.setattr(batching, "MAX_QUEUED_S", 0.05)
    release = asyncio.Event()
    ran: list[list[str]] = []

    async def run(cmds: list[str]) -> list[str]:
        ran.append(cmds)
        if cmds == ["slow"]:
            await release.wait()
        return [c.upper() for c in cmds]

    b: KeyedBatcher[str, str] = KeyedBatcher("t", run)
    slow = asyncio.create_task(b.submit("q", "slow"))
    await asyncio.sleep(0.01)
    late = asyncio.create_task(b.submit("q", "late"))
    await asyncio.sleep(0.1)
    fresh = asyncio.create_task(b.submit("q", "fresh"))
    await asyncio.sleep(0)
    release.set()
    assert await slow == "SLOW"
    with pytest.raises(Overloaded):
        await late
    assert await fresh == "FRESH"
    assert ran == [["slow"], ["fresh"]] and b.shed == 1


async def test_a_command_queued_by_a_request_keeps_that_request_s_deadline():
    release = asyncio.Event()

    async def run(cmds: list[str]) -> list[str]:
        if cmds == ["slow"]:
            await release.wait()
        return cmds

    b: KeyedBatcher[str, str] = KeyedBatcher("t", run)
    slow = asyncio.create_task(b.submit("q", "slow"))
    await asyncio.sleep(0.01)
    with waits_until(time.monotonic() + 0.05):  # sooner than MAX_QUEUED_S
        hurried = asyncio.create_task(b.submit("q", "hurried"))
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    release.set()
    assert await slow == "slow"
    with pytest.raises(Overloaded):
        await hurried
