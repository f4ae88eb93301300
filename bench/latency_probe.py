"""Where does submit->Start latency go? One node, a few worker sessions in this process,
single submits at a low steady rate; every hop is timestamped on the client (wall clock)
and joined with the database's own times (created_at, leased_at, started_at).

    python bench/latency_probe.py [--rate 20] [--seconds 10] [--sessions 4] [--batch 1] [--nodes 1]

`--rate` counts submit requests; with `--batch N` each carries N tasks (a burst, as the
suite's open loop sends every 20 ms). With `--nodes 2` the submits go to the first node and
the worker sessions connect to the second, as behind a load balancer.

Prints the server's and MariaDB's CPU per task (idle claims polling included), then the p50/p90
of each hop in milliseconds:
  submit.send -> task.created_at -> submit.reply
  task.created_at -> lease.leased_at -> claim.reply (at the worker)
  start.send -> lease.started_at -> start.reply
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid

import orjson
from datetime import timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import fetch  # noqa: E402
from bench._harness import DrainCpu, environment, percentile  # noqa: E402
from bench._http import RawPool  # noqa: E402
from bench._worker import RawSession, run_loop  # noqa: E402
from bench.suite import create_queue  # noqa: E402


async def probe(url: str, creds: dict, rate: float, seconds: float, sessions: int, batch: int = 1,
                worker_url: str | None = None) -> None:
    import httpx

    token = wtoken = creds["token"]
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        qid = await create_queue(client, f"probe-{uuid.uuid4().hex[:6]}")
        pool = RawPool.like(client)
    times: dict[str, dict[str, float]] = {}
    stop = asyncio.Event()

    async def worker() -> None:
        s = await RawSession.connect(worker_url or url, wtoken, qid, f"probe-{uuid.uuid4().hex[:4]}")
        try:
            while not stop.is_set():
                r = await s.call({"type": "claim", "queue_id": qid, "max_tasks": 10, "wait_ms": 500,
                                  "lease_ms": 60000})
                got = time.time()

                async def run(t: dict) -> None:
                    rec = times.setdefault(t["task_id"], {})
                    rec["claim_reply"] = got
                    rec["start_send"] = time.time()
                    a = await s.call({"type": "start", "id": f"s-{t['lease_id']}", "lease_id": t["lease_id"]})
                    rec["start_reply"] = time.time()
                    assert a["ok"], a
                    await s.call({"type": "complete", "lease_id": t["lease_id"], "outcome": "succeeded",
                                  "result": None})

                # Like the suite's workers: start every granted task at once, claim again when all are done.
                await asyncio.gather(*(run(t) for t in r.get("tasks", [])))
        finally:
            await s.close()

    workers = [asyncio.create_task(worker()) for _ in range(sessions)]
    await asyncio.sleep(1.0)  # sessions are waiting in their claims
    n = int(rate * seconds)

    async def submit(i: int) -> None:
        sent = time.time()
        tag = f"{i}-{uuid.uuid4().hex[:6]}"
        if batch == 1:
            _, body = await pool.post(f"/v1/queues/{qid}/tasks", {"payload": {"i": i}}, {"Idempotency-Key": f"p-{tag}"})
            ids = [orjson.loads(body)["data"]["task"]["id"]]
        else:
            items = [{"idempotency_key": f"p-{tag}-{j}", "payload": {"i": j}} for j in range(batch)]
            _, body = await pool.post(f"/v1/queues/{qid}/tasks:batch", {"tasks": items}, {"Idempotency-Key": f"pb-{tag}"})
            ids = [x["task"]["id"] for x in orjson.loads(body)["data"]["results"]]
        replied = time.time()
        for tid in ids:
            times.setdefault(tid, {}).update(submit_send=sent, submit_reply=replied)

    cpu = DrainCpu([])  # this process (the client and the worker sessions) is not counted
    t0 = time.perf_counter()
    pending = []
    for i in range(n):
        pending.append(asyncio.create_task(submit(i)))
        await asyncio.sleep(max(0.0, (i + 1) / rate - (time.perf_counter() - t0)))
    await asyncio.gather(*pending)
    await asyncio.sleep(1.0)
    stop.set()
    used = cpu.us_per_task(n * batch)
    await asyncio.gather(*workers, return_exceptions=True)
    await pool.close()
    rows = await fetch(creds["_database_url"],
                       "SELECT t.id, t.created_at, l.leased_at, l.started_at FROM tasks t JOIN leases l "
                       "ON l.task_id = t.id WHERE t.queue_id = %s", (qid,))

    def ts(d):
        return d.replace(tzinfo=timezone.utc).timestamp()

    hops: dict[str, list[float]] = {}
    for tid, created, leased, started in rows:
        rec = times.get(tid, {})
        if "start_reply" not in rec or "submit_send" not in rec:
            continue
        points = [("submit.send", rec["submit_send"]), ("created_at", ts(created)),
                  ("submit.reply", rec["submit_reply"]), ("leased_at", ts(leased)),
                  ("claim.reply", rec["claim_reply"]), ("start.send", rec["start_send"]),
                  ("started_at", ts(started)), ("start.reply", rec["start_reply"])]
        for (a, ta), (b, tb) in zip(points, points[1:]):
            hops.setdefault(f"{a} -> {b}", []).append((tb - ta) * 1000)
        hops.setdefault("TOTAL created_at -> started_at", []).append((ts(started) - ts(created)) * 1000)
    handed = sum(1 for _, created, leased, _ in rows if leased == created)
    print(f"{len(rows)} tasks at {rate}/s x {batch} per request, {sessions} sessions; "
          f"{handed} leased in their submit's transaction; CPU per task (us): "
          + ", ".join(f"{k.removesuffix('_cpu_us_per_task')} {v}" for k, v in used.items()))
    for k, v in hops.items():
        print(f"  {k:40s} p50 {percentile(v, 50):7.2f}  p90 {percentile(v, 90):7.2f}  p99 {percentile(v, 99):7.2f}"
              f"  max {max(v):7.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1, help="tasks per submit request (a batch submit when > 1)")
    ap.add_argument("--database-url", help="use this database instead of a fresh MariaDB one")
    ap.add_argument("--nodes", type=int, default=1, help="nodes: submits go to the first, workers to the last")
    a = ap.parse_args()
    with environment(a.database_url, a.nodes) as (urls, creds):
        run_loop(probe(urls[0], creds, a.rate, a.seconds, a.sessions, a.batch, urls[-1]))


if __name__ == "__main__":
    main()
