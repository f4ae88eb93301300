"""Schedules: a task every 2 seconds with a 10-second catch-up window, paused and resumed.

    ORBIT_URL=http://127.0.0.1:8080 ORBIT_CREDENTIALS_FILE=.local/orbit/credentials.json \
        python examples/schedules.py

Creates a fresh queue and a schedule on it (`interval_seconds` 2, misfire
`catch_up` with a 10 s window, overlap `allow`), runs a worker on the queue,
pauses the schedule for 16 seconds and resumes it. While it is paused no point
is handled; on resume the missed points still inside the window are generated
in order, and the older ones are recorded SKIPPED (MISFIRE). Every trigger
point ends up exactly once in the schedule's runs: a task or a skip with its
reason. Output (stdout):

    schedule=<id> every=2s catch_up_window=10s
    before_pause submitted=<n> succeeded=<n>
    paused 16s: handled_while_paused=0
    after_resume caught_up=<k> skipped_misfire=<m>
    runs consecutive=true each_once=true retired=true

The schedule is retired at the end (its history stays readable).
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from datetime import timedelta

import orbit

EVERY_S = 2
WINDOW_S = 10
PAUSE_S = 16


def settings(schedule: orbit.Schedule, *, paused: bool, reason: str) -> dict:
    """A configure body: every mutable field, as it is, with `paused` set."""
    return {"expected_revision": schedule.revision, "reason": reason, "paused": paused,
            "interval_seconds": schedule.interval_seconds, "timezone": schedule.timezone,
            "misfire": schedule.misfire.model_dump(), "overlap": schedule.overlap,
            "task": schedule.task.model_dump(exclude_none=True)}


def runs(client: orbit.Client, schedule_id: str) -> list[orbit.ScheduleRun]:
    return list(client.list_schedule_runs(schedule_id))


def main() -> int:
    run_id = uuid.uuid4().hex[:8]
    with orbit.Client.from_env() as client:
        queue = client.create_queue(f"schedules-{run_id}-queue", orbit.CreateQueueRequest(
            name=f"schedules-{run_id}", max_concurrency=4, rate_per_second=10)).queue
        schedule = client.create_schedule(f"schedules-{run_id}-schedule", {
            "name": f"every-two-seconds-{run_id}", "queue_id": queue.id, "interval_seconds": EVERY_S,
            "misfire": {"policy": "catch_up", "catch_up_window_seconds": WINDOW_S},
            "task": {"payload": {"report": "heartbeat"}, "deadline_seconds": 60}}).schedule
        print(f"schedule={schedule.id} every={EVERY_S}s catch_up_window={WINDOW_S}s")

        worker = orbit.Worker(client, queues=[queue.id], concurrency=4, claim_wait_ms=500)

        @worker.handler
        def heartbeat(task: orbit.TaskContext) -> dict:
            return {"trigger_at": task.payload["report"]}

        runner = threading.Thread(target=worker.run, name="orbit-worker")
        runner.start()
        try:
            time.sleep(7)
            before = runs(client, schedule.id)
            tasks = [client.get_task(r.task_id) for r in before if r.task_id]
            print(f"before_pause submitted={len(tasks)} "
                  f"succeeded={sum(t.state.value == 'SUCCEEDED' for t in tasks)}")

            schedule = client.get_schedule(schedule.id)
            schedule = client.configure_schedule(schedule.id, f"schedules-{run_id}-pause",
                                                 settings(schedule, paused=True, reason="maintenance")).schedule
            handled = len(runs(client, schedule.id))
            time.sleep(PAUSE_S)
            print(f"paused {PAUSE_S}s: handled_while_paused={len(runs(client, schedule.id)) - handled}")

            schedule = client.configure_schedule(schedule.id, f"schedules-{run_id}-resume",
                                                 settings(schedule, paused=False, reason="back")).schedule
            time.sleep(3)
            after = runs(client, schedule.id)[handled:]
            print(f"after_resume caught_up={sum(r.outcome == 'SUBMITTED' for r in after)} "
                  f"skipped_misfire={sum(r.reason == 'MISFIRE' for r in after)}")
        finally:
            worker.stop()
            runner.join(30)

        every = runs(client, schedule.id)
        points = [r.trigger_at for r in every]
        consecutive = all(b - a == timedelta(seconds=EVERY_S) for a, b in zip(points, points[1:]))
        schedule = client.get_schedule(schedule.id)
        retired = client.retire_schedule(schedule.id, f"schedules-{run_id}-retire", schedule.revision,
                                         "example finished").schedule
        print(f"runs consecutive={str(consecutive).lower()} each_once={str(len(set(points)) == len(points)).lower()} "
              f"retired={str(retired.retired_at is not None).lower()}")
        return 0 if consecutive and worker.drained else 1


if __name__ == "__main__":
    sys.exit(main())
