"""One chaos run: a private MariaDB, N server nodes, SDK worker processes, producers, faults.

Phases:

1. **set-up** — a private MariaDB, a migrated database, credentials, `nodes` server
   processes; an application quota, three queues (a `retry` policy, a `review` policy,
   one whose tasks hold resource keys) and two resource keys, every layer's limit set
   low enough to bind.
2. **load and faults** — producers submit tasks (single and batch) at `rate` per second
   and resend the same idempotency key until they get an answer; SDK workers run them and
   log every execution; the fault schedule (`faults.plan`) kills and stops nodes and
   workers and crash-restarts MariaDB; every few seconds the usage counters are recounted
   in one consistent snapshot.
3. **drain** — producing stops, every key still unanswered is resent until answered,
   stopped processes resume and killed ones restart, and the run waits until every task
   is settled; then workers and nodes get SIGTERM and must exit cleanly.
4. **checks** — `checks.check_all` over the database's rows, the producers' answers and the
   handlers' logs, plus a final recount. A report (JSON) records the figures and problems.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncmy
import httpx

import orbit
from chaos import checks, faults
from chaos.mariadb import PrivateMariaDB, create_database
from orbit.server.store.queries.leases import STARTED_AT, STARTED_ON_TASK
from tests.cluster.nodes import Cluster, ManagedProcess, ServerNode, bootstrap_credentials

ROOT = Path(__file__).resolve().parent.parent
RETRYABLE_STATUS = {429, 500, 502, 503, 504}
# Leases as the server reads them: a live lease's Start is on its task's row while the task is
# RUNNING, so its row alone would read it unstarted.
_LEASES_AND_TASKS = "leases l JOIN tasks t ON t.id = l.task_id"
_AS_STARTED = (f"CASE WHEN {STARTED_ON_TASK} THEN 'RUNNING' ELSE l.state END AS state, "
               f"CASE WHEN {STARTED_ON_TASK} THEN 0 ELSE l.reserved END AS reserved, "
               f"{STARTED_AT} AS started_at, l.worker_node_id")


@dataclass
class Config:
    seconds: float = 120.0
    nodes: int = 3
    workers: int = 3
    rate: float = 25.0  # tasks offered per second, all producers together
    every: float = 6.0  # mean seconds between node and worker faults
    db_restarts: int = 1
    lease_ms: int = 4000
    seed: int = field(default_factory=lambda: random.randrange(1 << 30))
    workdir: Path = Path(".local/chaos")
    settle_timeout: float = 120.0
    snapshot_every: float = 5.0


@dataclass
class Producers:
    """What producers were told: every answer per key, and the keys still without one."""

    answers: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    pending: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # key -> (queue, body)
    refused: dict[str, str] = field(default_factory=dict)  # key -> a final refusal code
    tries: Counter = field(default_factory=Counter)
    sent: int = 0

    @property
    def accepted(self) -> dict[str, str]:
        return {k: ids[0] for k, ids in self.answers.items() if ids}


class Run:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.dir = Path(cfg.workdir).resolve() / f"run-{time.strftime('%Y%m%dT%H%M%S')}-{cfg.seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.db = PrivateMariaDB(self.dir / "mariadb")
        self.cluster: Cluster | None = None
        self.workers: list[ManagedProcess] = []
        self.producers = Producers()
        self.fault_log: list[dict[str, Any]] = []
        self.snapshot_problems: list[str] = []
        self.snapshots = 0
        self.backlog_samples = 0
        self.t0 = 0.0
        self.stop_load = asyncio.Event()
        self.down: set[tuple[str, int]] = set()

    # ------------------------------------------------------------ set-up

    def _say(self, msg: str) -> None:
        print(f"[chaos {time.monotonic() - self.t0:7.1f}s] {msg}", flush=True)

    async def setup(self) -> None:
        cfg = self.cfg
        await asyncio.to_thread(self.db.start)
        self.url = await create_database(self.db.base_url, "orbit_chaos")
        from orbit.server.store import migrate

        await migrate.upgrade(self.url)
        self.creds = await asyncio.to_thread(
            bootstrap_credentials, self.url, self.dir / "creds", application="chaos", worker_access=True,
            permissions=("applications:manage", "tasks:review"))
        self.token = self.creds["token"]
        self.cluster = Cluster(self.url, self.dir)
        nodes = [self.cluster.add_node(f"chaos-node-{i + 1}", start=False) for i in range(cfg.nodes)]
        for n in nodes:
            n.start()
        for n in nodes:
            await n.wait_ready_async()
        async with orbit.AsyncClient(nodes[0].base_url, token=self.token) as client:
            me = await client.get_credential()
            app = await client.get_application(me.application_id)
            await client.configure_application(me.application_id, "chaos-app", orbit.ConfigureApplicationRequest(
                expected_revision=app.revision, reason="chaos limits", paused=False, max_concurrency=14,
                rate_per_second=40, max_unfinished_tasks=600))
            self.queues = {}
            for name, conc, rate, backlog in (("retry", 8, 20, 300), ("review", 5, 12, 200), ("keyed", 8, 25, 250)):
                q = await client.create_queue(f"chaos-q-{name}", orbit.CreateQueueRequest(
                    name=f"chaos-{name}", max_concurrency=conc, rate_per_second=rate, max_unfinished_tasks=backlog))
                self.queues[name] = q.queue.id
            self.keys = {}
            for name, conc in (("db-primary", 2), ("partner-api", 3)):
                k = await client.create_resource_key(f"chaos-k-{name}", orbit.CreateResourceKeyRequest(
                    name=name, max_concurrency=conc))
                self.keys[name] = k.resource_key.id
            self.limits = checks.Limits(
                queues={self.queues["retry"]: (8, 20), self.queues["review"]: (5, 12),
                        self.queues["keyed"]: (8, 25)},
                application=(14, 40), keys={self.keys["db-primary"]: 2, self.keys["partner-api"]: 3},
                backlogs={self.queues["retry"]: 300, self.queues["review"]: 200, self.queues["keyed"]: 250,
                          "application": 600})
        for i in range(cfg.workers):
            self.workers.append(self._worker(i))

    def _worker(self, i: int) -> ManagedProcess:
        urls = [n.base_url for n in self.nodes]
        urls = urls[i % len(urls):] + urls[:i % len(urls)]
        argv = [sys.executable, "-m", "chaos.worker", "--token-file", self.creds["file"],
                "--log", str(self.dir / f"executions-{i}.jsonl"), "--node-id", f"chaos-worker-{i}",
                "--lease-ms", str(self.cfg.lease_ms), "--concurrency", "6",
                *[a for u in urls for a in ("--url", u)], *[a for q in self.queues.values() for a in ("--queue", q)]]
        if i % 2:
            argv.append("--sync")
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        return self.cluster.start_process(argv, name=f"worker-{i}", env=env, cwd=str(ROOT))

    @property
    def nodes(self) -> list[ServerNode]:
        return self.cluster.nodes

    # ------------------------------------------------------------ producers

    def _new_task(self, key: str) -> tuple[str, dict[str, Any]]:
        r = self.rng
        kind = r.choices(["retry", "review", "keyed"], weights=[4, 3, 2])[0]
        # A quarter of the handlers run for seconds (so kills land mid-handler); those holding
        # a resource key stay short, or the keys' few permits would make the backlog grow.
        long = kind != "keyed" and r.random() < 0.25
        payload: dict[str, Any] = {"k": key, "ms": int(r.uniform(800, 2500) if long else r.uniform(10, 250))}
        if r.random() < 0.15:
            payload["fail"] = r.choice([1, 1, 2])
        if r.random() < 0.03:
            payload["perm"] = True
        body: dict[str, Any] = {"payload": payload, "priority": r.randrange(10),
                                "retry": {"initial_backoff_ms": 100, "max_backoff_ms": 1000}}
        if kind == "review":
            body.update(on_lease_lost="review", max_attempts=4)
        else:
            body.update(on_lease_lost="retry", max_attempts=10)
        if kind == "keyed":
            body["resource_keys"] = r.sample(["db-primary", "partner-api"], r.choice([1, 1, 2]))
        return self.queues[kind], body

    async def _post(self, client: httpx.AsyncClient, attempt: int, path: str, key: str,
                    body: dict[str, Any]) -> httpx.Response | None:
        node = self.nodes[attempt % len(self.nodes)]
        try:
            return await client.post(f"{node.base_url}{path}", json=body,
                                     headers={"Authorization": f"Bearer {self.token}", "Idempotency-Key": key})
        except httpx.HTTPError:
            return None

    def _answered(self, key: str, task_id: str) -> None:
        self.producers.answers[key].append(task_id)
        self.producers.pending.pop(key, None)

    async def submit_one(self, client: httpx.AsyncClient, key: str, deadline: float | None) -> None:
        """Resend the same key (rotating nodes) until it is answered, refused for good, or the
        deadline passes (the drain phase picks it up again)."""
        qid, body = self.producers.pending[key]
        attempt = self.rng.randrange(len(self.nodes))
        while deadline is None or time.monotonic() < deadline:
            self.producers.tries[key] += 1
            resp = await self._post(client, attempt, f"/v1/queues/{qid}/tasks", key, body)
            attempt += 1
            if resp is not None and resp.status_code in (200, 201):
                self._answered(key, resp.json()["data"]["task"]["id"])
                return
            if resp is not None and resp.status_code not in RETRYABLE_STATUS:
                self.producers.refused[key] = f"{resp.status_code} {resp.text[:200]}"
                self.producers.pending.pop(key, None)
                return
            await asyncio.sleep(0.2 + self.rng.random() * 0.3)

    async def submit_batch(self, client: httpx.AsyncClient, keys: list[str], deadline: float) -> None:
        """A batch resent under its own key until answered; items refused for a full backlog
        are resent one by one, under their own keys (the task's identity)."""
        qid = self.producers.pending[keys[0]][0]
        body = {"tasks": [{"idempotency_key": k, **self.producers.pending[k][1]} for k in keys]}
        batch_key = f"batch-{keys[0]}"
        attempt = self.rng.randrange(len(self.nodes))
        while time.monotonic() < deadline:
            resp = await self._post(client, attempt, f"/v1/queues/{qid}/tasks:batch", batch_key, body)
            attempt += 1
            if resp is not None and resp.status_code == 200:
                for k, result in zip(keys, resp.json()["data"]["results"], strict=True):
                    if "task" in result:
                        self._answered(k, result["task"]["id"])
                    elif result["error"]["code"] not in ("QUEUE_FULL", "APPLICATION_FULL"):
                        self.producers.refused[k] = json.dumps(result["error"])
                        self.producers.pending.pop(k, None)
                break
            if resp is not None and resp.status_code not in RETRYABLE_STATUS:
                for k in keys:
                    self.producers.refused[k] = f"{resp.status_code} {resp.text[:200]}"
                    self.producers.pending.pop(k, None)
                return
            await asyncio.sleep(0.2 + self.rng.random() * 0.3)
        await asyncio.gather(*(self.submit_one(client, k, deadline) for k in keys if k in self.producers.pending))

    async def produce(self, client: httpx.AsyncClient, index: int, share: float) -> None:
        inflight: set[asyncio.Task] = set()
        n = 0
        next_at = time.monotonic()
        while not self.stop_load.is_set():
            size = 5 if self.rng.random() < 0.2 else 1
            keys = []
            for _ in range(size):
                key = f"p{index}-{n}"
                n += 1
                qid, body = self._new_task(key)
                if keys:  # a batch goes to one queue
                    qid = self.producers.pending[keys[0]][0]
                self.producers.pending[key] = (qid, body)
                keys.append(key)
            self.producers.sent += size
            deadline = time.monotonic() + 60
            job = self.submit_batch(client, keys, deadline) if size > 1 else self.submit_one(client, keys[0], deadline)
            t = asyncio.create_task(job)
            inflight.add(t)
            t.add_done_callback(inflight.discard)
            next_at += size / share
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        if inflight:
            await asyncio.gather(*inflight)

    # ------------------------------------------------------------ faults

    async def inject(self, f: faults.Fault) -> None:
        target = ("db", 0) if f.kind == faults.RESTART_DB else (
            ("node", f.target) if f.kind in (faults.KILL_NODE, faults.STOP_NODE) else ("worker", f.target))
        entry = {"at": round(time.monotonic() - self.t0, 2), **asdict(f)}
        if target in self.down or (target[0] == "node" and len({d for d in self.down if d[0] == "node"})
                                   >= len(self.nodes) - 1):
            entry["skipped"] = "target down, or the last node up"
            self.fault_log.append(entry)
            return
        self.down.add(target)
        self.fault_log.append(entry)
        self._say(f"fault {f.kind} #{f.target} for {f.hold}s")
        try:
            if f.kind == faults.RESTART_DB:
                await asyncio.to_thread(self.db.kill)
                await asyncio.sleep(f.hold)
                t = time.monotonic()
                await asyncio.to_thread(self.db.start)
                self.db.restarts += 1
                entry["db_back_after_s"] = round(time.monotonic() - t + f.hold, 2)
            elif f.kind == faults.KILL_NODE:
                node = self.nodes[f.target]
                await asyncio.to_thread(node.kill)
                await asyncio.sleep(f.hold)
                node.start()
                await node.wait_ready_async(60)
            elif f.kind == faults.STOP_NODE:
                self.nodes[f.target].send_signal(signal.SIGSTOP)
                await asyncio.sleep(f.hold)
                self.nodes[f.target].send_signal(signal.SIGCONT)
            elif f.kind == faults.KILL_WORKER:
                await asyncio.to_thread(self.workers[f.target].kill)
                await asyncio.sleep(f.hold)
                self.workers[f.target].start()
            else:
                self.workers[f.target].send_signal(signal.SIGSTOP)
                await asyncio.sleep(f.hold)
                self.workers[f.target].send_signal(signal.SIGCONT)
        except Exception as exc:  # a target that did not come back: a finding, and heal() retries it
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            self._say(f"fault {f.kind} #{f.target}: {entry['error']}")
        finally:
            self.down.discard(target)

    async def run_faults(self, plan: list[faults.Fault]) -> None:
        pending = []
        for f in plan:
            await asyncio.sleep(max(0.0, self.t0 + f.at - time.monotonic()))
            if self.stop_load.is_set():
                break
            pending.append(asyncio.create_task(self.inject(f)))
        await asyncio.gather(*pending)

    # ------------------------------------------------------------ snapshots

    async def snapshot(self) -> checks.Snapshot:
        """The usage rows and what they count, read in one REPEATABLE READ snapshot."""
        conn = await self._connect()
        try:
            async with conn.cursor(asyncmy.cursors.DictCursor) as cur:
                await cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                await cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")

                async def rows(sql: str) -> list[dict[str, Any]]:
                    await cur.execute(sql)
                    return list(await cur.fetchall())

                at = (await rows("SELECT NOW(6) AS at"))[0]["at"]
                qu = {r["queue_id"]: r for r in await rows("SELECT * FROM queue_usage")}
                au = await rows("SELECT * FROM application_usage")
                ku = {r["resource_key_id"]: r for r in await rows("SELECT * FROM resource_key_usage")}
                tasks = await rows("SELECT id, queue_id, state, resource_key_ids FROM tasks")
                leases = await rows(f"SELECT l.task_id, l.queue_id, {_AS_STARTED} FROM {_LEASES_AND_TASKS}")
                qn = await rows("SELECT queue_id, worker_node_id, in_flight FROM queue_nodes")
                await cur.execute("COMMIT")
        finally:
            conn.close()
        (app,) = au  # the run's database holds one application
        return checks.Snapshot(at=at, queue_usage={q: qu[q] for q in self.queues.values()}, app_usage=app,
                               key_usage={k: ku[k] for k in self.keys.values()}, tasks=tasks, leases=leases,
                               queue_nodes=qn)

    async def backlog_loop(self) -> None:
        """Unfinished tasks per queue and application, counted in a consistent snapshot twice
        a second, against the backlog limits."""
        while not self.stop_load.is_set():
            await asyncio.sleep(0.5)
            if ("db", 0) in self.down:
                continue
            try:
                rows = await self._rows("SELECT NOW(6) AS at, queue_id, COUNT(*) AS n FROM tasks "
                                        "WHERE state IN ('WAITING', 'LEASED', 'RUNNING', 'NEEDS_REVIEW') "
                                        "GROUP BY queue_id")
            except Exception:  # the database is being restarted
                continue
            unfinished = {r["queue_id"]: int(r["n"]) for r in rows}
            unfinished["application"] = sum(unfinished.values())
            self.backlog_samples += 1
            at = rows[0]["at"].isoformat(timespec="milliseconds") if rows else "-"
            self.snapshot_problems += checks.check_backlogs(unfinished, self.limits.backlogs, at)

    async def recount_loop(self) -> None:
        while not self.stop_load.is_set():
            await asyncio.sleep(self.cfg.snapshot_every)
            if ("db", 0) in self.down:
                continue
            try:
                s = await self.snapshot()
            except Exception:  # the database is being restarted: the next snapshot will do
                continue
            self.snapshots += 1
            self.snapshot_problems += checks.recount(s)
            unfinished = Counter(t["queue_id"] for t in s.tasks if t["state"] in checks.UNFINISHED)
            unfinished["application"] = sum(unfinished.values())
            self.snapshot_problems += checks.check_backlogs(unfinished, self.limits.backlogs, str(s.at))

    # ------------------------------------------------------------ drain and checks

    async def heal(self) -> None:
        """Everything up again: stopped processes resumed, dead ones restarted."""
        while self.down:
            await asyncio.sleep(0.2)
        for n in self.nodes:
            n.send_signal(signal.SIGCONT)
            if not n.alive:
                n.start()
            await n.wait_ready_async(60)
        for w in self.workers:
            w.send_signal(signal.SIGCONT)
            if not w.alive:
                w.start()

    async def settle(self) -> dict[str, int]:
        deadline = time.monotonic() + self.cfg.settle_timeout
        while True:
            rows = await self._rows("SELECT state, COUNT(*) AS n FROM tasks GROUP BY state")
            by = {r["state"]: int(r["n"]) for r in rows}
            if all(s in checks.SETTLED for s in by) or time.monotonic() > deadline:
                return by
            await asyncio.sleep(1.0)

    async def _connect(self) -> Any:
        """A connection of the checks' own, straight to the run's database (never through a node)."""
        return await asyncmy.connect(host="127.0.0.1", port=self.db.port, user="root", password="",
                                     db="orbit_chaos", connect_timeout=5)

    async def _rows(self, sql: str) -> list[dict[str, Any]]:
        conn = await self._connect()
        try:
            async with conn.cursor(asyncmy.cursors.DictCursor) as cur:
                await cur.execute(sql)
                return list(await cur.fetchall())
        finally:
            conn.close()

    def executions(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.dir.glob("executions-*.jsonl")):
            for line in path.read_text().splitlines():
                if line.strip():
                    out.append(json.loads(line))
        return out

    def token_leaks(self) -> list[str]:
        secret = self.token.split("_", 2)[-1]
        return [p.name for p in (self.dir / "logs").glob("*.log") if secret in p.read_text(errors="replace")]

    async def main(self) -> dict[str, Any]:
        cfg = self.cfg
        self.t0 = time.monotonic()
        plan = faults.plan(cfg.seconds, seed=cfg.seed, nodes=cfg.nodes, workers=cfg.workers, every=cfg.every,
                           db_restarts=cfg.db_restarts, lease_ms=cfg.lease_ms)
        await self.setup()
        self._say(f"set up in {self.dir}: {cfg.nodes} nodes, {cfg.workers} workers, {len(plan)} faults planned, "
                  f"seed {cfg.seed}")
        self.t0 = time.monotonic()
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0), limits=limits) as client:
            producers = [asyncio.create_task(self.produce(client, i, cfg.rate / 2)) for i in range(2)]
            fault_task = asyncio.create_task(self.run_faults(plan))
            recounts = asyncio.gather(self.recount_loop(), self.backlog_loop())
            await asyncio.sleep(cfg.seconds)
            self.stop_load.set()
            self._say(f"load stopped: {self.producers.sent} keys sent, {len(self.producers.pending)} unanswered")
            await asyncio.gather(*producers, fault_task, recounts)
            await self.heal()
            gate = asyncio.Semaphore(32)

            async def resend(key: str) -> None:
                async with gate:
                    await self.submit_one(client, key, time.monotonic() + 120)

            await asyncio.gather(*(resend(k) for k in list(self.producers.pending)))
        self._say(f"all answered: {len(self.producers.accepted)} accepted, {len(self.producers.refused)} refused, "
                  f"{len(self.producers.pending)} unanswered; settling")
        states = await self.settle()
        self._say(f"settled: {states}")
        final = await self.snapshot()
        exits = {}
        for w in self.workers:
            exits[w.name] = await asyncio.to_thread(w.terminate, 40)
        for n in self.nodes:
            exits[n.name] = await asyncio.to_thread(n.terminate, 20)
        tasks = await self._rows("SELECT id, queue_id, state, attempts, max_attempts, on_lease_lost, payload, "
                                 "resource_key_ids, created_at, finished_at FROM tasks")
        leases = await self._rows(f"SELECT l.id, l.task_id, l.queue_id, l.attempt, l.leased_at, l.ended_at, "
                                  f"l.outcome, l.late_reports, {_AS_STARTED} FROM {_LEASES_AND_TASKS}")
        idem = {r["idem_key"]: r["resource_id"] for r in await self._rows(
            "SELECT idem_key, resource_id FROM idempotency_records WHERE operation = 'tasks.submit'")}
        history = checks.History(tasks=tasks, leases=leases, limits=self.limits, accepted=self.producers.accepted,
                                 answers=dict(self.producers.answers), executions=self.executions(),
                                 idempotency=idem)
        problems = checks.check_all(history)
        problems["recount"] = self.snapshot_problems + checks.recount(final)
        problems["producers"] = [f"key {k} refused: {why}" for k, why in sorted(self.producers.refused.items())] + \
            [f"key {k} never answered" for k in sorted(self.producers.pending)]
        problems["exits"] = [f"{name} exited {rc}" for name, rc in exits.items() if rc != 0]
        problems["token in logs"] = self.token_leaks()
        problems["faults"] = [f"{f['kind']} #{f['target']} at {f['at']}s: {f['error']}"
                              for f in self.fault_log if "error" in f]
        outcomes = Counter(lease["outcome"] for lease in leases)
        late = sum(len(json.loads(lease["late_reports"])) for lease in leases if lease["late_reports"])
        execs = [e for e in history.executions if e["ev"] == "begin"]
        ran = Counter(e["task"] for e in execs)
        done = [f for f in self.fault_log if "skipped" not in f]
        report = {
            "seed": cfg.seed, "seconds": cfg.seconds, "nodes": cfg.nodes, "workers": cfg.workers, "dir": str(self.dir),
            "keys_sent": self.producers.sent, "tasks": len(tasks), "task_states": dict(Counter(t["state"] for t in tasks)),
            "submit_retries": sum(self.producers.tries.values()) - len(self.producers.tries),
            "lease_outcomes": dict(outcomes), "late_reports": late,
            "executions": len(execs), "tasks_run_more_than_once": sum(1 for n in ran.values() if n > 1),
            "faults": dict(Counter(f["kind"] for f in done)), "faults_skipped": len(self.fault_log) - len(done),
            "db_restarts": self.db.restarts, "snapshots_recounted": self.snapshots + 1, "backlog_samples": self.backlog_samples,
            "problems": {k: v[:50] for k, v in problems.items() if v},
            "problem_count": sum(len(v) for v in problems.values()),
        }
        (self.dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (self.dir / "faults.json").write_text(json.dumps(self.fault_log, indent=2))
        return report

    def close(self, keep_database: bool) -> None:
        """Stop everything; the database's files (114 MB and more) stay only for a failed run."""
        if self.cluster is not None:
            self.cluster.close()
        self.db.kill()
        shutil.rmtree(self.db.sockdir, ignore_errors=True)
        if not keep_database:
            shutil.rmtree(self.db.dir, ignore_errors=True)


def run(cfg: Config) -> dict[str, Any]:
    r = Run(cfg)
    report: dict[str, Any] = {}
    try:
        report = asyncio.run(r.main())
        return report
    finally:
        r.close(keep_database=report.get("problem_count", 1) > 0)
