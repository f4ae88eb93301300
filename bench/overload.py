"""An overloaded client against one node: far more concurrent submits than the node can serve.

    python bench/overload.py                          # fresh MariaDB database + one orbit server node
    python bench/overload.py --concurrency 2000 --seconds 30 --batch-ratio 0.2 --batch-size 200
    python bench/overload.py --concurrency 3000 --seconds 30 --batch-ratio 0
    python bench/overload.py ... --env ORBIT_MAX_REQUESTS_IN_PROGRESS=1000   # a setting of the node

Each of `--concurrency` clients holds one keep-alive connection and submits in a closed loop
(single submits, and a `--batch-ratio` share of batch submits of `--batch-size` tasks) for
`--seconds`, ignoring `Retry-After` unless `--honor-retry-after` (tests/support/overload.py). A
client-side timeout (`--timeout`) counts as an unanswered request. Meanwhile another process reads
`/healthz` every 250 ms (this client's event loop, busy with thousands of connections, would
otherwise be what it measures). Afterwards: latency percentiles per outcome, the node's own view
(its request histogram: how many submits took over 1/2.5/5/10 s), its shed count
(`orbit_requests_shed_total`), how soon a lone submit is accepted once the load has stopped, the
refused submits sent again with their keys, and the database's count of the queue's tasks (every
accepted one is there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import _proc  # noqa: E402
from bench._harness import (  # noqa: E402
    _cli, bootstrap, cpu_seconds, create_mysql_database, drop_mysql_database, free_port, mysql, percentile,
)
from tests.support.overload import Conn, offer, resend  # noqa: E402


def pct(values: list[float]) -> str:
    if not values:
        return "-"
    ms = [v * 1000 for v in values]
    return (f"n={len(ms)} p50={percentile(ms, 50):.0f} p90={percentile(ms, 90):.0f} "
            f"p99={percentile(ms, 99):.0f} max={max(ms):.0f} ms")


def server_side(metrics: str) -> dict:
    """The node's request histogram for submits (and requests refused before routing, which it
    files under the route "unmatched"): how many took longer than 1, 2.5, 5 and 10 s, per status class."""
    buckets: Counter = Counter()
    for line in metrics.splitlines():
        if line.startswith("orbit_http_request_duration_seconds_bucket{") and 'method="POST"' in line \
                and ("/tasks" in line or 'route="unmatched"' in line):
            labels, value = line.rsplit(" ", 1)
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            cls = labels.split('status="', 1)[1].split('"', 1)[0]
            buckets[(cls, le)] += float(value)
    out = {}
    for cls in sorted({c for c, _ in buckets}):
        total = buckets[(cls, "+Inf")]
        over = {f">{le}s": int(total - buckets[(cls, le)]) for le in ("1.0", "2.5", "5.0", "10.0")}
        out[cls] = {"n": int(total), **over}
    return out


async def run(base: str, creds: dict, args: argparse.Namespace, server_pid: int | None) -> dict:
    token = creds["token"]
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        r = await c.post("/v1/queues", json={"name": f"overload-{uuid.uuid4().hex[:8]}", "max_concurrency": 100,
                                             "rate_per_second": 1000, "max_unfinished_tasks": 1_000_000},
                         headers={"Idempotency-Key": uuid.uuid4().hex})
        r.raise_for_status()
        queue_id = r.json()["data"]["queue"]["id"]

    probe = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--probe", base, "--seconds", str(args.seconds), stdout=asyncio.subprocess.PIPE)
    cpu0 = cpu_seconds(server_pid) if server_pid else None
    t_start = time.monotonic()
    batch_every = round(1 / args.batch_ratio) if args.batch_ratio else 0
    sent = await offer(base, token, queue_id, clients=args.concurrency, seconds=args.seconds, batch_every=batch_every,
                       batch_size=args.batch_size, timeout=args.timeout, honor_retry_after=args.honor_retry_after)
    elapsed = time.monotonic() - t_start
    health, health_errors = json.loads((await probe.communicate())[0])
    cpu = (cpu_seconds(server_pid) - cpu0) if server_pid else None

    # Recovery: how soon a lone submit is accepted after the load; the refused ones sent again.
    conn = Conn(base, token)
    t0 = time.monotonic()
    while True:
        lone, _, _ = await conn.request("POST", f"/v1/queues/{queue_id}/tasks", {"payload": {}},
                                        {"Idempotency-Key": uuid.uuid4().hex})
        if lone == 201 or time.monotonic() - t0 > 30:
            break
        await asyncio.sleep(0.1)
    recovery_ms = (time.monotonic() - t0) * 1000
    retried: Counter = Counter()
    for s in [s for s in sent if s.status == 503][: args.retry_refused]:
        again = await resend(base, token, s)
        retried[f"{again.status} deduplicated={again.data.get('deduplicated') if again.data else None}"] += 1
    _, _, text = await conn.request("GET", "/metrics")
    await conn.close()
    metrics = text.decode()

    by: dict[tuple, list[float]] = defaultdict(list)
    for s in sent:
        by[(s.kind, s.status, s.code or s.error)].append(s.seconds)
    answered = [s.seconds for s in sent if s.status is not None]
    accepted_tasks = sum(len(s.task_ids) for s in sent if s.status in (200, 201))
    return {
        "queue_id": queue_id,
        "elapsed_s": round(elapsed, 1),
        "requests": len(sent),
        "outcomes": {f"{k[0]} {k[1]} {k[2] or ''}".strip(): pct(v) for k, v in sorted(by.items(), key=str)},
        "all_answered": pct(answered),
        "unanswered": sum(1 for s in sent if s.status is None),
        "retry_after_on_503": dict(Counter(s.retry_after for s in sent if s.status == 503)),
        "accepted_requests_per_s": round(sum(1 for s in sent if s.status in (200, 201)) / elapsed, 1),
        "accepted_tasks": accepted_tasks,
        "accepted_tasks_per_s": round(accepted_tasks / elapsed, 1),
        "server_cpu_s": round(cpu, 1) if cpu is not None else None,
        "healthz": pct([h / 1000 for h in health]) + f" errors={health_errors}",
        "recovery_lone_submit_ms": round(recovery_ms, 1),
        "refused_sent_again": dict(retried),
        "shed_metric": [line for line in metrics.splitlines() if line.startswith("orbit_requests_shed_total")],
        "server_side_submit_latency": server_side(metrics),
    }


async def probe_health(base: str, seconds: float) -> None:
    """Read /healthz every 250 ms for `seconds`; print [latencies_ms, errors] as JSON."""
    conn = Conn(base, "-")
    stop_at = time.monotonic() + seconds
    latencies: list[float] = []
    errors = 0
    while time.monotonic() < stop_at:
        t0 = time.monotonic()
        try:
            status, _, _ = await asyncio.wait_for(conn.request("GET", "/healthz"), 30)
            latencies.append((time.monotonic() - t0) * 1000)
            errors += status != 200
        except Exception:
            errors += 1
            await conn.close()
        await asyncio.sleep(0.25)
    await conn.close()
    print(json.dumps([latencies, errors]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--batch-ratio", type=float, default=0.2)
    ap.add_argument("--batch-size", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--honor-retry-after", action="store_true")
    ap.add_argument("--retry-refused", type=int, default=200, help="refused submits sent again after the load")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the server process")
    ap.add_argument("--probe", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.probe:
        asyncio.run(probe_health(args.probe, args.seconds))
        return
    _proc.install_handlers()
    url = create_mysql_database("orbit_overload")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o700)
            creds = bootstrap(url, Path(tmp))
            port = free_port()
            env = {**os.environ, **dict(e.split("=", 1) for e in args.env)}
            log = Path(tmp) / "server.log"
            p = _proc.spawn(_cli("orbit") + ["server", "--database-url", url, "--port", str(port),
                                             "--node-id", "overload", "--log-level", "warning"],
                            env=env, log_path=str(log))
            base = f"http://127.0.0.1:{port}"
            deadline = time.time() + 60
            while True:
                try:
                    if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if p.poll() is not None or time.time() > deadline:
                    print(log.read_text()[-3000:])
                    raise SystemExit("server did not start")
                time.sleep(0.1)
            try:
                result = asyncio.run(run(base, creds, args, p.pid))
            finally:
                _proc.stop(p)
            db = url.rsplit("/", 1)[1]
            result["tasks_in_database"] = int(mysql(
                f"SELECT COUNT(*) FROM tasks WHERE queue_id = '{result['queue_id']}'", db).strip())
            result["server_log_events"] = dict(Counter(
                json.loads(line).get("event", "?") for line in log.read_text().splitlines() if line.startswith("{")))
            print(json.dumps(result, indent=1))
    finally:
        drop_mysql_database(url)


if __name__ == "__main__":
    main()
