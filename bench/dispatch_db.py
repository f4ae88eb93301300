"""The dispatch lifecycle at the database layer alone (no HTTP, no WebSocket), per batch size.

    python bench/dispatch_db.py [--tasks 5000] [--batches 1,10,50,200] [--statements] [--driver]

Claim + grouped Start + grouped complete through
the service functions the server uses, one pipeline, on a fresh MariaDB
database. `--statements` adds per-statement wall times (where the time goes). `--schema-sql SQL`
runs after the migrations: a schema change measured before it becomes one. Client and
database take turns here, so the ratio of MariaDB to Python CPU per task is steadier than
either on a shared machine.

`--driver` splits the Python CPU of a transaction (uvloop's event loop, as the server runs) into
the driver's part and the rest, per transaction: sending a round trip and reading its first
result (`execute`), reading each further result (`nextset`: MariaDB sends each statement's
result as it finishes, so the client wakes once per statement), the rows of result sets
(`fetchall`), and how many round trips, results, result sets with rows and columns it takes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import cpu_seconds, create_mysql_database, drop_mysql_database, mysql, pid_of  # noqa: E402
from orbit.server.core.permissions import ALL_PERMISSIONS  # noqa: E402
from orbit.server.services import dispatch, tasks, tenancy  # noqa: E402
from orbit.server.services.auth import Principal  # noqa: E402
from orbit.server.services.idempotency import IdempotencyScope  # noqa: E402
from orbit.server.services.queues import insert_queue  # noqa: E402
from orbit.server.store import db as dbmod  # noqa: E402
from orbit.server.store import migrate  # noqa: E402
from orbit.server.store import tx as txmod  # noqa: E402

STATS: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])


DRIVER: collections.Counter = collections.Counter()


class _TimedCursor:
    """An asyncmy cursor whose calls count the thread's CPU into `DRIVER`."""

    def __init__(self, cursor) -> None:
        object.__setattr__(self, "_cur", cursor)

    def __getattr__(self, name):
        return getattr(self._cur, name)

    async def __aenter__(self):
        await self._cur.__aenter__()
        return self

    async def __aexit__(self, *exc):
        return await self._cur.__aexit__(*exc)

    async def _timed(self, name: str, call):
        t = time.thread_time()
        try:
            return await call
        finally:
            DRIVER[name] += time.thread_time() - t

    async def execute(self, text, *args):
        DRIVER["round trips"] += 1
        DRIVER["results"] += 1
        return await self._timed("execute", self._cur.execute(text, *args))

    async def nextset(self):
        more = await self._timed("nextset", self._cur.nextset())
        DRIVER["results"] += bool(more)
        return more

    async def fetchall(self):
        DRIVER["result sets with rows"] += 1
        DRIVER["columns"] += len(self._cur.description)
        return await self._timed("fetchall", self._cur.fetchall())


class _TimedConnection:
    def __init__(self, conn) -> None:
        object.__setattr__(self, "_conn", conn)

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def __setattr__(self, name, value):
        setattr(self._conn, name, value)

    def cursor(self, *args):
        return _TimedCursor(self._conn.cursor(*args))


def _time_driver() -> None:
    """Count the driver's CPU (`DRIVER`) and each transaction's (`DRIVER["transaction"]`)."""
    conn_of = txmod.Tx._driver_conn

    async def timed_conn(self):
        d = await conn_of(self)
        return d if isinstance(d, _TimedConnection) else _TimedConnection(d)

    txmod.Tx._driver_conn = timed_conn
    transaction = dbmod.Database.transaction

    async def timed_transaction(self, fn, *args, **kwargs):
        t = time.thread_time()
        try:
            return await transaction(self, fn, *args, **kwargs)
        finally:
            DRIVER["transaction"] += time.thread_time() - t
            DRIVER["transactions"] += 1

    dbmod.Database.transaction = timed_transaction


def _driver_figures() -> dict:
    """Per transaction: CPU in µs, counts as means."""
    n = DRIVER.pop("transactions", 0) or 1
    out = {k: round(v / n * 1e6) for k, v in DRIVER.items() if isinstance(v, float)}
    out.update({k: round(v / n, 2) for k, v in DRIVER.items() if isinstance(v, int)})
    out["rest of the transaction"] = out["transaction"] - sum(out.get(k, 0) for k in ("execute", "nextset", "fetchall"))
    DRIVER.clear()
    return {"per transaction": out}


def _mariadb_cpu_seconds() -> float | None:
    """CPU time MariaDB has used so far, when it runs on this machine."""
    pid = pid_of("-x", "mariadbd")
    return None if pid is None else cpu_seconds(pid)


def _time_statements() -> None:
    orig = txmod.Tx._one_statement

    async def timed(self, stmt):
        if self._multi:  # timed statement by statement in one_by_one
            return await orig(self, stmt)
        t = time.perf_counter()
        try:
            return await orig(self, stmt)
        finally:
            s = STATS[" ".join(stmt.sql.split()[:4])[:60]]
            s[0] += 1
            s[1] += time.perf_counter() - t

    txmod.Tx._one_statement = timed

    async def one_by_one(self, statements):
        """`_run_mysql` with every statement of the round trip sent and timed on its own."""
        d = await self._driver_conn()
        skip = len(self._deferred)
        batch, self._deferred = [*self._deferred, *statements], []
        out = []
        for i, text in enumerate(batch):
            t = time.perf_counter()
            async with d.cursor() as cur:
                await cur.execute(text)
                rows = []
                if cur.description:
                    names = [c[0] for c in cur.description]
                    rows = [dict(zip(names, r)) for r in await cur.fetchall()]
                if i >= skip:
                    out.append((cur.rowcount, rows))
            s = STATS[" ".join(text.split()[:4])[:60]]
            s[0] += 1
            s[1] += time.perf_counter() - t
        return out

    txmod.Tx._run_mysql = one_by_one


async def run(url: str, total: int, batch: int) -> dict:
    db = dbmod.Database(url, pool_size=4)

    async def boot(tx):
        app = await tenancy.ensure_application(tx, f"a-{uuid.uuid4().hex[:6]}")
        ns = await tenancy.ensure_namespace(tx, app["id"], "d", "development")
        q = await insert_queue(tx, namespace_id=ns["id"], name="q", controls={
            "max_concurrency": 100000, "rate_per_second": 1000000, "max_unfinished_tasks": 1000000})
        return app, ns, q

    app, ns, q = await db.transaction(boot)
    p = Principal(uuid.uuid4().hex, app["id"], ns["id"], frozenset(ALL_PERMISSIONS), "*")
    for b in range(0, total, 500):
        items = [{"idempotency_key": uuid.uuid4().hex, "payload": {"i": i}} for i in range(min(500, total - b))]
        cmds = [tasks.batch_item_command(q["id"], i, it, 262144) for i, it in enumerate(items)]
        await tasks.submit_batch(db, p, q["id"], IdempotencyScope(ns["id"], "tasks.submit_batch", uuid.uuid4().hex, "x"), cmds)
    who = dispatch.WorkerIdentity(p, uuid.uuid4().hex, "host", "node")
    DRIVER.clear()  # the lifecycle's transactions alone, not the set-up's nor the preload's
    c0, t0, n, m0 = time.process_time(), time.perf_counter(), 0, _mariadb_cpu_seconds()
    while n < total:
        leases = (await dispatch.claim(db, who, q["id"], max_tasks=min(batch, 100), lease_ms=60000,
                                       msg_id=uuid.uuid4().hex))["tasks"]
        while len(leases) < batch and n + len(leases) < total:
            more = (await dispatch.claim(db, who, q["id"], max_tasks=min(100, batch - len(leases)), lease_ms=60000,
                                         msg_id=uuid.uuid4().hex))["tasks"]
            if not more:
                break
            leases += more
        if not leases:
            break
        await dispatch.start(db, [dispatch.StartCommand(p.credential_id, uuid.uuid4().hex, x["lease_id"]) for x in leases])
        await dispatch.complete(db, [dispatch.CompleteCommand(p.credential_id, uuid.uuid4().hex, x["lease_id"], "succeeded")
                                     for x in leases])
        n += len(leases)
    wall, cpu, m1 = time.perf_counter() - t0, time.process_time() - c0, _mariadb_cpu_seconds()
    await db.close()
    out = {"batch": batch, "tasks": n, "tasks_per_s": round(n / wall, 1), "python_cpu_us_per_task": round(cpu / n * 1e6)}
    if m0 is not None and m1 is not None:
        out["mariadb_cpu_us_per_task"] = round((m1 - m0) / n * 1e6)
    if DRIVER:
        out.update(_driver_figures())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=5000)
    ap.add_argument("--batches", default="1,10,50,200")
    ap.add_argument("--statements", action="store_true")
    ap.add_argument("--driver", action="store_true", help="the driver's share of each transaction's CPU (uvloop)")
    ap.add_argument("--schema-sql", metavar="SQL", help="run these statements after migrating the fresh database")
    args = ap.parse_args()
    if args.statements:
        _time_statements()
    if args.driver:
        import uvloop

        uvloop.install()
        _time_driver()
    url = create_mysql_database()  # ORBIT_BENCH_MYSQL_URL names the server, as for the suite
    try:
        asyncio.run(migrate.upgrade(url))
        if args.schema_sql:
            mysql(args.schema_sql, database=url.rsplit("/", 1)[1])
        for b in (int(x) for x in args.batches.split(",")):
            total = args.tasks if b >= 10 else min(args.tasks, 1000)
            print(json.dumps(asyncio.run(run(url, total, b))), flush=True)
        if args.statements:
            for k, (c, t) in sorted(STATS.items(), key=lambda x: -x[1][1])[:20]:
                print(json.dumps({"statement": k, "count": int(c), "ms_each": round(t / c * 1000, 2)}))
    finally:
        drop_mysql_database(url)

if __name__ == "__main__":
    main()
