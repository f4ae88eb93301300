"""Per-statement CPU cost of the database access layers on this machine (MariaDB).

    python bench/driver_overhead.py

Compares the raw asyncmy driver, SQLAlchemy `text()` and a SQLAlchemy Core
statement built per call — the figures that decide how hot paths are written.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncmy
from sqlalchemy import select, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orbit.server.store.db import Database  # noqa: E402
from orbit.server.store.tables import queues  # noqa: E402

N = 2000


async def main(name: str) -> list[dict]:
    results = []
    conn = await asyncmy.connect(host="127.0.0.1", user="root", password="", db=name)
    async with conn.cursor() as c:
        await c.execute("CREATE TABLE queues (id CHAR(32) PRIMARY KEY, namespace_id CHAR(32), retired_at DATETIME(6), "
                        "max_unfinished_tasks INT)")
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(N):
            await c.execute("SELECT id, retired_at, max_unfinished_tasks FROM queues WHERE id = %s AND namespace_id = %s",
                            ("a" * 32, "b" * 32))
            await c.fetchall()
        results.append(("raw asyncmy", time.perf_counter() - t0, time.process_time() - c0))
    conn.close()
    db = Database(f"mysql://root@127.0.0.1:3306/{name}", pool_size=2)
    async with db.engine.connect() as sc:
        stmt = text("SELECT id, retired_at, max_unfinished_tasks FROM queues WHERE id = :id AND namespace_id = :ns")
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(N):
            (await sc.execute(stmt, {"id": "a" * 32, "ns": "b" * 32})).all()
        results.append(("sqlalchemy text()", time.perf_counter() - t0, time.process_time() - c0))
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(N):
            (await sc.execute(select(queues.c.id, queues.c.retired_at, queues.c.max_unfinished_tasks)
                              .where(queues.c.id == "a" * 32, queues.c.namespace_id == "b" * 32))).mappings().all()
        results.append(("sqlalchemy core, built per call", time.perf_counter() - t0, time.process_time() - c0))
    await db.close()
    return [{"layer": layer, "wall_us": round(w / N * 1e6), "cpu_us": round(c / N * 1e6)} for layer, w, c in results]


if __name__ == "__main__":
    name = f"orbit_bench_{uuid.uuid4().hex[:8]}"
    subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"CREATE DATABASE {name}"], check=True)
    try:
        for r in asyncio.run(main(name)):
            print(json.dumps(r))
    finally:
        subprocess.run(["mysql", "-uroot", "-h127.0.0.1", "-e", f"DROP DATABASE {name}"], check=False)
