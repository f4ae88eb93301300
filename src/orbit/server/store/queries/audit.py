"""Audit records: who changed what, through which request, with the state before and after."""

from __future__ import annotations

from typing import Any

from ..tx import Stmt

COLUMNS = ("id", "namespace_id", "time", "actor_credential_id", "actor", "action", "resource_type", "resource_id",
           "reason", "request_id", "idempotency_key", "before", "after")


def insert(values: dict[str, Any]) -> Stmt:
    # `before` is a reserved word in MariaDB; SQLite takes backticks too.
    columns = ", ".join(f"`{c}`" for c in COLUMNS)
    return Stmt(f"INSERT INTO audit_records ({columns}) VALUES ({', '.join('?' * len(COLUMNS))})",
                [values.get(c) for c in COLUMNS])


_READ_COLUMNS = ", ".join(f"`{c}`" for c in COLUMNS if c != "namespace_id")


def page(namespace_id: str, *, resource_id: str | None, action: str | None, after_id: str | None, limit: int
         ) -> Stmt:
    """Up to `limit` records of the namespace after `after_id`, oldest first (ids are time-ordered). Each
    filter has an index ending in `id`: (resource_id, id), (namespace_id, action, id), (namespace_id, id)."""
    where = ["namespace_id = ?"]
    params: list[Any] = [namespace_id]
    if resource_id is not None:
        where.append("resource_id = ?")
        params.append(resource_id)
    if action is not None:
        where.append("action = ?")
        params.append(action)
    if after_id is not None:
        where.append("id > ?")
        params.append(after_id)
    params.append(limit)
    return Stmt(f"SELECT {_READ_COLUMNS} FROM audit_records WHERE {' AND '.join(where)} ORDER BY id LIMIT ?", params)
