"""The database's own ceiling on this machine, measured next to Orbit in the same run.

    python -m bench._ceiling --database-url mysql://root@127.0.0.1:3306/scratch --mode single --connections 16 --seconds 5

`single`: every connection commits one-row INSERTs (autocommit: one durable
commit per row). `batch`: every connection inserts 500-row multi-row INSERTs,
one commit each. Prints {"rows": n, "commits": n, "seconds": s}. The suite runs
several of these processes at once so that the client is not the limit.

The table looks like a slim task row: an append-ordered key, a queue id, a
state, a small JSON payload, a timestamp and one secondary index. The suite
also runs MariaDB's own C load client (`mariadb-slap`) on the same table when
it is installed, so that the Python client's CPU is not taken for the
database's limit.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson

TABLE_DDL = ("CREATE TABLE IF NOT EXISTS ceiling (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, queue_id CHAR(32) NOT NULL, "
             "state VARCHAR(16) NOT NULL, payload TEXT NOT NULL, created_at DATETIME(6) NOT NULL, "
             "KEY ix_ceiling_queue_state (queue_id, state, id)) ENGINE=InnoDB")

PAYLOAD = '{"image": "a.png", "size": 128}'
ROW_SQL = f"('{'q' * 32}', 'WAITING', '{PAYLOAD}', NOW(6))"
INSERT = "INSERT INTO ceiling (queue_id, state, payload, created_at) VALUES "


async def _single(url: str, seconds: float, counts: list[int]) -> None:
    from bench._db import connect

    conn = await connect(url, autocommit=True)
    try:
        async with conn.cursor() as c:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                await c.execute(INSERT + "(%s, 'WAITING', %s, NOW(6))", ("q" * 32, PAYLOAD))
                counts[0] += 1
                counts[1] += 1
    finally:
        conn.close()


async def _batch(url: str, seconds: float, counts: list[int], size: int = 500) -> None:
    from bench._db import connect

    conn = await connect(url, autocommit=True)
    values = ", ".join(["(%s, 'WAITING', %s, NOW(6))"] * size)
    try:
        async with conn.cursor() as c:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                params: list[str] = []
                for _ in range(size):
                    params += ["q" * 32, PAYLOAD]
                await c.execute(INSERT + values, params)
                counts[0] += size
                counts[1] += 1
    finally:
        conn.close()


async def _main(args: argparse.Namespace) -> dict:
    counts = [0, 0]
    fn = _single if args.mode == "single" else _batch
    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(fn(args.database_url, args.seconds, counts)
                                            for _ in range(args.connections))), args.seconds + 60)
    return {"rows": counts[0], "commits": counts[1], "seconds": round(time.perf_counter() - t0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--mode", choices=("single", "batch"), required=True)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5)
    args = ap.parse_args()
    print(orjson.dumps(asyncio.run(_main(args))).decode(), flush=True)


if __name__ == "__main__":
    main()
