"""Direct MariaDB access for the benchmarks: reads of stored history, bulk pre-loading, the database ceiling.

Everything here talks to the benchmark's own scratch databases only.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncmy

from bench._harness import mysql_params


async def connect(url: str, autocommit: bool = True):
    return await asyncio.wait_for(asyncmy.connect(**mysql_params(url), autocommit=autocommit), 30)


async def fetch(url: str, sql: str, params: tuple | list = ()) -> list[tuple]:
    conn = await connect(url)
    try:
        async with conn.cursor() as c:
            await c.execute(sql, params)
            return list(await c.fetchall())
    finally:
        conn.close()


class Conn:
    """One long-lived connection for polling (reconnects if the server dropped it)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn = None

    async def fetch(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        if self.conn is None:
            self.conn = await connect(self.url)
        try:
            async with self.conn.cursor() as c:
                await asyncio.wait_for(c.execute(sql, params), 120)
                return list(await c.fetchall())
        except Exception:
            self.close()
            raise

    async def scalar(self, sql: str, params: tuple | list = ()) -> Any:
        rows = await self.fetch(sql, params)
        return rows[0][0] if rows else None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


async def wait_first_lease(url: str, queue_id: str, timeout: float) -> None:
    """Poll until the queue has a lease (a drain began); TimeoutError after `timeout`."""
    db = Conn(url)
    t0 = time.perf_counter()
    try:
        while not await db.fetch("SELECT 1 FROM leases WHERE queue_id = %s LIMIT 1", (queue_id,)):
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError(f"no task of queue {queue_id} was leased within {timeout:.0f} s")
            await asyncio.sleep(0.01)
    finally:
        db.close()


async def wait_unfinished(url: str, queue_id: str, timeout: float, interval: float = 0.25) -> int:
    """Poll the queue's unfinished count until it is zero or `timeout` passes; returns the last count.

    A drain's progress read from one usage row: counting its finished tasks instead scans an index
    range that grows with the drain, several times a second, on the database being measured."""
    db = Conn(url)
    t0 = time.perf_counter()
    try:
        while True:
            n = int(await db.scalar("SELECT unfinished FROM queue_usage WHERE queue_id = %s", (queue_id,)))
            if n == 0 or time.perf_counter() - t0 > timeout:
                return n
            await asyncio.sleep(interval)
    finally:
        db.close()


# ------------------------------------------------------------------ pre-loading waiting tasks

_DIGITS = "(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 " \
          "UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
# 0 .. 99,999 without relying on MariaDB's SEQUENCE engine (works on MySQL too).
_NUMBERS = (f"(SELECT d1.d + 10*d2.d + 100*d3.d + 1000*d4.d + 10000*d5.d AS n FROM {_DIGITS} d1 "
            f"CROSS JOIN {_DIGITS} d2 CROSS JOIN {_DIGITS} d3 CROSS JOIN {_DIGITS} d4 CROSS JOIN {_DIGITS} d5) nums")


async def _columns(c, table: str) -> list[str]:
    await c.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
                    "AND table_name = %s ORDER BY ordinal_position", (table,))
    return [r[0] for r in await c.fetchall()]


async def preload_waiting(url: str, template_task_id: str, queue_id: str, count: int, first: int,
                          chunk: int = 50_000, deadline: float | None = None) -> float:
    """Insert `count` WAITING tasks into `queue_id` that copy a task accepted through the API (the
    template, WAITING in a queue of its own), the way submit writes them.

    Per chunk, one transaction: the task rows (new ids, time-ordered before the template's), one
    idempotency record per task (key `bench-preload-<n>`, the template's receipt with the id replaced),
    and the queue's and application's `unfinished` counters. `first` numbers the rows so that
    several calls never collide. Outbox events (`task.submitted`) are not written. Returns seconds.
    """
    t0 = time.perf_counter()
    conn = await connect(url, autocommit=False)
    try:
        async with conn.cursor() as c:
            await c.execute("SELECT application_id FROM tasks WHERE id = %s AND state = 'WAITING'",
                            (template_task_id,))
            (application_id,), = await c.fetchall()
            task_cols = await _columns(c, "tasks")
            idem_cols = await _columns(c, "idempotency_records")
            await conn.commit()
            done = 0
            while done < count:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"pre-load stopped after {done} of {count} rows")
                n = min(chunk, count - done)
                base = first + done
                new_id = (f"CONCAT(SUBSTR(t.id, 1, 13), '000', '8', LPAD(LOWER(HEX({int(base)} + nums.n)), 15, '0'))")
                task_over = {"id": new_id, "queue_id": "%s"}
                sel = ", ".join(task_over.get(col, f"t.`{col}`") for col in task_cols)
                await c.execute(
                    f"INSERT INTO tasks ({', '.join(f'`{x}`' for x in task_cols)}) SELECT {sel} "
                    f"FROM tasks t CROSS JOIN {_NUMBERS} WHERE t.id = %s AND nums.n < %s",
                    (queue_id, template_task_id, n))
                overrides = {
                    "idem_key": f"CONCAT('bench-preload-', {int(base)} + nums.n)",
                    "resource_id": new_id,
                    "response": f"REPLACE(REPLACE(r.response, t.id, {new_id}), t.queue_id, %s)",
                }
                isel = ", ".join(overrides.get(col, f"r.`{col}`") for col in idem_cols)
                await c.execute(
                    f"INSERT INTO idempotency_records ({', '.join(f'`{x}`' for x in idem_cols)}) SELECT {isel} "
                    f"FROM idempotency_records r JOIN tasks t ON t.id = r.resource_id CROSS JOIN {_NUMBERS} "
                    "WHERE r.resource_id = %s AND r.operation = 'tasks.submit' AND nums.n < %s",
                    (queue_id, template_task_id, n))
                await c.execute("UPDATE queue_usage SET unfinished = unfinished + %s WHERE queue_id = %s",
                                (n, queue_id))
                await c.execute("UPDATE application_usage SET unfinished = unfinished + %s WHERE application_id = %s",
                                (n, application_id))
                await conn.commit()
                done += n
    finally:
        conn.close()
    return time.perf_counter() - t0


