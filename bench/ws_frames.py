"""Server CPU per worker-protocol frame, without the database: `ping` frames (which touch no
table) sent by a few sessions, many in flight, against one node. Every Start and report pays
this cost on top of its transaction.

    python bench/ws_frames.py [--frames 40000] [--sessions 4] [--in-flight 64]
    python bench/ws_frames.py --idle 10 [--sessions 16]

`--idle S` measures instead what long-polling sessions cost while their queue stays empty:
server and MariaDB CPU per second over S seconds, each session waiting in a 30 s claim.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import cpu_seconds, environment, pid_of  # noqa: E402
from bench._worker import RawSession, run_loop  # noqa: E402
from bench.suite import create_queue  # noqa: E402


async def idle(url: str, token: str, seconds: float, sessions: int) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        qid = await create_queue(client, "idle")
    conns = [await RawSession.connect(url, token, qid, f"idle-{i}") for i in range(sessions)]
    port = url.rsplit(":", 1)[1]
    server, mariadb = pid_of("-f", f"server.*--port {port}"), pid_of("-x", "mariadbd")
    polls = [asyncio.ensure_future(s.call({"type": "claim", "queue_id": qid, "max_tasks": 10, "wait_ms": 30000}))
             for s in conns]
    await asyncio.sleep(1.0)
    before = (cpu_seconds(server), cpu_seconds(mariadb)) if server and mariadb else (0.0, 0.0)
    await asyncio.sleep(seconds)
    after = (cpu_seconds(server), cpu_seconds(mariadb)) if server and mariadb else (0.0, 0.0)
    print(f"{sessions} sessions long-polling an empty queue for {seconds:.0f} s: server "
          f"{(after[0] - before[0]) * 1000 / seconds:.1f} ms CPU/s, MariaDB {(after[1] - before[1]) * 1000 / seconds:.1f} ms CPU/s")
    for p in polls:
        p.cancel()
    for s in conns:
        await s.close()


async def run(url: str, token: str, frames: int, sessions: int, in_flight: int) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
        qid = await create_queue(client, "frames")
    conns = [await RawSession.connect(url, token, qid, f"frames-{i}") for i in range(sessions)]
    port = url.rsplit(":", 1)[1]
    pid = pid_of("-f", f"server.*--port {port}")
    per_session = frames // sessions

    async def pound(s: RawSession) -> None:
        sem = asyncio.Semaphore(in_flight)

        async def one() -> None:
            async with sem:
                r = await s.call({"type": "ping"})
                assert r["ok"], r

        await asyncio.gather(*(one() for _ in range(per_session)))

    await asyncio.gather(*(pound(s) for s in conns[:1]))  # warm up
    cpu0, t0 = cpu_seconds(pid) if pid else 0.0, time.perf_counter()
    await asyncio.gather(*(pound(s) for s in conns))
    wall = time.perf_counter() - t0
    cpu = (cpu_seconds(pid) - cpu0) if pid else float("nan")
    total = per_session * sessions
    print(f"{total} ping frames in {wall:.2f} s ({total / wall:,.0f}/s); "
          f"server {cpu * 1e6 / total:.1f} us CPU per frame (request + reply)")
    for s in conns:
        await s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=40_000)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--idle", type=float, default=0, metavar="SECONDS")
    a = ap.parse_args()
    with environment(None) as (urls, creds):
        if a.idle:
            run_loop(idle(urls[0], creds["token"], a.idle, a.sessions))
        else:
            run_loop(run(urls[0], creds["token"], a.frames, a.sessions, a.in_flight))


if __name__ == "__main__":
    main()
