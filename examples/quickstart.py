#!/usr/bin/env python
"""Quickstart: create a queue, submit a few tasks, run a worker until they are done.

    ORBIT_URL=http://127.0.0.1:8080 ORBIT_CREDENTIALS_FILE=.local/orbit/credentials.json \
        python examples/quickstart.py

Uses the blocking `orbit.Client` and a synchronous handler (run in a thread by
the worker). Each run creates its own queue; the Idempotency-Key of every
submit is the task's identity, so resending a submit after an unknown network
result returns the original receipt instead of a second task.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import orbit

TASKS = 5


def main() -> int:
    client = orbit.Client.from_env()
    run_id = uuid.uuid4().hex[:8]
    with client:
        queue = client.create_queue(
            f"quickstart-{run_id}-queue",
            orbit.CreateQueueRequest(name=f"quickstart-{run_id}", max_concurrency=4, rate_per_second=10),
        ).queue
        print(f"queue {queue.name} ({queue.id})")

        task_ids = []
        for i in range(TASKS):
            receipt = client.submit_task(
                queue.id, f"quickstart-{run_id}-task-{i}",
                orbit.SubmitTaskRequest(payload={"n": i}, deadline_seconds=60),
            )
            task_ids.append(receipt.task.id)
        print(f"submitted {len(task_ids)} tasks")

        worker = orbit.Worker(client, queues=[queue.id], concurrency=4, claim_wait_ms=500)

        @worker.handler
        def square(task: orbit.TaskContext) -> dict:  # a plain function: runs in a worker thread
            if task.cancel_requested.is_set():
                raise orbit.PermanentError("cancelled before it began")
            time.sleep(0.2)
            return {"n": task.payload["n"], "square": task.payload["n"] ** 2}

        runner = threading.Thread(target=worker.run, name="orbit-worker")
        runner.start()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                tasks = [client.get_task(t) for t in task_ids]
                if all(t.state in ("SUCCEEDED", "FAILED", "CANCELLED") for t in tasks):
                    break
                time.sleep(0.25)
        finally:
            worker.stop()  # thread-safe: drain and let run() return
            runner.join(30)

        for t in tasks:
            print(f"task {t.id} {t.state.value} attempts={t.attempts} result={t.result}")
        print(f"worker drained: {worker.drained}")
        return 0 if all(t.state == "SUCCEEDED" for t in tasks) and worker.drained else 1


if __name__ == "__main__":
    sys.exit(main())
