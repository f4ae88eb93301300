"""What a claim costs when the head of a queue is blocked by a saturated resource key.

    python bench/blocked_head.py [--blocked 100000] [--behind 10]

One `orbit server` on a fresh MariaDB database (bench/_harness.py). A key of one permit is
held by a leased task; `--blocked` tasks naming it wait ahead of `--behind` keyless tasks.
Two cases:

- parked at submit: the blocked tasks arrive while the key is saturated, so each is parked
  as it is accepted and claims never read them;
- met by claims: the blocked tasks arrive while the key is free and only then does it
  saturate, so claims meet them at the head, park them (at most 2,000 rows a claim) and
  read on.

Prints, per case, the claims until every task behind was leased, their latency and the
database CPU they used (mariadbd's, from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._harness import cpu_seconds, environment, pid_of  # noqa: E402
from tests.integration.worker_client import Worker  # noqa: E402


async def _submit(c: httpx.AsyncClient, queue_id: str, n: int, keys: list[str], tag: str) -> None:
    sem = asyncio.Semaphore(4)

    async def one(b: int, size: int) -> None:
        async with sem:
            items = [{"idempotency_key": f"{queue_id}-{tag}-{b}-{i}", "payload": {"i": i}, "resource_keys": keys}
                     for i in range(size)]
            r = await c.post(f"/v1/queues/{queue_id}/tasks:batch", json={"tasks": items},
                             headers={"Idempotency-Key": f"{queue_id}-{tag}-{b}"})
            r.raise_for_status()

    await asyncio.gather(*(one(b, min(500, n - b * 500)) for b in range((n + 499) // 500)))


async def _case(url: str, token: str, blocked: int, behind: int, *, park_at_submit: bool) -> str:
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as c:
        key = (await c.post("/v1/resource-keys", json={"name": f"k-{uuid.uuid4().hex[:8]}", "max_concurrency": 1},
                            headers={"Idempotency-Key": uuid.uuid4().hex})).json()["data"]["resource_key"]
        q = (await c.post("/v1/queues", json={"name": f"q-{uuid.uuid4().hex[:8]}", "max_concurrency": 100000,
                                              "rate_per_second": 1000000, "max_unfinished_tasks": 1000000},
                          headers={"Idempotency-Key": uuid.uuid4().hex})).json()["data"]["queue"]["id"]
        async with Worker.connect(url, token) as w:
            await w.hello(q, node_id="bench")
            if park_at_submit:
                await _submit(c, q, 1, [key["name"]], "holder")
                assert len((await w.call("claim", queue_id=q, max_tasks=1))["tasks"]) == 1
                await _submit(c, q, blocked, [key["name"]], "blocked")
            else:
                await _submit(c, q, blocked + 1, [key["name"]], "blocked")
            await _submit(c, q, behind, [], "behind")
            if not park_at_submit:
                assert len((await w.call("claim", queue_id=q, max_tasks=1))["tasks"]) == 1
            mariadb = pid_of("-x", "mariadbd")
            cpu0 = cpu_seconds(mariadb) if mariadb else 0.0
            got, claims, slowest = 0, 0, 0.0
            t0 = time.perf_counter()
            while got < behind and claims < 10_000:
                t = time.perf_counter()
                tasks = (await w.call("claim", queue_id=q, max_tasks=behind))["tasks"]
                slowest = max(slowest, time.perf_counter() - t)
                claims += 1
                got += len(tasks)
                assert all(not x["resource_keys"] for x in tasks), "a task of the saturated key was leased"
            total = time.perf_counter() - t0
            cpu = (cpu_seconds(mariadb) - cpu0) if mariadb else float("nan")
    how = "parked at submit" if park_at_submit else "met by claims  "
    return (f"{how}: {blocked} blocked ahead, {got}/{behind} behind leased in {claims} claims, "
            f"{total * 1000:.0f} ms in all (slowest claim {slowest * 1000:.0f} ms), MariaDB CPU {cpu * 1000:.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocked", type=int, default=100_000)
    ap.add_argument("--behind", type=int, default=10)
    args = ap.parse_args()
    with environment(None, 1) as (urls, creds):
        for park_at_submit in (True, False):
            print(asyncio.run(_case(urls[0], creds["token"], args.blocked, args.behind,
                                    park_at_submit=park_at_submit)), flush=True)


if __name__ == "__main__":
    main()
