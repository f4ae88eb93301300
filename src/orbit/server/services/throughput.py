"""A queue's throughput history: the sampling loop every node runs, its pruning, and the
per-bucket view the dashboard charts (`core/throughput.py` holds the rules)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..core import throughput as rules
from ..core.ids import is_id
from ..core.timefmt import format_ts
from ..errors import invalid_argument, not_found
from ..store.db import Database
from ..store.queries import throughput as samples_q
from ..store.queries import usage as usage_q
from ..store.tx import Tx
from .auth import Principal


async def sample(db: Database) -> int:
    """Sample the queues whose counters moved (or that need a baseline) into the current
    bucket; returns how many samples this node wrote (another node may have written the rest)."""

    async def body(tx: Tx) -> int:
        at, stale_before = rules.sample_cutoffs(await tx.now())
        return await sample_at(tx, at, stale_before)

    return await db.transaction(body)


async def sample_at(tx: Tx, at: datetime, stale_before: datetime) -> int:
    """One sampling pass labelled `at`, in `tx`: move the heads that need it, then write their
    samples (none when no head moved); returns the samples written."""
    if not await tx.count(samples_q.move_heads(at, stale_before)):
        return 0
    return await tx.count(samples_q.sample_heads(at))


async def prune(db: Database, batch: int = 5000) -> int:
    """Delete samples older than the retention, in bounded batches."""
    total = 0
    cutoff = rules.prune_before(await db.read(lambda tx: tx.now()))
    if not await db.any_row(samples_q.any_to_prune(cutoff)):
        return 0
    while True:
        n = await db.transaction(lambda tx: tx.count(samples_q.prune(cutoff, batch)))
        total += n
        if n < batch:
            return total


def _counts(t: rules.Totals) -> dict[str, str]:
    return {"started": str(t.started), "succeeded": str(t.succeeded), "failed": str(t.failed)}


def _totals(row: Any) -> rules.Totals:
    return rules.Totals(int(row["started_total"]), int(row["succeeded_total"]), int(row["failed_total"]))


async def queue_throughput(db: Database, principal: Principal, queue_id: str,
                           minutes: int = rules.DEFAULT_MINUTES) -> dict[str, Any]:
    """Starts, successes and failures per 5-second bucket over the last `minutes`, with the
    live cumulative counters, at the database clock."""
    if not rules.MIN_MINUTES <= minutes <= rules.MAX_MINUTES:
        raise invalid_argument(f"minutes: between {rules.MIN_MINUTES} and {rules.MAX_MINUTES}", "minutes")
    if not is_id(queue_id) or not principal.can_see_queue(queue_id):
        raise not_found("queue")

    async def read(tx: Tx) -> dict[str, Any]:
        queue = await tx.one(samples_q.queue_born(principal.namespace_id, queue_id))
        if queue is None:
            raise not_found("queue")
        now = queue["db_now"]
        buckets = rules.window(now, minutes)
        # The samples first, then the live counters: those are never behind a sample read.
        rows = await tx.rows(samples_q.of_queue(queue_id, buckets[0], now))
        (usage,) = await tx.rows(usage_q.queue_rows([queue_id]))
        live = _totals(usage)
        points = rules.points([rules.Sample(r["at"], _totals(r)) for r in rows], live, now, minutes,
                              young=rules.is_young(queue["created_at"], now))
        return {
            "queue_id": queue_id,
            "at": format_ts(now),
            "interval_seconds": int(rules.INTERVAL.total_seconds()),
            "totals": _counts(live),
            "points": [{"at": format_ts(p.at), **_counts(p.counts)} for p in points],
        }

    return await db.read(read)
