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
