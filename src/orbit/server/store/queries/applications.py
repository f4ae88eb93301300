"""Applications and their namespaces (tenancy; their live counters are in `application_usage`)."""

from __future__ import annotations

from typing import Any

from ..tx import Stmt, placeholders

COLUMNS = ("id", "name", "paused", "max_concurrency", "rate_per_second", "max_unfinished_tasks", "revision",
           "created_at", "updated_at")
NAMESPACE_COLUMNS = ("id", "application_id", "name", "environment", "created_at")
_COLS = ", ".join(COLUMNS)
_NS_COLS = ", ".join(NAMESPACE_COLUMNS)


def by_name(name: str) -> Stmt:
    return Stmt(f"SELECT {_COLS} FROM applications WHERE name = ?", (name,))


def by_name_or_id(ref: str) -> Stmt:
    return Stmt(f"SELECT {_COLS} FROM applications WHERE name = ? OR id = ?", (ref, ref))


def insert(row: dict[str, Any]) -> Stmt:
    return Stmt(f"INSERT INTO applications ({_COLS}) VALUES ({placeholders(len(COLUMNS))})",
                [row[c] for c in COLUMNS])


def namespace_by_name(application_id: str, name: str) -> Stmt:
    return Stmt(f"SELECT {_NS_COLS} FROM namespaces WHERE application_id = ? AND name = ?", (application_id, name))


def namespace_by_name_or_id(application_id: str, ref: str) -> Stmt:
    return Stmt(f"SELECT {_NS_COLS} FROM namespaces WHERE application_id = ? AND (name = ? OR id = ?)",
                (application_id, ref, ref))


def insert_namespace(row: dict[str, Any]) -> Stmt:
    return Stmt(f"INSERT INTO namespaces ({_NS_COLS}) VALUES ({placeholders(len(NAMESPACE_COLUMNS))})",
                [row[c] for c in NAMESPACE_COLUMNS])


# ---------------------------------------------------------------- quotas


def with_usage(application_id: str) -> Stmt:
    """The application and its live counters."""
    return Stmt("SELECT a.*, au.unfinished, au.permits_in_use FROM applications a "
                "JOIN application_usage au ON au.application_id = a.id WHERE a.id = ?", (application_id,))


def lock_for_update(application_id: str) -> Stmt:
    return Stmt("SELECT * FROM applications WHERE id = ?{FOR_UPDATE}", (application_id,))


def configure(application_id: str, values: dict[str, Any]) -> Stmt:
    """Set these columns (every quota, the revision and `updated_at`)."""
    return Stmt(f"UPDATE applications SET {', '.join(f'{c} = ?' for c in values)} WHERE id = ?",
                [*values.values(), application_id])
