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
from ..tx import Stmt, Tx, placeholders

_INSERT_BATCH = Stmt("INSERT INTO event_batches (batch_id, namespace_id, seq, count, created_at, events) "
                     "VALUES (?, ?, ?, ?, ?, ?)")


def body(type_: str, time: datetime, resource_type: str, resource_id: str, data_json: str) -> list[Any]:
    """An event as its batch stores it: [type, time, resource type, resource id, data]."""
    return [type_, format_ts(time), resource_type, resource_id, orjson.Fragment(data_json)]


async def insert(tx: Tx, rows: Sequence[Sequence[Any]]) -> None:
    """(namespace id, type, time, resource type, resource id, data JSON) rows, with the next round
    trip: each namespace's events form one batch, numbered by the node's sequencer once the
    transaction commits (its events take consecutive seqs in the order given)."""
    by_ns: dict[str, list[list[Any]]] = {}
    for ns, type_, time, rtype, rid, data in rows:
        by_ns.setdefault(ns, []).append(body(type_, time, rtype, rid, data))
    now = rows[0][2]
    batches = {ns: new_id() for ns in by_ns}
    await tx.defer_rows(_INSERT_BATCH, [(batches[ns], ns, None, len(evs), now, orjson.dumps(evs).decode())
                                        for ns, evs in by_ns.items()])
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
