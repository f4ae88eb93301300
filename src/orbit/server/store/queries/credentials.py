"""Credentials: bearer tokens' permissions, queue scope and revocation."""

from __future__ import annotations

from ..tx import Stmt, placeholders


def by_id(credential_id: str) -> Stmt:
    return Stmt("SELECT id, application_id, namespace_id, secret_hash, permissions, queue_scope, revoked_at "
                "FROM credentials WHERE id = ?", (credential_id,))


def unrevoked(credential_ids: list[str]) -> Stmt:
    """The credentials among these ids that are still valid (the in-transaction re-check)."""
    return Stmt(f"SELECT id FROM credentials WHERE id IN ({placeholders(len(credential_ids))}) "
                "AND revoked_at IS NULL", credential_ids)


def revoked_among(credential_ids: list[str]) -> Stmt:
    return Stmt(f"SELECT id FROM credentials WHERE id IN ({placeholders(len(credential_ids))}) "
                "AND revoked_at IS NOT NULL", credential_ids)


INSERT_COLUMNS = ("id", "application_id", "namespace_id", "secret_hash", "permissions", "queue_scope", "label",
                  "created_at")


def insert(row: dict) -> Stmt:
    return Stmt(f"INSERT INTO credentials ({', '.join(INSERT_COLUMNS)}) VALUES ({placeholders(len(INSERT_COLUMNS))})",
                [row[c] for c in INSERT_COLUMNS])


def listing(application_id: str | None) -> Stmt:
    """Every credential (of one application), without secrets, in id order."""
    where, params = ("WHERE application_id = ? ", (application_id,)) if application_id is not None else ("", ())
    return Stmt("SELECT id, application_id, namespace_id, permissions, queue_scope, label, created_at, revoked_at, "
                f"revoke_reason FROM credentials {where}ORDER BY id", params)


def lock_for_update(credential_id: str) -> Stmt:
    """The credential without its secret hash, locked for revocation."""
    return Stmt("SELECT id, application_id, namespace_id, permissions, queue_scope, label, created_at, revoked_at, "
                "revoke_reason FROM credentials WHERE id = ?{FOR_UPDATE}", (credential_id,))


def revoke(credential_id: str, revoked_at, reason: str) -> Stmt:
    return Stmt("UPDATE credentials SET revoked_at = ?, revoke_reason = ? WHERE id = ?",
                (revoked_at, reason, credential_id))
