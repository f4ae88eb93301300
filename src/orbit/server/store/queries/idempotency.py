"""Idempotency records (one per namespace, operation and key) and their retention, with the
workers' claim receipts (`worker_claims`), which are kept as long."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..dialect import RetryTransaction, is_duplicate_key
from ..tx import Stmt, Tx, placeholders
from .bulk import insert_once

_INSERT = Stmt("INSERT INTO idempotency_records (namespace_id, operation, idem_key, digest, resource_id, response, "
               "created_at) VALUES (?, ?, ?, ?, ?, ?, ?)")


def lookup(namespace_id: str, operation: str, key: str) -> Stmt:
    return Stmt("SELECT digest, response, resource_id FROM idempotency_records "
                "WHERE namespace_id = ? AND operation = ? AND idem_key = ?", (namespace_id, operation, key))


def receipts(namespace_id: str, operation: str, keys: list[str]) -> Stmt:
    """The records of several keys of one operation."""
    return Stmt("SELECT idem_key, digest, response, resource_id FROM idempotency_records "
                f"WHERE namespace_id = ? AND operation = ? AND idem_key IN ({placeholders(len(keys))})",
                (namespace_id, operation, *keys))


async def reserve(tx: Tx, namespace_id: str, operation: str, key: str, digest: str, now: datetime) -> None:
    """Insert the placeholder now; a concurrent holder of the key makes the transaction run again
    (it then waits for that holder and finds its record)."""
    try:
        await tx.count(Stmt("INSERT INTO idempotency_records (namespace_id, operation, idem_key, digest, created_at) "
                            "VALUES (?, ?, ?, ?, ?)", (namespace_id, operation, key, digest, now)))
    except Exception as exc:
        if is_duplicate_key(exc):
            raise RetryTransaction() from exc
        raise


def record(namespace_id: str, operation: str, key: str, response: str, resource_id: str | None) -> Stmt:
    """Fill in the reserved placeholder."""
    return Stmt("UPDATE idempotency_records SET response = ?, resource_id = ? "
                "WHERE namespace_id = ? AND operation = ? AND idem_key = ?",
                (response, resource_id, namespace_id, operation, key))


async def insert(tx: Tx, rows: Sequence[Sequence[Any]]) -> None:
    """Finished records (namespace, operation, key, digest, resource id, response, created at) with
    the next round trip, for keys found free earlier in the transaction; a key another request
    took meanwhile makes the transaction run again and replay it."""
    await insert_once(tx, _INSERT, rows, deferred=True)


def delete(namespace_id: str, operation: str, key: str) -> Stmt:
    return Stmt("DELETE FROM idempotency_records WHERE namespace_id = ? AND operation = ? AND idem_key = ?",
                (namespace_id, operation, key))


def _prune(table: str, cutoff: datetime, limit: int) -> Stmt:
    return Stmt(f"DELETE FROM {table} WHERE created_at < ? LIMIT ?", (cutoff, limit),
                sqlite=f"DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE created_at < ? LIMIT ?)")


def prune_records(cutoff: datetime, limit: int) -> Stmt:
    """Up to `limit` records created before `cutoff`."""
    return _prune("idempotency_records", cutoff, limit)


def prune_worker_claims(cutoff: datetime, limit: int) -> Stmt:
    """Up to `limit` claim receipts created before `cutoff`."""
    return _prune("worker_claims", cutoff, limit)
