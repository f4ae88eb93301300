#!/usr/bin/env python
"""A long-running worker process: a synchronous and an asynchronous handler, one queue each.

    ORBIT_URL=http://127.0.0.1:8080 ORBIT_CREDENTIALS_FILE=.local/orbit/credentials.json \
        python examples/worker.py --submit 10

It ensures two queues exist (`examples-thumbnails` for the sync handler,
`examples-fetch` for the async one), optionally submits some demo tasks, and
then works both queues until SIGTERM/SIGINT (or `--seconds N`), when both
workers drain: they stop claiming, give back leases they have not started, let
running handlers finish, and exit. Logs (logger `orbit.worker`) go to stderr.

Handlers show the contract: return a JSON value to succeed, raise
`orbit.RetryableError` to fail and be retried per the task's policy,
`orbit.PermanentError` to fail for good, and watch `task.cancel_requested` to
stop early when the task is cancelled (an async handler that ignores it is
cancelled after the worker's grace period).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
import uuid

import orbit

QUEUES = {"thumbnails": "examples-thumbnails", "fetch": "examples-fetch"}


def ensure_queue(client: orbit.Client, name: str) -> str:
    """Find the queue by name, or create it (idempotently: the key names the queue)."""
    for queue in client.list_queues(name=name):
        return queue.id
    try:
        return client.create_queue(f"example-queue-{name}", orbit.CreateQueueRequest(
            name=name, max_concurrency=4, rate_per_second=20)).queue.id
    except orbit.APIError as exc:
        if exc.code != "STATE_CONFLICT":  # created meanwhile by someone else: look it up again
            raise
        return next(iter(client.list_queues(name=name))).id


# ---------------------------------------------------------------- handlers


def make_thumbnail(task: orbit.TaskContext) -> dict:
    """Synchronous (CPU-style) work: runs in a thread; polls the threading.Event to stop early."""
    image = task.payload.get("image") if isinstance(task.payload, dict) else None
    if not image:
        raise orbit.PermanentError("payload needs an 'image'")  # retrying cannot help
    for _ in range(10):
        if task.cancel_requested.is_set():
            raise orbit.RetryableError("cancelled while resizing")  # reported as cancelled
        time.sleep(0.05)
    return {"thumbnail": f"{image}.thumb.png"}


async def fetch(task: orbit.TaskContext) -> dict:
    """Asynchronous (I/O-style) work: waits on the asyncio.Event so a cancel stops it at once."""
    url = task.payload.get("url") if isinstance(task.payload, dict) else None
    if not url:
        raise orbit.PermanentError("payload needs a 'url'")
    if task.payload.get("flaky") and task.attempt == 1:
        raise orbit.RetryableError("upstream timed out")  # attempt 2 will be tried after a backoff
    try:
        await asyncio.wait_for(task.cancel_requested.wait(), timeout=0.3)  # "the request"
    except TimeoutError:
        return {"url": url, "status": 200}
    raise asyncio.CancelledError()  # cancel acknowledged: reported as cancelled


# ---------------------------------------------------------------- main


def submit_demo(client: orbit.Client, thumbnails: str, fetches: str, n: int) -> None:
    batch = uuid.uuid4().hex[:8]
    for i in range(n):
        client.submit_task(thumbnails, f"demo-{batch}-thumb-{i}",
                           orbit.SubmitTaskRequest(payload={"image": f"img-{i}.png"}, deadline_seconds=300))
        client.submit_task(fetches, f"demo-{batch}-fetch-{i}",
                           orbit.SubmitTaskRequest(payload={"url": f"https://example.invalid/{i}", "flaky": i % 3 == 0},
                                                   retry=orbit.RetryPolicy(initial_backoff_ms=200),
                                                   deadline_seconds=300))
    print(f"submitted {2 * n} demo tasks", file=sys.stderr)


async def serve(client: orbit.Client, thumbnails: str, fetches: str, seconds: float | None) -> bool:
    sync_worker = orbit.Worker(client, queues=[thumbnails], concurrency=4)
    sync_worker.handler(make_thumbnail)
    async_worker = orbit.Worker(client, queues=[fetches], concurrency=16, cancel_grace=5.0)
    async_worker.handler(fetch)

    def stop_both(*_: object) -> None:
        sync_worker.stop()
        async_worker.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_both)
    if seconds is not None:
        loop.call_later(seconds, stop_both)
    await asyncio.gather(sync_worker.arun(), async_worker.arun())
    return sync_worker.drained and async_worker.drained


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submit", type=int, default=0, help="submit N demo tasks to each queue first")
    parser.add_argument("--seconds", type=float, default=None, help="stop (drain) after this many seconds")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with orbit.Client.from_env() as client:
        thumbnails = ensure_queue(client, QUEUES["thumbnails"])
        fetches = ensure_queue(client, QUEUES["fetch"])
        if args.submit:
            submit_demo(client, thumbnails, fetches, args.submit)
        drained = asyncio.run(serve(client, thumbnails, fetches, args.seconds))
    print(f"drained={str(drained).lower()}", file=sys.stderr)
    return 0 if drained else 1


if __name__ == "__main__":
    sys.exit(main())
