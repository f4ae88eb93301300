"""Sized wake-ups of long-polling claims (wakeups.py `Notifier`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from orbit.server.wakeups import TIMED_OUT, Notifier

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _waiters(n: Notifier, queue: str, wants: list[int], timeout: float = 5.0) -> list[asyncio.Task]:
    tasks = []
    for want in wants:
        tasks.append(asyncio.create_task(n.wait(queue, timeout, want)))
        await asyncio.sleep(0)  # registered in this order
    await asyncio.sleep(0)
    return tasks


async def test_a_notification_wakes_the_longest_waiting_claims_that_cover_its_count() -> None:
    n = Notifier(0.025)
    a, b, c = await _waiters(n, "q", [10, 10, 10])
    n.notify("q", 15)
    await asyncio.wait_for(asyncio.gather(a, b), 1.0)
    await asyncio.sleep(0.01)
    assert not c.done()
    n.notify("q", 1)
    await asyncio.wait_for(c, 1.0)
    assert n.queues() == []


async def test_unknown_count_wakes_every_claim_and_other_queues_sleep_on() -> None:
    n = Notifier(0.025)
    tasks = await _waiters(n, "q", [1, 1, 1])
    (other,) = await _waiters(n, "r", [1])
    n.notify("q")
    await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
    await asyncio.sleep(0.01)
    assert not other.done()
    other.cancel()


async def test_a_notification_nobody_heard_is_kept_once_for_the_next_claim() -> None:
    n = Notifier(0.025)
    n.watch("q")  # a claim of this node is about to read the queue
    n.notify("q", 1)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await n.wait("q", 5.0)  # returns at once: its claim may have read before that work committed
    assert loop.time() - t0 < 1.0
    await n.wait("q", 0.01)  # the next one waits again
    assert n.queues() == []


async def test_timed_out_and_cancelled_waits_leave_no_entry_behind() -> None:
    n = Notifier(0.025)
    n.watch("q")
    await n.wait("q", 0.01)
    (t,) = await _waiters(n, "q", [5])
    t.cancel()
    await asyncio.gather(t, return_exceptions=True)
    assert n.queues() == []
    n.notify("q", 1)  # nobody waits: kept for the next claim
    await asyncio.wait_for(n.wait("q", 5.0), 1.0)


async def test_queues_nobody_polls_here_keep_nothing() -> None:
    n = Notifier(0.025)
    for i in range(1000):
        n.notify(f"q{i}", 1)
    assert not n._missed and n.queues() == []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    n.watch("q1")
    await n.wait("q1", 0.05)  # a first claim waits: it read after those submits committed
    assert loop.time() - t0 >= 0.04


async def test_claims_answered_leave_nothing_behind() -> None:
    """A queue is kept for only while a claim here polls it: claims on ever new queue ids (which
    need not exist) leave no entry, and neither do the notifications they missed."""
    n = Notifier(0.025)
    for i in range(1000):
        n.watch(f"q{i}")
        n.notify(f"q{i}", 1)
        await n.wait(f"q{i}", 0.001)
        n.notify(f"q{i}", 1)
        n.unwatch(f"q{i}")
    assert not n._polled and not n._missed and n.queues() == []
    n.watch("q")
    n.watch("q")
    n.unwatch("q")
    n.notify("q", 1)  # one claim still polls it: kept
    assert n._missed == {"q"}
    n.unwatch("q")
    assert not n._polled and not n._missed


async def test_a_submit_takes_the_longest_waiting_claims_that_offered_their_command() -> None:
    """`take` hands out only claims with an offer, oldest first, covering the count; a taken
    claim ends with the reply `serve` gives it, never with its timeout."""
    n = Notifier(0.025)
    plain = asyncio.create_task(n.wait("q", 5.0, 5))
    await asyncio.sleep(0)
    a = asyncio.create_task(n.wait("q", 0.05, 5, offer="claim-a"))
    await asyncio.sleep(0)
    b = asyncio.create_task(n.wait("q", 5.0, 5, offer="claim-b"))
    await asyncio.sleep(0)
    c = asyncio.create_task(n.wait("q", 5.0, 5, offer="claim-c"))
    await asyncio.sleep(0)
    taken = n.take("q", 6)
    assert [w.offer for w in taken] == ["claim-a", "claim-b"]
    await asyncio.sleep(0.1)  # past a's timeout: a taken claim waits for its answer
    assert not a.done() and not b.done()
    n.serve(taken, [{"tasks": ["t1"]}, {"tasks": []}])
    assert await a == {"tasks": ["t1"]}
    assert await b == {"tasks": []}
    n.notify("q", 1)  # the plain waiter and c are still listed, in their order
    await asyncio.wait_for(plain, 1.0)
    assert not c.done()
    (left,) = n.take("q", 1)
    n.serve([left], None)  # the transaction failed: the claim is woken to claim on its own
    assert await c is None
    assert n.queues() == []


async def test_a_taken_claim_whose_wait_was_cancelled_is_skipped_by_serve() -> None:
    n = Notifier(0.025)
    t = asyncio.create_task(n.wait("q", 5.0, 1, offer="claim"))
    await asyncio.sleep(0)
    taken = n.take("q", 1)
    t.cancel()
    await asyncio.gather(t, return_exceptions=True)
    n.serve(taken, [{"tasks": ["t1"]}])  # no error: the session went away meanwhile
    assert n.take("q", 1) == [] and n.queues() == []


def test_only_submits_far_enough_apart_on_a_polled_queue_count_as_sparse() -> None:
    from orbit.server.wakeups import HANDOFF_GAP_S

    n = Notifier(0.025)
    assert not n.sparse("q", 100.0)  # no claim polls it here
    n.watch("q")
    assert n.sparse("q", 100.0)  # the first one seen
    assert not n.sparse("q", 100.0 + HANDOFF_GAP_S / 2)
    assert n.sparse("q", 100.0 + HANDOFF_GAP_S * 2)
    n.unwatch("q")
    assert not n._last_submit  # forgotten with the last claim polling it


async def test_a_wait_tells_a_timeout_from_a_notification() -> None:
    n = Notifier(0.025)
    assert await n.wait("q", 0.01) is TIMED_OUT
    woken = asyncio.create_task(n.wait("q", 5.0))
    await asyncio.sleep(0)
    n.notify("q", 1)
    assert await woken is None


async def test_waiting_lists_the_claims_nothing_woke_or_took_per_queue() -> None:
    n = Notifier(0.025)
    a = asyncio.create_task(n.wait("q1", 5.0, 3, offer="claim-a"))
    b = asyncio.create_task(n.wait("q1", 5.0, 2, offer="claim-b"))
    c = asyncio.create_task(n.wait("q2", 5.0, 1, offer="claim-c"))
    await asyncio.sleep(0)
    assert {q: [w.offer for w in ws] for q, ws in n.waiting().items()} == {
        "q1": ["claim-a", "claim-b"], "q2": ["claim-c"]}
    (taken,) = n.take("q1", 1)
    n.notify("q2", 1)
    await c
    assert {q: [w.offer for w in ws] for q, ws in n.waiting().items()} == {"q1": ["claim-b"]}
    n.serve([taken], None)
    n.notify("q1")
    await asyncio.gather(a, b)
    assert n.waiting() == {}


async def test_a_poll_verdict_of_idle_holds_for_its_namespace_until_a_notification() -> None:
    n = Notifier(0.025)
    n.found_idle("q", "ns", 100.0)
    soon = 100.0 + n.idle_for_s / 2
    assert n.idle("q", "ns", soon)
    assert not n.idle("q", "other-ns", soon)  # a claim from elsewhere hears NOT_FOUND from its transaction
    assert not n.idle("q", "ns", 100.01 + n.idle_for_s)  # stale: the next poll has not confirmed it
    n.notify("q", 1)
    assert not n.idle("q", "ns", soon)


async def test_a_notification_during_the_poll_read_keeps_the_verdict_from_being_taken() -> None:
    n = Notifier(0.025)
    read_at = time.monotonic()
    n.notify("q", 1)  # committed work the read may not have seen
    n.found_idle("q", "ns", read_at)
    assert not n.idle("q", "ns", time.monotonic())
    n.found_idle("q", "ns", time.monotonic())  # the next poll's read began after it
    assert n.idle("q", "ns", time.monotonic())


async def test_old_verdicts_and_notification_times_are_forgotten() -> None:
    n = Notifier(0.025)
    n.found_idle("q1", "ns", 10.0)
    n.found_idle("q2", "ns", 20.0)
    n.forget_before(15.0)
    assert not n.idle("q1", "ns", 10.0 + n.idle_for_s / 2)
    assert n.idle("q2", "ns", 20.0 + n.idle_for_s / 2)


async def test_only_this_node_s_own_work_counts_as_notified_since_a_poll() -> None:
    n = Notifier(0.025)
    before = time.monotonic()
    n.notify("q", 1, polled=True)  # found by the poll: not this node's own commit
    assert not n.notified_since("q", before)
    n.notify("q", 1)
    assert n.notified_since("q", before)
    assert not n.notified_since("q", time.monotonic() + 1)
