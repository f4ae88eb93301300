"""The Procrastinate peer: PostgreSQL, a no-op task.

Workers are started by bench/peers/procrastinate_runner.py as
`python -m procrastinate --app=bench.peers.procrastinate_app.app worker -q <queue>`
with the connection string in BENCH_PG_DSN.
"""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")

app = App(connector=PsycopgConnector(conninfo=DSN, min_size=1, max_size=int(os.environ.get("BENCH_PG_POOL", "10"))))


@app.task(name="bench.noop")
async def noop() -> None:
    return None


@app.task(name="bench.stamp")
async def stamp() -> None:
    """Latency comes from procrastinate_events ('deferred' -> 'started'), written with the database clock."""
    return
