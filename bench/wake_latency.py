"""How soon work the node itself makes claimable reaches a claim waiting on it: a task a schedule
generates (created_at -> leased_at) and a task an expired, unstarted lease gives back (the
recovery's ended_at -> the next lease's leased_at). One node with its background loops, lean
raw-protocol sessions long-polling (5 s waits).

    python bench/wake_latency.py [SECONDS]
"""

import asyncio
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._db import fetch
from bench._harness import environment, percentile
from bench._worker import RawSession, run_loop
from bench.suite import create_queue


async def main(url: str, creds: dict, seconds: float) -> None:
    token = creds["token"]
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
        qid = await create_queue(c, f"s-{uuid.uuid4().hex[:6]}")
        q2 = await create_queue(c, f"r-{uuid.uuid4().hex[:6]}")
        r = await c.post("/v1/schedules", json={"name": "s1", "queue_id": qid, "interval_seconds": 1,
                                                "task": {"payload": {"n": 1}}}, headers={"Idempotency-Key": uuid.uuid4().hex})
        assert r.status_code == 201, r.text
    stop = asyncio.Event()
    async def worker(q: str, lease_ms: int, start: bool) -> None:
        s = await RawSession.connect(url, token, q, f"w-{uuid.uuid4().hex[:4]}")
        while not stop.is_set():
            r = await s.call({"type": "claim", "queue_id": q, "max_tasks": 1, "wait_ms": 5000, "lease_ms": lease_ms})
            for t in r.get("tasks", []):
                if start:
                    await s.call({"type": "start", "id": f"s-{t['lease_id']}", "lease_id": t["lease_id"]})
                    await s.call({"type": "complete", "lease_id": t["lease_id"], "outcome": "succeeded", "result": None})
                else:
                    await asyncio.sleep(1.3)  # let it expire unstarted
        await s.close()
    ws = [asyncio.create_task(worker(qid, 30000, True))]
    holder = await RawSession.connect(url, token, q2, "holder")
    rescuer = await RawSession.connect(url, token, q2, "rescuer")
    t_end = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
        while time.monotonic() < t_end:
            r = await c.post(f"/v1/queues/{q2}/tasks", json={"payload": {}}, headers={"Idempotency-Key": uuid.uuid4().hex})
            assert r.status_code == 201
            r = await holder.call({"type": "claim", "queue_id": q2, "max_tasks": 1, "wait_ms": 5000, "lease_ms": 1000})
            assert r["tasks"], r
            r = await rescuer.call({"type": "claim", "queue_id": q2, "max_tasks": 1, "wait_ms": 5000, "lease_ms": 30000})
            for t in r["tasks"]:
                await rescuer.call({"type": "start", "id": f"s-{t['lease_id']}", "lease_id": t["lease_id"]})
                await rescuer.call({"type": "complete", "lease_id": t["lease_id"], "outcome": "succeeded", "result": None})
    stop.set()
    await asyncio.wait(ws, timeout=7)
    db = creds["_database_url"]
    rows = await fetch(db, "SELECT TIMESTAMPDIFF(MICROSECOND, t.created_at, l.leased_at) FROM tasks t JOIN leases l "
                           "ON l.task_id = t.id WHERE t.queue_id = %s", (qid,))
    lag = [r[0] / 1000 for r in rows]
    rows = await fetch(db, "SELECT TIMESTAMPDIFF(MICROSECOND, a.ended_at, b.leased_at) FROM leases a JOIN leases b "
                           "ON b.task_id = a.task_id AND b.leased_at > a.leased_at WHERE a.queue_id = %s AND a.outcome = 'EXPIRED'", (q2,))
    rec = [r[0] / 1000 for r in rows]
    print(f"scheduled task created->leased n={len(lag)} p50 {percentile(lag,50):.1f} max {max(lag):.1f} ms | "
          f"expired lease recovered->re-leased n={len(rec)} p50 {percentile(rec,50):.1f} max {max(rec, default=0):.1f} ms")

if __name__ == "__main__":
    with environment(None) as (urls, creds):
        run_loop(main(urls[0], creds, float(sys.argv[1]) if len(sys.argv) > 1 else 12))
