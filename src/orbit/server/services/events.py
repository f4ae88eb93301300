"""The event feed: numbering committed events per namespace, reading them by `seq`, retention.

Why a reader never sees a gap filled later: a transaction writes its events of a namespace
as one batch (`event_batches`, `seq` NULL). A sequencer pass takes the namespace's
`event_sequencers` row FOR UPDATE SKIP LOCKED, reads the namespace's unnumbered batches — a
plain read, so only committed ones — and gives each the next consecutive seqs after
`last_seq` (its events follow the batch's first seq in id order), all in one transaction.
Passes of one namespace are serialised by that row, so seqs are handed out in the order the
passes commit, each larger than every seq before it. A batch whose transaction commits late
(it started early, or on a slow node) is simply numbered by a later pass, with larger seqs.
A reader only returns events with `seq <= last_seq` as it read it: every one of those was
numbered by a committed pass, so nothing can later appear below a cursor it has handed out.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime, timedelta
from typing import Any, Protocol

import orjson

from ..errors import DomainError, invalid_argument
from ..store.db import Database
from ..store.queries import events as ev_q
from ..store.tx import Tx
from .auth import Principal

NUMBER_BATCH = 1000
# How long a node lets events written by its transactions gather before it numbers them.
COALESCE_S = 0.02
MAX_LIMIT, DEFAULT_LIMIT, MAX_WAIT_MS = 1000, 100, 30_000
_ONE_TYPE = r"[a-z_]+\.(\*|[a-z_]+)"
# A `type` parameter: one or more event types (a family as `schedule.*`), separated by commas.
TYPES_PATTERN = f"^ *{_ONE_TYPE} *(, *{_ONE_TYPE} *)*$"
_TYPES = re.compile(TYPES_PATTERN.replace("$", r"\Z"))


# ---------------------------------------------------------------- numbering


async def number_namespace(db: Database, namespace_id: str) -> int:
    """Number the namespace's committed, unnumbered event batches (up to 1000 a pass); 0 when
    another node's pass holds the namespace (it numbers them)."""
    total = 0
    while True:
        n = await db.transaction(lambda tx: _pass(tx, namespace_id))
        total += max(n, 0)
        if n < NUMBER_BATCH:
            return total


async def _pass(tx: Tx, namespace_id: str) -> int:
    """One pass in two round trips: the sequencer row's lock and the unnumbered batches read after
    it, then the numbering with the commit."""
    rows, batches = await tx.rows_multi([ev_q.lock_sequencer(namespace_id),
                                         ev_q.unnumbered(namespace_id, NUMBER_BATCH)])
    if not rows:
        if await tx.rows(ev_q.sequencer(namespace_id)):
            return -1  # another pass holds it (its batches were read in vain)
        await tx.count(ev_q.create_sequencer(namespace_id))
        rows = await tx.rows(ev_q.lock_sequencer(namespace_id))
        if not rows:
            return -1
        batches = await tx.rows(ev_q.unnumbered(namespace_id, NUMBER_BATCH))
    last = int(rows[0]["last_seq"])
    if not batches:
        return 0
    first: dict[str, int] = {}
    for b in batches:
        first[b["batch_id"]] = last + 1
        last += int(b["count"])
    await tx.defer(ev_q.number(first))
    await tx.defer(ev_q.advance_sequencer(namespace_id, last))
    return len(batches)


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
        if self._pending:
            # The transactions of one task's path (submit, claim, Start, report) come a few ms
            # apart: one pass numbers them all, rather than a transaction after each.
            await asyncio.sleep(COALESCE_S)
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


class Waiter(Protocol):
    """What a long poll waits on between reads: the `Sequencer` (woken when it numbers events of
    the namespace), or a wrapper of it."""

    async def wait(self, namespace_id: str, timeout: float) -> None: ...


def parse_types(values: list[str]) -> tuple[list[str], list[str]]:
    """`type=a.b` (repeatable or comma-separated; `schedule.*` for a family): exact types and prefixes."""
    exact: list[str] = []
    prefixes: list[str] = []
    for value in values:
        if not _TYPES.match(value):
            raise invalid_argument(f"type: {value!r} is not a comma-separated list of event types (like "
                                   "task.succeeded or schedule.*)", "type")
        for t in (v.strip(" ") for v in value.split(",")):
            if t.endswith(".*"):
                prefixes.append(t[:-1])
            else:
                exact.append(t)
    return exact, prefixes


def _numbered(rows: list[dict[str, Any]], after: int) -> list[tuple[int, list[Any]]]:
    """Each event of these batches with its seq (its batch's first seq plus its place in the
    batch), past `after`; an event is [type, time, resource type, resource id, data]."""
    out = []
    for r in rows:
        first = int(r["first_seq"])
        out.extend((first + i, ev) for i, ev in enumerate(orjson.loads(r["events"])) if first + i > after)
    return out


def _event_json(seq: int, ev: list[Any]) -> dict[str, Any]:
    type_, time, resource_type, resource_id, data = ev
    return {"seq": str(seq), "type": type_, "time": time, "resource_type": resource_type,
            "resource_id": resource_id, "data": data}


def _wanted(type_: str, exact: list[str], prefixes: list[str]) -> bool:
    return (not exact and not prefixes) or type_ in exact or any(type_.startswith(p) for p in prefixes)


async def read_events(db: Database, principal: Principal, sequencer: Waiter | None, *, after: int, limit: int,
                      wait_ms: int, types: list[str], tail: bool = False) -> dict[str, Any]:
    """Events with `seq > after`, oldest first; waits up to `wait_ms` for one when none is newer.
    A page looks at the next `limit` seqs at most; `next_after` is the cursor to persist: past
    every event returned, and past every event of other types it looked at. With `tail`, the
    page is the last `limit` seqs instead, so a live view starts at the newest events without
    walking the whole retained feed."""
    exact, prefixes = parse_types(types)
    deadline = time.monotonic() + wait_ms / 1000
    ns = principal.namespace_id
    while True:
        async def read(tx: Tx) -> tuple[list[tuple[int, dict[str, Any]]], int]:
            nonlocal after
            seq = await tx.rows(ev_q.sequencer(ns))
            last, pruned = (int(seq[0]["last_seq"]), int(seq[0]["pruned_through"])) if seq else (0, 0)
            if tail:
                after = max(pruned, last - limit)
            if after < pruned:
                raise DomainError("CURSOR_EXPIRED", "events after this cursor are no longer retained; "
                                  "restart from after=" + str(pruned), details={"pruned_through": str(pruned)})
            through = min(last, after + limit)
            rows = await tx.rows(ev_q.page(ns, after, through)) if through > after else []
            return [(s_, r) for s_, r in _numbered(rows, after) if s_ <= through], through

        events, through = await db.read(read)
        items = [_event_json(s_, ev) for s_, ev in events if _wanted(ev[0], exact, prefixes)]
        remaining = deadline - time.monotonic()
        if items or through > after or remaining <= 0:
            break
        if sequencer is not None:
            await sequencer.wait(ns, min(remaining, 0.25))
        else:
            await asyncio.sleep(min(remaining, 0.25))
    return {"items": items, "next_after": str(max(after, through))}


# ---------------------------------------------------------------- retention


async def prune(db: Database, *, retention: timedelta, max_rows: int, batch: int = 1000) -> int:
    """Delete each namespace's oldest event batches beyond the retention period (database clock)
    or the row budget, in bounded batches; `pruned_through` moves with them (older cursors get 410)."""
    deleted = 0
    for s in await db.read(lambda tx: tx.rows(ev_q.sequencers())):
        ns, last, pruned = s["namespace_id"], int(s["last_seq"]), int(s["pruned_through"])
        while True:
            async def oldest(tx: Tx, after: int = pruned) -> tuple[list[dict[str, Any]], datetime]:
                return await tx.rows(ev_q.oldest(ns, after, batch)), await tx.now()

            rows, now = await db.read(oldest)
            gone = _prunable(rows, last - max_rows, now - retention)
            if not gone:
                break
            through = int(gone[-1]["seq"]) + int(gone[-1]["count"]) - 1
            await db.transaction(lambda tx, ids=[g["batch_id"] for g in gone], t=through: _delete(tx, ns, ids, t))
            deleted += through - pruned
            pruned = through
            if len(rows) < batch:
                break
    return deleted


def _prunable(rows: list[dict[str, Any]], over_budget: int, cutoff: datetime) -> list[dict[str, Any]]:
    """The oldest batches (in seq order) that are wholly past the row budget or the age."""
    gone = []
    for r in rows:
        if int(r["seq"]) + int(r["count"]) - 1 > over_budget and r["created_at"] >= cutoff:
            break
        gone.append(r)
    return gone


async def _delete(tx: Tx, namespace_id: str, batch_ids: list[str], through: int) -> None:
    for stmt in ev_q.delete_batches(batch_ids):
        await tx.defer(stmt)
    await tx.defer(ev_q.set_pruned(namespace_id, through))
