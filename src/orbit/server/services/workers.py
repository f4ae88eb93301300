"""What a node's worker sessions need from the store besides the dispatch commands: queues a
hello names, leases held through the node, pushes to deliver, revoked credentials."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..core.lease import ENDED
from ..store.db import Database
from ..store.queries import credentials as cred_q
from ..store.queries import leases as lease_q
from ..store.queries import queues as queue_q


@dataclass(frozen=True)
class Push:
    """Something a session must be told about one of its leases; `kind` None: nothing is left to
    tell (the flag is only cleared)."""

    lease_id: str
    session_id: str
    kind: Literal["lease_revoked", "cancel_requested"] | None
    reason: str
    task_id: str


async def missing_queues(db: Database, namespace_id: str, queue_ids: list[str]) -> list[str]:
    """Queue ids of a hello that do not exist in the credential's namespace."""
    if not queue_ids:
        return []
    rows = await db.read(lambda tx: tx.rows(queue_q.ids_in_namespace(namespace_id, sorted(set(queue_ids)))))
    found = {r["id"] for r in rows}
    return [q for q in queue_ids if q not in found]


async def leases_held(db: Database, server_node_id: str) -> int:
    """Current leases held through a server process's sessions (0 or 1: drain waits for zero)."""
    return len(await db.read(lambda tx: tx.rows(lease_q.held_by_node(server_node_id))))


async def pending_pushes(db: Database, server_node_id: str) -> list[Push]:
    """Every lease of a server process's sessions flagged for a push (to be cleared with
    `clear_pushes` once told)."""
    # Runs four times a second on every node, nearly always finding nothing: one read.
    rows = await db.read(lambda tx: tx.rows(lease_q.pending_pushes(server_node_id)))
    return [_push(r) for r in rows]


def _push(r: dict) -> Push:
    if r["state"] == ENDED:
        return Push(r["id"], r["session_id"], "lease_revoked", (r["outcome"] or "REVOKED").lower(), r["task_id"])
    if r["cancel_requested"]:
        return Push(r["id"], r["session_id"], "cancel_requested", r["cancel_reason"] or "", r["task_id"])
    return Push(r["id"], r["session_id"], None, "", r["task_id"])


async def clear_pushes(db: Database, lease_ids: list[str]) -> None:
    if lease_ids:
        await db.transaction(lambda tx: tx.defer(lease_q.clear_push_pending(lease_ids)))


async def revoked_credentials(db: Database, credential_ids: set[str]) -> set[str]:
    """The credentials among these that are revoked."""
    if not credential_ids:
        return set()
    rows = await db.read(lambda tx: tx.rows(cred_q.revoked_among(sorted(credential_ids))))
    return {r["id"] for r in rows}
