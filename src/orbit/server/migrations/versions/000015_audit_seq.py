"""Audit records in commit order: `audit_records.seq`, numbered per namespace as each commits.

Records were read in id order, and an id is made when the change is written, not when it
commits: a record committing after a later one could fall behind a cursor a reader had
already passed. A management transaction now takes the next number from its namespace's
`audit_sequencers` row as it writes its record; the row stays locked until the commit, so
numbers follow commit order and a reader of `seq > cursor` never misses one. Existing
records are numbered in id order.

Revision ID: 000015
Revises: 000014
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Id, U64

revision = "000015"
down_revision = "000014"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "audit_sequencers",
        C("namespace_id", Id, "the namespace whose audit records this row numbers", primary_key=True),
        C("last_seq", U64, "the largest seq handed out (consecutive per namespace)"),
        comment="per-namespace numbering of audit records, in commit order",
    )
    with op.batch_alter_table("audit_records") as batch:
        batch.add_column(C("seq", U64, "position in the namespace's audit log, in commit order (null without a "
                                       "namespace)", nullable=True))
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        op.execute("UPDATE audit_records SET seq = (SELECT COUNT(*) FROM audit_records b WHERE "
                   "b.namespace_id = audit_records.namespace_id AND b.id <= audit_records.id) "
                   "WHERE namespace_id IS NOT NULL")
    else:
        op.execute("UPDATE audit_records a JOIN (SELECT id, ROW_NUMBER() OVER (PARTITION BY namespace_id ORDER BY id) "
                   "AS n FROM audit_records WHERE namespace_id IS NOT NULL) r ON r.id = a.id SET a.seq = r.n")
    op.execute("INSERT INTO audit_sequencers (namespace_id, last_seq) SELECT namespace_id, MAX(seq) FROM "
               "audit_records WHERE namespace_id IS NOT NULL GROUP BY namespace_id")
    op.drop_index("ix_audit_records_namespace_id", table_name="audit_records")
    op.drop_index("ix_audit_records_namespace_action", table_name="audit_records")
    op.drop_index("ix_audit_records_resource_id", table_name="audit_records")
    op.create_index("ix_audit_records_namespace_seq", "audit_records", ["namespace_id", "seq"])
    op.create_index("ix_audit_records_namespace_action", "audit_records", ["namespace_id", "action", "seq"])
    op.create_index("ix_audit_records_resource_id", "audit_records", ["resource_id", "seq"])


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
