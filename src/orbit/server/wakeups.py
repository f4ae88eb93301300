"""Wake-ups within one server process: long-polling claims and the push loop.

Nodes never talk to each other; a node wakes its own waiters when it commits work
they may take, and everything else is found by polling: one poll per node for all
of its waiting claims (`WorkerHub`), not one per claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any


class Waiter:
    """A long-polling claim waiting on this node, with what it asks for: `offer` (its claim
    command, or None) lets the transaction that commits the work serve the claim itself."""

    __slots__ = ("fut", "want", "offer", "taken")

    def __init__(self, fut: asyncio.Future, want: int, offer: Any) -> None:
        self.fut = fut
        self.want = want
        self.offer = offer
        self.taken = False  # served by a transaction in flight: its answer, not a timeout, ends the wait


# A submit serves waiting claims only when the previous submit of its queue on this node came at
# least this long before: at higher rates a claim woken a moment later takes several tasks in one
# transaction, which costs less per task than a claim served with each submit.
HANDOFF_GAP_S = 0.010


def idle_verdict_s(poll_interval: float) -> float:
    """How long a poll's verdict that a queue has nothing to lease holds: two poll intervals, so
    that a queue polled on time never goes without one, late as the next poll may start."""
    return 2 * poll_interval

# What `Notifier.wait` returns when its time is over before anything woke it.
TIMED_OUT: Any = object()


def _time_out(waiter: Waiter) -> None:
    if not waiter.taken and not waiter.fut.done():
        waiter.fut.set_result(TIMED_OUT)


class Notifier:
    """Wakes long polls on this node when a queue may have work or free capacity.

    A wake-up is sized: `notify(queue, count)` wakes the longest-waiting claims whose
    `max_tasks` together cover `count` (tasks submitted, permits freed), not every
    waiting claim, because each woken claim runs a transaction and the extra ones
    would find nothing. A notification that found no waiter is kept (once) for the
    next claim about to wait, whose transaction may have read before the work committed.

    A submit's transaction may instead `take` the waiting claims of its queue and serve them
    itself (`serve`): the tasks reach the workers without a claim transaction of their own.
    """

    def __init__(self, poll_interval: float) -> None:
        """`poll_interval`: seconds between the node's polls of its waiting claims (`WorkerHub`)."""
        self._waiters: dict[str, deque[Waiter]] = {}
        self._missed: set[str] = set()
        # Queues long-polled now by claims on this node, and how many: only their missed
        # notifications are kept, so that submits to queues no worker here polls leave nothing
        # behind, and neither do claims on queue ids that do not exist.
        self._polled: dict[str, int] = {}
        # When the last submit of each polled queue arrived here (`sparse`).
        self._last_submit: dict[str, float] = {}
        # Queues the node's poll found nothing to lease in: when its read began, and the queue's
        # namespace (`idle`); and when each queue was last notified, which ends such a verdict.
        self._idle: dict[str, tuple[float, str]] = {}
        self._notified_at: dict[str, float] = {}
        self.idle_for_s = idle_verdict_s(poll_interval)

    def sparse(self, queue_id: str, now: float) -> bool:
        """A submit of `queue_id` arrives at `now` (monotonic): True when the queue is polled here
        and its previous submit came `HANDOFF_GAP_S` or more before (light load)."""
        if queue_id not in self._polled:
            return False
        previous = self._last_submit.get(queue_id)
        self._last_submit[queue_id] = now
        return previous is None or now - previous >= HANDOFF_GAP_S

    def notify(self, queue_id: str, count: int | None = None, *, polled: bool = False) -> None:
        """`count` tasks or permits may be claimable in `queue_id` (None: unknown, wake every claim);
        `polled`: found by the node's poll rather than committed through this node."""
        if not polled:
            self._notified_at[queue_id] = time.monotonic()
        self._idle.pop(queue_id, None)
        waiters = self._waiters.get(queue_id)
        woken = 0
        covered = 0
        while waiters and (count is None or covered < count):
            w = waiters.popleft()
            if not w.fut.done():
                w.fut.set_result(None)
                woken += 1
                covered += w.want
        if not waiters:
            self._waiters.pop(queue_id, None)
        if not woken and queue_id in self._polled:
            self._missed.add(queue_id)

    def take(self, queue_id: str, count: int) -> list[Waiter]:
        """The longest-waiting claims of `queue_id` that offered their command, covering `count`
        tasks; each stays waiting until `serve` answers it."""
        waiters = self._waiters.get(queue_id)
        if not waiters:
            return []
        taken: list[Waiter] = []
        keep: deque[Waiter] = deque()
        covered = 0
        for w in waiters:
            if covered < count and w.offer is not None and not w.fut.done():
                w.taken = True
                taken.append(w)
                covered += w.want
            elif not w.fut.done():
                keep.append(w)
        if keep:
            self._waiters[queue_id] = keep
        else:
            del self._waiters[queue_id]
        return taken

    @staticmethod
    def serve(taken: list[Waiter], replies: list[Any] | None) -> None:
        """Answer the claims `take` gave out: each its reply, or None (nothing served: claim again)."""
        for i, w in enumerate(taken):
            if not w.fut.done():
                w.fut.set_result(None if replies is None else replies[i])

    def watch(self, queue_id: str) -> None:
        """A claim on `queue_id` is about to read and may then wait: until its `unwatch`, a
        notification nobody hears is kept."""
        self._polled[queue_id] = self._polled.get(queue_id, 0) + 1

    def unwatch(self, queue_id: str) -> None:
        """That claim is answered; once no claim here polls the queue, nothing is kept for it."""
        left = self._polled.get(queue_id, 0) - 1
        if left > 0:
            self._polled[queue_id] = left
        else:
            self._polled.pop(queue_id, None)
            self._missed.discard(queue_id)
            self._last_submit.pop(queue_id, None)

    async def wait(self, queue_id: str, timeout: float, want: int = 1, offer: Any = None) -> Any:
        """Until a notification for `queue_id` names this claim (None), or `timeout` seconds
        (`TIMED_OUT`), between the claim's `watch` and `unwatch`. A claim that offered its command
        (`offer`) may instead be served by a submit's transaction (`take`): then its reply."""
        if queue_id in self._missed:
            self._missed.discard(queue_id)
            return None
        loop = asyncio.get_running_loop()
        waiter = Waiter(loop.create_future(), want, offer)
        self._waiters.setdefault(queue_id, deque()).append(waiter)
        # A timer rather than `wait_for`: a notified claim resumes in the next loop iteration,
        # not after the two or three that wait_for's own future and callbacks take.
        timer = loop.call_later(timeout, _time_out, waiter)
        try:
            return await waiter.fut
        finally:
            timer.cancel()
            waiters = self._waiters.get(queue_id)
            if waiters is not None:  # timed out or cancelled: still listed (a woken entry is not)
                with contextlib.suppress(ValueError):
                    waiters.remove(waiter)
                if not waiters:
                    del self._waiters[queue_id]

    def queues(self) -> list[str]:
        return list(self._waiters)

    def found_idle(self, queue_id: str, namespace_id: str, read_at: float) -> None:
        """The node's poll, whose read began at `read_at` (monotonic), found that no claim could
        lease in `queue_id` (of `namespace_id`): unless this node notified it since."""
        if self._notified_at.get(queue_id, -1.0) < read_at:
            self._idle[queue_id] = (read_at, namespace_id)

    def idle(self, queue_id: str, namespace_id: str, now: float) -> bool:
        """Whether a claim arriving now on `queue_id` (from `namespace_id`) would find nothing as far
        as this node knows: a poll found the queue so less than `idle_for_s` ago and nothing here
        notified it since. Work committed elsewhere meanwhile is found by the next poll, as it
        would be for a claim already waiting."""
        verdict = self._idle.get(queue_id)
        return verdict is not None and verdict[1] == namespace_id and now - verdict[0] < self.idle_for_s

    def notified_since(self, queue_id: str, at: float) -> bool:
        """Whether work committed through this node woke claims of `queue_id` at or after `at`
        (monotonic): those claims read every due task, whichever node committed it."""
        return self._notified_at.get(queue_id, -1.0) >= at

    def forget_before(self, at: float) -> None:
        """Drop verdicts and notification times older than `at` (monotonic): they decide nothing."""
        self._idle = {q: v for q, v in self._idle.items() if v[0] >= at}
        self._notified_at = {q: t for q, t in self._notified_at.items() if t >= at}

    def waiting(self) -> dict[str, list[Waiter]]:
        """Per queue, the claims waiting here that nothing has woken or taken yet."""
        out: dict[str, list[Waiter]] = {}
        for queue_id, waiters in self._waiters.items():
            live = [w for w in waiters if not w.taken and not w.fut.done()]
            if live:
                out[queue_id] = live
        return out


class Wakeups:
    """The node's wake-up points: claims per queue, and the loop that delivers pushes."""

    def __init__(self, poll_interval: float) -> None:
        self.claims = Notifier(poll_interval)
        self.pushes = asyncio.Event()

    def work_in(self, queue_id: str, count: int | None = None) -> None:
        """`count` tasks or permits may have become claimable in `queue_id`."""
        self.claims.notify(queue_id, count)

    def push(self) -> None:
        """A lease now has something to tell its worker (cancel, revocation)."""
        self.pushes.set()
