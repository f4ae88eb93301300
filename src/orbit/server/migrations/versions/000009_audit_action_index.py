"""Audit reads filtered by action: an index on `audit_records (namespace_id, action, id)`.

`GET /v1/audit-records?action=` reads one namespace's records of one action in id order; with
only `(namespace_id, id)` it would walk every record of the namespace to find them. Adding a
secondary index is an online operation on MariaDB/MySQL and needs no backfill.

Revision ID: 000009
Revises: 000008
"""

from alembic import op

revision = "000009"
down_revision = "000008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_audit_records_namespace_action", "audit_records", ["namespace_id", "action", "id"])


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
