"""Claim receipts (`worker_claims`): what a claim granted, kept per (credential, message id)
so that a resent claim is answered with the original leases."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..tx import Stmt, Tx
from .bulk import insert_once

_INSERT = Stmt("INSERT INTO worker_claims (credential_id, msg_id, response, created_at) VALUES (?, ?, ?, ?)")


async def insert(tx: Tx, rows: Sequence[Sequence[Any]], *, deferred: bool) -> None:
    """(credential id, message id, response, created at) receipts, now or with the next round
    trip; the same message claimed meanwhile elsewhere makes the transaction replay that claim."""
    await insert_once(tx, _INSERT, rows, deferred=deferred)


def receipts(keys: list[tuple[str, str]]) -> Stmt:
    """The receipts of these (credential id, message id) pairs."""
    return Stmt("SELECT credential_id, msg_id, response FROM worker_claims WHERE "
                + " OR ".join("(credential_id = ? AND msg_id = ?)" for _ in keys), [v for k in keys for v in k])
