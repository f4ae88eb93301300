"""The outbox: events written in the transaction of the change they describe."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..tx import Stmt, Tx

_INSERT = Stmt("INSERT INTO events (namespace_id, type, time, resource_type, resource_id, data) "
               "VALUES (?, ?, ?, ?, ?, ?)")


async def insert(tx: Tx, rows: Sequence[Sequence[Any]]) -> None:
    """(namespace id, type, time, resource type, resource id, data JSON) rows, with the next round trip."""
    await tx.defer_rows(_INSERT, rows)
