"""The event feed numbers batches, not rows: one `event_batches` row per namespace per write.

Numbering every event row cost a row update and an index move per event (about four per
task), which slowed a drain by a sixth. A transaction's events of one namespace now share
a batch; the sequencer gives each batch its first seq and the batch's events follow it in
id order, so numbering costs one small update per batch. The per-row `seq` and its index go.
Existing events become one batch each (a single statement: the feed has no history yet).

Revision ID: 000010
Revises: 000009
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Id, Ts, U32, U64

revision = "000010"
down_revision = "000009"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "event_batches",
        C("batch_id", Id, "the batch (time-ordered id)", primary_key=True),
        C("namespace_id", Id, "namespace of its events"),
        C("seq", U64, "seq of its first event (the others follow in id order); null until numbered",
          nullable=True),
        C("count", U32, "events in the batch"),
        C("created_at", Ts, "when the batch was written (database clock)"),
        comment="the events one write gave a namespace, numbered together by the sequencer",
    )
    op.create_index("ix_event_batches_namespace_seq", "event_batches", ["namespace_id", "seq"])
    op.add_column("events", C("batch_id", Id, "the batch the event was written in", nullable=True))
    bind = op.get_bind()
    as_id = "printf('%032x', id)" if bind.dialect.name == "sqlite" else "LPAD(LOWER(HEX(id)), 32, '0')"
    op.execute(f"UPDATE events SET batch_id = {as_id}")
    op.execute("INSERT INTO event_batches (batch_id, namespace_id, seq, count, created_at) "
               "SELECT batch_id, namespace_id, NULL, 1, time FROM events")
    op.execute("UPDATE event_sequencers SET last_seq = pruned_through")
    op.create_index("ix_events_batch", "events", ["batch_id", "id"])
    op.drop_index("ix_events_namespace_seq", table_name="events")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("seq")


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
