"""Wake-ups within one server process: long-polling claims and the push loop.

Nodes never talk to each other; a node wakes its own waiters when it commits work
they may take, and everything else is found by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class Notifier:
    """Wakes long polls on this node when a queue may have work or free capacity.

    A wake-up is sized: `notify(queue, count)` wakes the longest-waiting claims whose
    `max_tasks` together cover `count` (tasks submitted, permits freed), not every
    waiting claim, because each woken claim runs a transaction and the extra ones
    would find nothing. A notification that found no waiter is kept (once) for the
    next claim about to wait, whose transaction may have read before the work committed.
    """

    def __init__(self) -> None:
        self._waiters: dict[str, deque[tuple[asyncio.Future, int]]] = {}
        self._missed: set[str] = set()
        # Queues long-polled now by claims on this node, and how many: only their missed
        # notifications are kept, so that submits to queues no worker here polls leave nothing
        # behind, and neither do claims on queue ids that do not exist.
        self._polled: dict[str, int] = {}

    def notify(self, queue_id: str, count: int | None = None) -> None:
        """`count` tasks or permits may be claimable in `queue_id` (None: unknown, wake every claim)."""
        waiters = self._waiters.get(queue_id)
        woken = 0
        covered = 0
        while waiters and (count is None or covered < count):
            fut, want = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                woken += 1
                covered += want
        if not waiters:
            self._waiters.pop(queue_id, None)
        if not woken and queue_id in self._polled:
            self._missed.add(queue_id)

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

    async def wait(self, queue_id: str, timeout: float, want: int = 1) -> None:
        """Until a notification for `queue_id` names this claim, or `timeout` seconds (between
        the claim's `watch` and `unwatch`)."""
        if queue_id in self._missed:
            self._missed.discard(queue_id)
            return
        fut = asyncio.get_running_loop().create_future()
        entry = (fut, want)
        self._waiters.setdefault(queue_id, deque()).append(entry)
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(fut, timeout)
        finally:
            waiters = self._waiters.get(queue_id)
            if waiters is not None:  # timed out or cancelled: still listed (a woken entry is not)
                with contextlib.suppress(ValueError):
                    waiters.remove(entry)
                if not waiters:
                    del self._waiters[queue_id]

    def queues(self) -> list[str]:
        return list(self._waiters)


class Wakeups:
    """The node's wake-up points: claims per queue, and the loop that delivers pushes."""

    def __init__(self) -> None:
        self.claims = Notifier()
        self.pushes = asyncio.Event()

    def work_in(self, queue_id: str, count: int | None = None) -> None:
        """`count` tasks or permits may have become claimable in `queue_id`."""
        self.claims.notify(queue_id, count)

    def push(self) -> None:
        """A lease now has something to tell its worker (cancel, revocation)."""
        self.pushes.set()
