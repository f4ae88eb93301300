"""Claim receipts (`worker_claims`): what a claim granted, kept per (credential, message id)
so that a resent claim is answered with the original leases."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..dialect import RetryTransaction, is_duplicate_key
from ..tx import Stmt, Tx

_INSERT = Stmt("INSERT INTO worker_claims (credential_id, msg_id, response, created_at) VALUES (?, ?, ?, ?)")


async def insert(tx: Tx, rows: Sequence[Sequence[Any]], *, deferred: bool) -> None:
    """(credential id, message id, response, created at) receipts, now or (`deferred`) with the
    next round trip. The same message claimed meanwhile by another transaction fails the insert
    on the primary key (here or with the round trip that carries it): the transaction then runs
    again and replays that claim."""
    tx.duplicate_key_means(RetryTransaction)
    if deferred:
        await tx.defer_rows(_INSERT, rows)
        return
    try:
        await tx.insert_rows(_INSERT, rows)
    except Exception as exc:
        if is_duplicate_key(exc):
            raise RetryTransaction() from exc
        raise


def receipts(keys: list[tuple[str, str]]) -> Stmt:
    """The receipts of these (credential id, message id) pairs."""
    return Stmt("SELECT credential_id, msg_id, response FROM worker_claims WHERE "
                + " OR ".join("(credential_id = ? AND msg_id = ?)" for _ in keys), [v for k in keys for v in k])
