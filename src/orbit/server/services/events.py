"""The event feed: numbering committed events per namespace, reading them by `seq`, retention.

Why a reader never sees a gap filled later: writers insert events with `seq` NULL in the
transaction of their change. A sequencer pass takes the namespace's `event_sequencers` row
FOR UPDATE SKIP LOCKED, reads the namespace's unnumbered events — a plain read, so only
committed ones — and gives them, in id order, the next consecutive seqs after `last_seq`,
all in one transaction. Passes of one namespace are serialised by that row, so seqs are
handed out in the order the passes commit, each larger than every seq before it. An
event whose transaction commits late (it started early, or on a slow node) is simply
numbered by a later pass, with a larger seq. A reader only returns events with
`seq <= last_seq` as it read it: every one of those was numbered by a committed pass,
so nothing can later appear below a cursor it has handed out.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime, timedelta
from typing import Any

import orjson

from ..core.timefmt import format_ts
from ..errors import DomainError, invalid_argument
from ..store.db import Database
from ..store.queries import events as ev_q
from ..store.tx import Tx
from .auth import Principal

NUMBER_BATCH = 1000
MAX_LIMIT, DEFAULT_LIMIT, MAX_WAIT_MS = 1000, 100, 30_000
_TYPE = re.compile(r"^[a-z_]+\.(\*|[a-z_]+)$")


# ---------------------------------------------------------------- numbering


async def number_namespace(db: Database, namespace_id: str) -> int:
    """Number the namespace's committed, unnumbered events (in passes of up to 1000); 0 when
    another node's pass holds the namespace (it numbers them)."""
    total = 0
    while True:
        n = await db.transaction(lambda tx: _pass(tx, namespace_id))
        total += max(n, 0)
        if n < NUMBER_BATCH:
            return total


async def _pass(tx: Tx, namespace_id: str) -> int:
    rows = await tx.rows(ev_q.lock_sequencer(namespace_id))
    if not rows:
        if await tx.rows(ev_q.sequencer(namespace_id)):
            return -1  # another pass holds it
        await tx.count(ev_q.create_sequencer(namespace_id))
        rows = await tx.rows(ev_q.lock_sequencer(namespace_id))
        if not rows:
            return -1
    last = int(rows[0]["last_seq"])
    ids = [int(r["id"]) for r in await tx.rows(ev_q.unnumbered(namespace_id, NUMBER_BATCH))]
    if ids:
        await tx.defer(ev_q.number(ids, last + 1))
    n = len(ids)
    if n:
        await tx.defer(ev_q.advance_sequencer(namespace_id, last + n, await tx.now()))
    return n


class Sequencer:
    """A node's numbering loop: namespaces its own transactions wrote events to are numbered at
    once (`written`, wired to `Database.on_events_written`); every namespace at least every
    `sweep_s` seconds, for events another node committed and did not number (it stopped)."""

    def __init__(self, db: Database, sweep_s: float = 2.0) -> None:
        self.db = db
        self.sweep_s = sweep_s
        self.wake = asyncio.Event()
        self._pending: set[str] = set()
        self._swept_at = 0.0
        self._numbered: dict[str, asyncio.Event] = {}

    def written(self, namespace_ids: set[str]) -> None:
        self._pending.update(namespace_ids)
        self.wake.set()

    async def run_once(self) -> None:
        pending, self._pending = self._pending, set()
        if time.monotonic() - self._swept_at >= self.sweep_s:
            self._swept_at = time.monotonic()
            pending |= {r["id"] for r in await self.db.read(lambda tx: tx.rows(ev_q.namespaces_with_unnumbered()))}
        for ns in sorted(pending):
            if await number_namespace(self.db, ns):
                self.numbered(ns)

    def numbered(self, namespace_id: str) -> None:
        """Wake this node's long polls of the namespace."""
        event = self._numbered.pop(namespace_id, None)
        if event is not None:
            event.set()

    async def wait(self, namespace_id: str, timeout: float) -> None:
        event = self._numbered.setdefault(namespace_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            pass


# ---------------------------------------------------------------- the feed


def parse_types(values: list[str]) -> tuple[list[str], list[str]]:
    """`type=a.b` (repeatable or comma-separated; `schedule.*` for a family): exact types and prefixes."""
    exact: list[str] = []
    prefixes: list[str] = []
    for value in values:
        for t in filter(None, (v.strip() for v in value.split(","))):
            if not _TYPE.match(t):
                raise invalid_argument(f"type: {t!r} is not an event type (like task.succeeded or schedule.*)",
                                       "type")
            if t.endswith(".*"):
                prefixes.append(t[:-1])
            else:
                exact.append(t)
    return exact, prefixes


def _event_json(row: Any) -> dict[str, Any]:
    return {"seq": str(int(row["seq"])), "type": row["type"], "time": format_ts(row["time"]),
            "resource_type": row["resource_type"], "resource_id": row["resource_id"],
            "data": orjson.Fragment(row["data"])}


async def read_events(db: Database, principal: Principal, sequencer: Sequencer | None, *, after: int, limit: int,
                      wait_ms: int, types: list[str]) -> dict[str, Any]:
    """Events with `seq > after`, oldest first; waits up to `wait_ms` for one when none is newer.
    `next_after` is the cursor to persist: past every event read, and past every event of other
    types up to the newest numbered one."""
    exact, prefixes = parse_types(types)
    deadline = time.monotonic() + wait_ms / 1000
    ns = principal.namespace_id
    while True:
        async def read(tx: Tx) -> tuple[list[dict[str, Any]], int]:
            seq = await tx.rows(ev_q.sequencer(ns))
            last, pruned = (int(seq[0]["last_seq"]), int(seq[0]["pruned_through"])) if seq else (0, 0)
            if after < pruned:
                raise DomainError("CURSOR_EXPIRED", "events after this cursor are no longer retained; "
                                  "restart from after=" + str(pruned), details={"pruned_through": str(pruned)})
            rows = await tx.rows(ev_q.page(ns, after, last, limit, exact, prefixes)) if last > after else []
            return rows, last

        rows, last = await db.read(read)
        remaining = deadline - time.monotonic()
        if rows or remaining <= 0:
            break
        if sequencer is not None:
            await sequencer.wait(ns, min(remaining, 0.25))
        else:
            await asyncio.sleep(min(remaining, 0.25))
    items = [_event_json(r) for r in rows]
    next_after = int(rows[-1]["seq"]) if len(rows) == limit else max(after, last)
    return {"items": items, "next_after": str(next_after)}


# ---------------------------------------------------------------- retention


async def prune(db: Database, *, retention: timedelta, max_rows: int, batch: int = 1000) -> int:
    """Delete each namespace's oldest events beyond the retention period (database clock) or the
    row budget, in bounded batches; `pruned_through` moves with them (older cursors get 410)."""
    deleted = 0
    for s in await db.read(lambda tx: tx.rows(ev_q.sequencers())):
        ns, last, pruned = s["namespace_id"], int(s["last_seq"]), int(s["pruned_through"])
        while True:
            async def oldest(tx: Tx, after: int = pruned) -> tuple[list[dict[str, Any]], datetime]:
                return await tx.rows(ev_q.oldest(ns, after, batch)), await tx.now()

            rows, now = await db.read(oldest)
            through = _prunable(rows, pruned, last - max_rows, now - retention)
            if through == pruned:
                break
            await db.transaction(lambda tx, a=pruned, b=through: _delete(tx, ns, a, b))
            deleted += through - pruned
            pruned = through
            if len(rows) < batch:
                break
    return deleted


def _prunable(rows: list[dict[str, Any]], pruned: int, over_budget: int, cutoff: datetime) -> int:
    """The largest seq of the oldest events (in seq order) that are all past the budget or the age."""
    through = pruned
    for r in rows:
        if int(r["seq"]) > over_budget and r["time"] >= cutoff:
            break
        through = int(r["seq"])
    return through


async def _delete(tx: Tx, namespace_id: str, after: int, through: int) -> None:
    await tx.defer(ev_q.delete_through(namespace_id, after, through))
    await tx.defer(ev_q.set_pruned(namespace_id, through))
