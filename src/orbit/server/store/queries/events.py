"""The outbox and the event feed: events written in the transaction of the change they describe,
numbered afterwards per namespace by the sequencer (`event_sequencers`), read by `seq`.

A transaction's events of one namespace are one `event_batches` row, their bodies a JSON array
in seq order: one row written per write rather than one per event."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson

from ...core.ids import new_id
from ...core.timefmt import format_ts
from ..tx import Revisable, Stmt, Tx, placeholders

_INSERT_BATCHES = "INSERT INTO event_batches (batch_id, namespace_id, seq, count, created_at, events) VALUES "


def body(type_: str, time: datetime, resource_type: str, resource_id: str, data_json: str) -> list[Any]:
    """An event as its batch stores it: [type, time, resource type, resource id, data]."""
    return [type_, format_ts(time), resource_type, resource_id, orjson.Fragment(data_json)]


class _OpenBatches:
    """Batches a transaction deferred and may still add to: per namespace, its id and events."""

    __slots__ = ("batches", "created_at", "handle")

    def __init__(self, batches: dict[str, tuple[str, list[list[Any]]]], created_at: datetime,
                 handle: Revisable | None) -> None:
        self.batches = batches
        self.created_at = created_at
        self.handle = handle


def _insert_batches(batches: dict[str, tuple[str, list[list[Any]]]], created_at: datetime) -> Stmt:
    rows = [(batch_id, ns, None, len(evs), created_at, orjson.dumps(evs).decode())
            for ns, (batch_id, evs) in batches.items()]
    return Stmt(_INSERT_BATCHES + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(rows)), [v for r in rows for v in r])


def _add(batches: dict[str, tuple[str, list[list[Any]]]], rows: Sequence[Sequence[Any]]) -> None:
    for ns, type_, time, rtype, rid, data in rows:
        if ns not in batches:
            batches[ns] = (new_id(), [])
        batches[ns][1].append(body(type_, time, rtype, rid, data))


async def insert(tx: Tx, rows: Sequence[Sequence[Any]]) -> None:
    """(namespace id, type, time, resource type, resource id, data JSON) rows, with the next round
    trip: each namespace's events form one batch, numbered by the node's sequencer once the
    transaction commits (its events take consecutive seqs in the order given). Events that a
    later step of the transaction gives before that round trip join the same batches."""
    now = rows[0][2]
    opened: _OpenBatches | None = tx.open_events
    if opened is not None and opened.created_at == now:
        batches = {ns: (batch_id, list(evs)) for ns, (batch_id, evs) in opened.batches.items()}
        _add(batches, rows)
        if tx.revise(opened.handle, _insert_batches(batches, now)):
            opened.batches = batches
            tx.events_written.update(batches)
            return
    batches = {}
    _add(batches, rows)
    tx.open_events = _OpenBatches(batches, now, await tx.defer_revisable(_insert_batches(batches, now)))
    tx.events_written.update(batches)


# ---------------------------------------------------------------- numbering


def sequencer(namespace_id: str) -> Stmt:
    return Stmt("SELECT last_seq, pruned_through FROM event_sequencers WHERE namespace_id = ?", (namespace_id,))


def lock_sequencer(namespace_id: str) -> Stmt:
    """The namespace's sequencer row, unless another pass holds it (that pass numbers the events)."""
    return Stmt("SELECT last_seq FROM event_sequencers WHERE namespace_id = ?{SKIP_LOCKED}", (namespace_id,))


def create_sequencer(namespace_id: str) -> Stmt:
    sql = "INTO event_sequencers (namespace_id, last_seq, pruned_through) VALUES (?, 0, 0)"
    return Stmt(f"INSERT IGNORE {sql}", (namespace_id,), sqlite=f"INSERT OR IGNORE {sql}")


def unnumbered(namespace_id: str, limit: int) -> Stmt:
    """Committed batches of the namespace without a seq, oldest first (a plain read sees only
    committed rows: a batch still in flight is numbered by a later pass)."""
    return Stmt("SELECT batch_id, count FROM event_batches WHERE namespace_id = ? AND seq IS NULL "
                "ORDER BY batch_id LIMIT ?", (namespace_id, limit))


def number(first_seqs: dict[str, int]) -> Stmt:
    """Each batch's first seq."""
    ids = sorted(first_seqs)
    cases = " ".join("WHEN ? THEN ?" for _ in ids)
    params: list[Any] = [v for b in ids for v in (b, first_seqs[b])]
    return Stmt(f"UPDATE event_batches SET seq = CASE batch_id {cases} END "
                f"WHERE batch_id IN ({placeholders(len(ids))})", [*params, *ids])


def advance_sequencer(namespace_id: str, last_seq: int) -> Stmt:
    return Stmt("UPDATE event_sequencers SET last_seq = ?, numbered_at = {NOW} WHERE namespace_id = ?",
                (last_seq, namespace_id))


def namespaces_with_unnumbered() -> Stmt:
    """Namespaces that have batches still to number (one index dive per namespace)."""
    return Stmt("SELECT n.id FROM namespaces n WHERE EXISTS (SELECT 1 FROM event_batches b "
                "WHERE b.namespace_id = n.id AND b.seq IS NULL)")


# ---------------------------------------------------------------- the feed


def page(namespace_id: str, after: int, through: int) -> Stmt:
    """The batches holding the events numbered `after < seq <= through`, in seq order (a batch's
    events follow its first seq in the order of its array)."""
    return Stmt("SELECT seq AS first_seq, events FROM event_batches "
                "WHERE namespace_id = ? AND seq IS NOT NULL AND seq <= ? AND seq + count > ? "
                "ORDER BY seq", (namespace_id, through, after))


# ---------------------------------------------------------------- retention


def sequencers() -> Stmt:
    return Stmt("SELECT namespace_id, last_seq, pruned_through FROM event_sequencers")


def oldest(namespace_id: str, after: int, limit: int) -> Stmt:
    """The oldest numbered batches after `after` (their first seq, size and time)."""
    return Stmt("SELECT batch_id, seq, count, created_at FROM event_batches WHERE namespace_id = ? AND seq > ? "
                "ORDER BY seq LIMIT ?", (namespace_id, after, limit))


def delete_batches(batch_ids: list[str]) -> list[Stmt]:
    return [Stmt(f"DELETE FROM event_batches WHERE batch_id IN ({placeholders(len(batch_ids))})", batch_ids)]


def set_pruned(namespace_id: str, through: int) -> Stmt:
    return Stmt("UPDATE event_sequencers SET pruned_through = ? WHERE namespace_id = ? AND pruned_through < ?",
                (through, namespace_id, through))
