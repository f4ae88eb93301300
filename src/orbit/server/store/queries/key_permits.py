"""Resource-key permits as dispatch and admission see them: limits, the keys a submit names,
parked tasks waiting for a permit, and the worker nodes claiming on a queue."""

from __future__ import annotations

from datetime import datetime

from ..tx import Stmt, placeholders


def limits(resource_key_ids: list[str]) -> Stmt:
    """The keys' permits (configuration rows, unlocked: a configure also locks the usage row, so
    read after the usage rows' locks this is current)."""
    return Stmt(f"SELECT id, max_concurrency FROM resource_keys WHERE id IN ({placeholders(len(resource_key_ids))})",
                resource_key_ids)


def share_named(namespace_id: str, names: list[str]) -> Stmt:
    """The keys a submit names, share-locked: retire and configure, which lock them exclusively,
    wait for the submit to commit, so a retired key is never newly referenced."""
    return Stmt(f"SELECT id, name, retired_at FROM resource_keys WHERE namespace_id = ? "
                f"AND name IN ({placeholders(len(names))}){{SHARE}}", (namespace_id, *names))


def rooms_named(namespace_id: str, names: list[str]) -> Stmt:
    """Unlocked: the named keys' limits and permits in use, to park a submitted task at once
    when one of its keys has no free permit."""
    return Stmt("SELECT k.name, k.max_concurrency, ku.permits_in_use FROM resource_keys k JOIN resource_key_usage ku "
                f"ON ku.resource_key_id = k.id WHERE k.namespace_id = ? AND k.name IN ({placeholders(len(names))})",
                (namespace_id, *names))


def with_free_permits_and_parked(limit: int) -> Stmt:
    """Keys with a free permit and tasks parked on them (one loose index scan over the parked)."""
    return Stmt("SELECT k.id, k.max_concurrency - ku.permits_in_use AS free FROM resource_keys k "
                "JOIN resource_key_usage ku ON ku.resource_key_id = k.id "
                "WHERE ku.permits_in_use < k.max_concurrency AND k.id IN "
                "(SELECT DISTINCT parked_on FROM tasks WHERE parked_on IS NOT NULL) LIMIT ?", (limit,))


def free_permits(resource_key_ids: list[str]) -> Stmt:
    return Stmt("SELECT k.id, k.max_concurrency - ku.permits_in_use AS free FROM resource_keys k "
                "JOIN resource_key_usage ku ON ku.resource_key_id = k.id "
                f"WHERE k.id IN ({placeholders(len(resource_key_ids))}) AND ku.permits_in_use < k.max_concurrency",
                resource_key_ids)


# ---------------------------------------------------------------- worker nodes per queue


def nodes(queue_ids: list[str]) -> Stmt:
    return Stmt(f"SELECT * FROM queue_nodes WHERE queue_id IN ({placeholders(len(queue_ids))})", queue_ids)


_NOTE_CLAIM = ("INSERT INTO queue_nodes (queue_id, worker_node_id, last_claim_at, wanting_at, in_flight) "
               "VALUES (?, ?, ?, ?, ?) ")


def note_claim(queue_id: str, node: str, now: datetime, wanting: bool, granted: int) -> Stmt:
    """A node's claim on a queue: it is active, wanting more or not, and holds `granted` more permits."""
    params = (queue_id, node, now, now if wanting else None, granted)
    return Stmt(_NOTE_CLAIM + "ON DUPLICATE KEY UPDATE last_claim_at = VALUES(last_claim_at), "
                "wanting_at = VALUES(wanting_at), in_flight = in_flight + VALUES(in_flight)", params,
                sqlite=_NOTE_CLAIM + "ON CONFLICT (queue_id, worker_node_id) DO UPDATE SET "
                "last_claim_at = excluded.last_claim_at, wanting_at = excluded.wanting_at, "
                "in_flight = in_flight + excluded.in_flight")


def described(resource_key_ids: list[str]) -> Stmt:
    """The keys' names, limits, retirement and permits in use (a task's blockers)."""
    return Stmt("SELECT k.id, k.name, k.max_concurrency, k.retired_at, ku.permits_in_use FROM resource_keys k "
                "JOIN resource_key_usage ku ON ku.resource_key_id = k.id "
                f"WHERE k.id IN ({placeholders(len(resource_key_ids))})", resource_key_ids)
