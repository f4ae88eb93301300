"""The outbox and the event feed: events written in the transaction of the change they describe,
numbered afterwards per namespace by the sequencer (`event_sequencers`), read by `seq`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..tx import Stmt, Tx, placeholders

_INSERT = Stmt("INSERT INTO events (namespace_id, type, time, resource_type, resource_id, data) "
               "VALUES (?, ?, ?, ?, ?, ?)")


async def insert(tx: Tx, rows: Sequence[Sequence[Any]]) -> None:
    """(namespace id, type, time, resource type, resource id, data JSON) rows, with the next round
    trip; their namespaces are numbered by the node's sequencer once the transaction commits."""
    await tx.defer_rows(_INSERT, rows)
    tx.events_written.update(r[0] for r in rows)


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
    """Committed events of the namespace without a seq, in id order (a plain read sees only
    committed rows: one still in flight is numbered by a later pass)."""
    return Stmt("SELECT id FROM events WHERE namespace_id = ? AND seq IS NULL ORDER BY id LIMIT ?",
                (namespace_id, limit))


def number(ids: list[int], first_seq: int) -> Stmt:
    """Consecutive seqs from `first_seq` to the events `ids` (ascending)."""
    cases = " ".join("WHEN ? THEN ?" for _ in ids)
    params: list[Any] = [v for i, event_id in enumerate(ids) for v in (event_id, first_seq + i)]
    return Stmt(f"UPDATE events SET seq = CASE id {cases} END WHERE id IN ({placeholders(len(ids))})",
                [*params, *ids])


def advance_sequencer(namespace_id: str, last_seq: int, now: datetime) -> Stmt:
    return Stmt("UPDATE event_sequencers SET last_seq = ?, numbered_at = ? WHERE namespace_id = ?",
                (last_seq, now, namespace_id))


def namespaces_with_unnumbered() -> Stmt:
    """Namespaces that have events still to number (one index dive per namespace)."""
    return Stmt("SELECT n.id FROM namespaces n WHERE EXISTS (SELECT 1 FROM events e WHERE e.namespace_id = n.id "
                "AND e.seq IS NULL)")


# ---------------------------------------------------------------- the feed


def page(namespace_id: str, after: int, through: int, limit: int, types: Sequence[str] = (),
         prefixes: Sequence[str] = ()) -> Stmt:
    """Numbered events of the namespace with `after < seq <= through`, in seq order."""
    where = ["namespace_id = ?", "seq > ?", "seq <= ?"]
    params: list[Any] = [namespace_id, after, through]
    kinds = []
    if types:
        kinds.append(f"type IN ({placeholders(len(types))})")
        params.extend(types)
    for p in prefixes:
        kinds.append("type LIKE ?")
        params.append(p + "%")
    if kinds:
        where.append("(" + " OR ".join(kinds) + ")")
    params.append(limit)
    return Stmt("SELECT seq, type, time, resource_type, resource_id, data FROM events "
                f"WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?", params)


# ---------------------------------------------------------------- retention


def sequencers() -> Stmt:
    return Stmt("SELECT namespace_id, last_seq, pruned_through FROM event_sequencers")


def oldest(namespace_id: str, after: int, limit: int) -> Stmt:
    return Stmt("SELECT seq, time FROM events WHERE namespace_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (namespace_id, after, limit))


def delete_through(namespace_id: str, after: int, through: int) -> Stmt:
    return Stmt("DELETE FROM events WHERE namespace_id = ? AND seq > ? AND seq <= ?", (namespace_id, after, through))


def set_pruned(namespace_id: str, through: int) -> Stmt:
    return Stmt("UPDATE event_sequencers SET pruned_through = ? WHERE namespace_id = ? AND pruned_through < ?",
                (through, namespace_id, through))
