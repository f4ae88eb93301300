"""A chaos worker process: one `orbit.Worker` whose handler logs every execution.

Each execution appends a `begin` line before the work and an `end` line after it to a
JSON-lines file opened with O_APPEND. A completed write(2) survives a kill -9 of this
process, so the log holds every handler run that reached its first line, and an `end`
for every one that returned. The checks compare it with the database's attempts.

    python -m chaos.worker --url http://127.0.0.1:8080 --token-file creds.json \
        --queue Q1 --queue Q2 --log worker-1.jsonl [--sync]

The payload says what to do: `ms` of work, fail `fail` first attempts (retryable),
or fail for good (`perm`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import orbit


class ExecutionLog:
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def record(self, **fields: Any) -> None:
        fields["pid"] = os.getpid()
        fields["t"] = time.time()
        os.write(self._fd, json.dumps(fields, separators=(",", ":")).encode() + b"\n")


def _planned_failure(task: orbit.TaskContext) -> Exception | None:
    p = task.payload
    if p.get("perm"):
        return orbit.PermanentError("planned permanent failure")
    if task.attempt <= int(p.get("fail", 0)):
        return orbit.RetryableError(f"planned failure of attempt {task.attempt}")
    return None


def make_handler(log: ExecutionLog, sync: bool):
    def begin(task: orbit.TaskContext) -> None:
        log.record(ev="begin", task=task.id, attempt=task.attempt, lease=task.lease_id, key=task.payload["k"])

    def end(task: orbit.TaskContext, outcome: str) -> None:
        log.record(ev="end", task=task.id, attempt=task.attempt, lease=task.lease_id, outcome=outcome)

    if sync:
        def handle(task: orbit.TaskContext) -> Any:
            begin(task)
            time.sleep(task.payload["ms"] / 1000)
            failure = _planned_failure(task)
            end(task, "error" if failure else "ok")
            if failure:
                raise failure
            return {"k": task.payload["k"], "attempt": task.attempt}
        return handle

    async def ahandle(task: orbit.TaskContext) -> Any:
        begin(task)
        try:
            await asyncio.sleep(task.payload["ms"] / 1000)
        except asyncio.CancelledError:
            end(task, "cancelled")
            raise
        failure = _planned_failure(task)
        end(task, "error" if failure else "ok")
        if failure:
            raise failure
        return {"k": task.payload["k"], "attempt": task.attempt}
    return ahandle


def main() -> None:
    parser = argparse.ArgumentParser(description="a chaos worker process")
    parser.add_argument("--url", action="append", required=True, help="a server URL (repeat for several)")
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--queue", action="append", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--lease-ms", type=int, default=4000)
    parser.add_argument("--sync", action="store_true", help="a sync handler (threads) instead of an async one")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    token = json.loads(Path(args.token_file).read_text())["token"]
    urls = {"urls": args.url} if len(args.url) > 1 and _takes_urls() else {"url": args.url[0]}
    worker = orbit.Worker(token=token, queues=args.queue, concurrency=args.concurrency, node_id=args.node_id,
                          lease_ms=args.lease_ms, claim_wait_ms=1000, reconnect_initial=0.1, reconnect_max=1.0,
                          drain_timeout=20.0, **urls)
    worker.handler(make_handler(ExecutionLog(Path(args.log)), args.sync))
    worker.run()
    raise SystemExit(0 if worker.drained else 3)


def _takes_urls() -> bool:
    import inspect
    return "urls" in inspect.signature(orbit.Worker).parameters


if __name__ == "__main__":
    main()
