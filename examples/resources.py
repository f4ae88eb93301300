#!/usr/bin/env python
"""The resources example: queue backpressure, idempotent replays and a worker, end to end.

Run it against `orbit dev` (see the README):

    ORBIT_URL=http://127.0.0.1:8080 ORBIT_CREDENTIALS_FILE=.local/orbit/credentials.json \
        python examples/resources.py

It creates a fresh queue (backlog 2, concurrency 2, 1 Start per second), pauses
it, submits two tasks, has a third rejected with 429 QUEUE_FULL, replays the
first submit and gets its original receipt, cancels the first task to free a
slot, resubmits the third with its original key and content, resumes the
queue and runs the two pure-data echo tasks with an `orbit.Worker`. Output
(exactly five lines on stdout):

    backpressure=QUEUE_FULL http=429
    duplicate=true rejected_request_retried=true
    task=<second task id> state=SUCCEEDED attempts=1
    task=<third task id> state=SUCCEEDED attempts=1
    unfinished=0 rate_per_second=1 worker_drained=true

Every run creates its own queue and tasks (history stays); each task carries a
20-second total deadline. Exit status: 0 on success; 1 when the scenario did
not go as described (after a bounded cleanup that cancels the tasks it left
unfinished); 2 when a network result was unknown — the program then stops
rather than recreating anything under new keys (the keys it used are printed
to stderr so the same commands can be resent to learn their outcome).
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import orbit

DEADLINE_SECONDS = 20  # every task's total deadline
RUN_TIMEOUT = 45.0  # the whole scenario
CLEANUP_TIMEOUT = 10.0
LIMITS = {"max_concurrency": 2, "rate_per_second": 1, "max_unfinished_tasks": 2}


class ScenarioFailed(Exception):
    """The server did not behave as the scenario expects."""


def fail(message: str) -> None:
    raise ScenarioFailed(message)


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Scenario:
    def __init__(self, client: orbit.AsyncClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.queue_id: str | None = None
        self.task_ids: list[str] = []
        self.worker: orbit.Worker | None = None
        self.worker_run: asyncio.Task | None = None
        self.ok = True

    def key(self, name: str) -> str:
        return f"resources-example-{self.run_id}-{name}"

    async def run(self) -> list[str]:
        c = self.client
        lines: list[str] = []
        created = await c.create_queue(
            self.key("queue"),
            orbit.CreateQueueRequest(name=f"resources-example-{self.run_id}", **LIMITS),
        )
        queue = created.queue
        self.queue_id = queue.id

        paused = await c.configure_queue(queue.id, self.key("pause"), orbit.ConfigureQueueRequest(
            expected_revision=str(queue.revision), reason="hold execution while the backlog is set up",
            paused=True, **LIMITS))
        if not paused.queue.paused:
            fail("the queue did not pause")

        requests = [
            orbit.SubmitTaskRequest(payload={"echo": name}, deadline_seconds=DEADLINE_SECONDS)
            for name in ("first", "second", "third")
        ]
        first = await c.submit_task(queue.id, self.key("task-1"), requests[0])
        self.task_ids.append(first.task.id)
        second = await c.submit_task(queue.id, self.key("task-2"), requests[1])
        self.task_ids.append(second.task.id)
        if first.deduplicated or second.deduplicated:
            fail("a fresh submit was answered as a replay")

        try:
            extra = await c.submit_task(queue.id, self.key("task-3"), requests[2])
        except orbit.APIError as exc:
            if exc.code != "QUEUE_FULL":
                raise
            lines.append(f"backpressure={exc.code} http={exc.status_code}")
        else:
            self.task_ids.append(extra.task.id)
            fail("the third submit was accepted although the backlog limit is 2")

        replay = await c.submit_task(queue.id, self.key("task-1"), requests[0])
        if replay.task.id != first.task.id:
            fail("the replay of the first submit returned another task")

        cancelled = await c.cancel_task(first.task.id, self.key("cancel-1"), "free a backlog slot")
        if cancelled.task.state != "CANCELLED":
            fail(f"cancelling the first task left it {cancelled.task.state}")

        # The rejected request, resent with its ORIGINAL key and content (bounded, jittered).
        third = await orbit.aretry_submit(c, queue.id, self.key("task-3"), requests[2], attempts=5, deadline=10.0)
        self.task_ids.append(third.task.id)
        retried = not third.deduplicated  # 201: accepted now, the 429 left no record behind
        lines.append(f"duplicate={str(replay.deduplicated).lower()} rejected_request_retried={str(retried).lower()}")

        resumed = await c.configure_queue(queue.id, self.key("resume"), orbit.ConfigureQueueRequest(
            expected_revision=str(paused.queue.revision), reason="backlog ready; run it", paused=False, **LIMITS))
        if resumed.queue.paused:
            fail("the queue did not resume")

        worker = self.worker = orbit.Worker(c, queues=[queue.id], concurrency=2, claim_wait_ms=500,
                                            drain_timeout=10.0)

        @worker.handler
        async def echo(task: orbit.TaskContext) -> dict:
            return {"echo": task.payload}  # pure data: no external side effects

        self.worker_run = asyncio.create_task(worker.arun())
        wanted = [second.task.id, third.task.id]
        loop = asyncio.get_running_loop()
        until = loop.time() + DEADLINE_SECONDS + 5
        while True:
            tasks = [await c.get_task(t) for t in wanted]
            if all(t.state in ("SUCCEEDED", "FAILED", "CANCELLED") for t in tasks):
                break
            if self.worker_run.done():
                self.worker_run.result()  # raises the worker's error, if any
                fail("the worker stopped before the tasks finished")
            if loop.time() > until:
                fail("the tasks did not finish within their deadline")
            await asyncio.sleep(0.2)
        await asyncio.wait_for(worker.astop(), 20)
        await self.worker_run

        for t in tasks:
            t = await c.get_task(t.id)
            lines.append(f"task={t.id} state={t.state.value} attempts={t.attempts}")
            self.ok &= t.state == "SUCCEEDED" and t.attempts == 1
        final = await c.get_queue(queue.id)
        lines.append(f"unfinished={final.unfinished_tasks} rate_per_second={final.rate_per_second} "
                     f"worker_drained={str(worker.drained).lower()}")
        self.ok &= final.unfinished_tasks == 0 and worker.drained and retried and replay.deduplicated
        return lines

    async def cleanup(self) -> None:
        """Bounded: stop the worker, cancel the tasks this run left unfinished."""
        if self.worker is not None and self.worker_run is not None and not self.worker_run.done():
            self.worker.stop()
            with _suppress():
                await asyncio.wait_for(asyncio.shield(self.worker_run), 5)
            if not self.worker_run.done():
                self.worker_run.cancel()
        for n, task_id in enumerate(self.task_ids):
            with _suppress():
                task = await self.client.get_task(task_id)
                if task.state in ("WAITING", "LEASED", "RUNNING"):
                    await self.client.cancel_task(task_id, self.key(f"cleanup-{n}"), "example failed; cleaning up")
                    err(f"cleanup: cancelled task {task_id}")


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            err(f"cleanup: {type(exc).__name__}: {exc}")
        return exc is not None and isinstance(exc, Exception)


async def main() -> int:
    try:
        client = orbit.AsyncClient.from_env()
    except ValueError as exc:
        err(f"configuration: {exc} (set ORBIT_URL and ORBIT_CREDENTIALS_FILE)")
        return 1
    run_id = uuid.uuid4().hex[:12]
    async with client:
        scenario = Scenario(client, run_id)
        try:
            lines = await asyncio.wait_for(scenario.run(), RUN_TIMEOUT)
        except orbit.TransportError as exc:
            err(f"unknown network result: {exc}")
            err(f"not recreating anything under new keys; this run's keys start with "
                f"{scenario.key('')!r}: resend the same command to learn its outcome")
            with _suppress():
                await asyncio.wait_for(scenario.cleanup(), CLEANUP_TIMEOUT)
            return 2
        except Exception as exc:  # ScenarioFailed, APIError, a timeout, or a bug
            err(f"failed: {type(exc).__name__}: {exc}")
            with _suppress():
                await asyncio.wait_for(scenario.cleanup(), CLEANUP_TIMEOUT)
            return 1
        for line in lines:
            print(line, flush=True)
        if not scenario.ok:
            err("failed: the results differ from the expected ones")
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
