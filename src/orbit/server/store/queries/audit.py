"""Audit records: who changed what, through which request, with the state before and after."""

from __future__ import annotations

from typing import Any

from ..tx import Stmt

COLUMNS = ("id", "namespace_id", "time", "actor_credential_id", "actor", "action", "resource_type", "resource_id",
           "reason", "request_id", "idempotency_key", "before", "after")


# The next number of a namespace's audit log. The row stays locked until the commit, so the
# transactions of a namespace that write audit records take their numbers in commit order.
_NEXT_SEQ = ("INSERT INTO audit_sequencers (namespace_id, last_seq) VALUES (?, 1) "
             "ON DUPLICATE KEY UPDATE last_seq = last_seq + 1")
_NEXT_SEQ_SQLITE = ("INSERT INTO audit_sequencers (namespace_id, last_seq) VALUES (?, 1) "
                    "ON CONFLICT (namespace_id) DO UPDATE SET last_seq = last_seq + 1")


def insert(values: dict[str, Any]) -> list[Stmt]:
    """The record, numbered in its namespace's log (a record without a namespace has no number)."""
    # `before` is a reserved word in MariaDB; SQLite takes backticks too.
    head = f"INSERT INTO audit_records ({', '.join(f'`{c}`' for c in (*COLUMNS, 'seq'))}) " \
           f"VALUES ({', '.join('?' * len(COLUMNS))}, "
    params = [values.get(c) for c in COLUMNS]
    namespace_id = values.get("namespace_id")
    if namespace_id is None:
        return [Stmt(head + "NULL)", params)]
    return [Stmt(_NEXT_SEQ, (namespace_id,), sqlite=_NEXT_SEQ_SQLITE),
            Stmt(head + "(SELECT last_seq FROM audit_sequencers WHERE namespace_id = ?))", [*params, namespace_id])]


_READ_COLUMNS = ", ".join(f"`{c}`" for c in COLUMNS if c != "namespace_id")


def page(namespace_id: str, *, resource_id: str | None, action: str | None, after_id: str | None, limit: int
         ) -> Stmt:
    """Up to `limit` records of the namespace after the record `after_id`, in commit order (`seq`). An id
    that names no record of the namespace stands for the last record whose id is not above it (ids are
    time-ordered). Each filter has an index ending in `seq`: (resource_id, seq), (namespace_id, action,
    seq), (namespace_id, seq)."""
    where = ["namespace_id = ?"]
    params: list[Any] = [namespace_id]
    if resource_id is not None:
        where.append("resource_id = ?")
        params.append(resource_id)
    if action is not None:
        where.append("action = ?")
        params.append(action)
    if after_id is not None:
        where.append("seq > COALESCE((SELECT seq FROM audit_records WHERE id = ? AND namespace_id = ?), "
                     "(SELECT COALESCE(MAX(seq), 0) FROM audit_records WHERE namespace_id = ? AND id <= ?))")
        params += [after_id, namespace_id, namespace_id, after_id]
    params.append(limit)
    return Stmt(f"SELECT {_READ_COLUMNS} FROM audit_records WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?",
                params)
