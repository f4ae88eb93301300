"""Data a dashboard can be looked at with: a queue whose tasks succeed and fail, a task whose
payload is markup, a task held by a saturated resource key, a schedule, and audit records.

Runs against any server (`python tests/e2e/dashboard_demo.py URL CREDENTIALS_FILE` fills a running
`orbit dev`); the browser tests call `seed()` against their own `orbit dev`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orbit

XSS = "<img src=x onerror=alert(1)>"


@dataclass
class Demo:
    queue_id: str
    blocked_queue_id: str
    failed_task_id: str
    xss_task_id: str
    blocked_task_id: str
    key_name: str
    schedule_id: str
    review_task_id: str
    extra: dict[str, Any] = field(default_factory=dict)


def _key() -> str:
    return uuid.uuid4().hex


def seed(client: orbit.Client, *, run_worker: bool = True) -> Demo:
    tag = uuid.uuid4().hex[:6]
    queue = client.create_queue(_key(), {"name": f"billing-{tag}", "max_concurrency": 4, "rate_per_second": 50}).queue
    held = client.create_queue(_key(), {"name": f"reports-{tag}", "max_concurrency": 2, "rate_per_second": 5}).queue
    key = client.create_resource_key(_key(), {"name": f"db-primary-{tag}", "max_concurrency": 1}).resource_key

    ok = [client.submit_task(queue.id, _key(), {"payload": {"invoice": i}}).task.id for i in range(6)]
    failing = client.submit_task(queue.id, _key(), {"payload": {"invoice": "bad", "fail": True}, "max_attempts": 2,
                                                    "retry": {"initial_backoff_ms": 50, "max_backoff_ms": 50}}).task.id
    xss = client.submit_task(queue.id, _key(), {"payload": {"note": XSS, "fail": True}, "max_attempts": 1}).task.id
    # One task holds the key's only permit (its worker sleeps); the next one waits for it.
    holder = client.submit_task(held.id, _key(), {"payload": {"sleep": 3600}, "resource_keys": [key.name]}).task.id
    blocked = client.submit_task(held.id, _key(), {"payload": {"report": "monthly"}, "resource_keys": [key.name]}).task.id
    schedule = client.create_schedule(_key(), {"name": f"nightly-{tag}", "queue_id": queue.id, "interval_seconds": 3600,
                                               "task": {"payload": {"kind": "nightly"}}}).schedule

    # A started attempt whose worker vanished: its outcome is unknown until a person reviews it.
    ledger = client.create_queue(_key(), {"name": f"ledger-{tag}", "max_concurrency": 1, "rate_per_second": 5}).queue
    review = client.submit_task(ledger.id, _key(), {"payload": {"transfer": 1200}, "max_attempts": 3}).task.id
    asyncio.run(_start_and_vanish(client.base_url, client.token, ledger.id))

    demo = Demo(queue.id, held.id, failing, xss, blocked, key.name, schedule.id, review,
                extra={"ok": ok, "holder": holder})
    wait_until(lambda: client.get_task(review).state == "NEEDS_REVIEW", 30)
    if run_worker:
        demo.extra["worker"] = start_worker(client, [queue.id, held.id])
        demo.extra["worker_thread"] = demo.extra["worker"].thread
        wait_until(lambda: client.get_task(failing).state == "FAILED" and client.get_task(xss).state == "FAILED"
                   and client.get_task(holder).state == "RUNNING", 30)
    return demo


async def _start_and_vanish(base: str, token: str, queue_id: str) -> None:
    from tests.integration.worker_client import Worker

    async with Worker.connect(base, token) as w:
        await w.hello(queue_id, node_id="vanishing-host")
        (lease,) = (await w.call("claim", queue_id=queue_id, max_tasks=1, lease_ms=1000))["tasks"]
        assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]


def start_worker(client: orbit.Client, queues: list[str], *, name: str = "demo-worker") -> orbit.Worker:
    worker = orbit.Worker(client, queues=queues, concurrency=4, claim_wait_ms=500)

    @worker.handler
    def handle(task: orbit.TaskContext) -> dict:
        p = task.payload
        if isinstance(p, dict) and p.get("fail"):
            raise RuntimeError(f"card declined for invoice {p.get('invoice', p.get('note'))}")
        if isinstance(p, dict) and p.get("sleep"):
            task.cancel_requested.wait(p["sleep"])
            raise orbit.PermanentError("cancelled")
        time.sleep(0.05)
        return {"ok": True, "echo": p}

    thread = threading.Thread(target=worker.run, name=name, daemon=True)
    thread.start()
    worker.thread = thread  # type: ignore[attr-defined]  # for the caller to join
    return worker


def wait_until(check, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError("the demo data did not settle in time")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: `tests` importable
    url, creds = sys.argv[1], sys.argv[2]
    token = json.load(open(creds))["token"]
    with orbit.Client(url, token=token) as c:
        d = seed(c)
        print(json.dumps(d.__dict__, indent=2))
        print("worker running; Ctrl-C to stop")
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
