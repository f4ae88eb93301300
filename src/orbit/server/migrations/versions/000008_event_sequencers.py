"""Event feed numbering: one sequencer row per namespace.

Writers insert events with `seq` NULL in the transaction of their change. A
sequencer pass (any node) takes a namespace's row FOR UPDATE SKIP LOCKED, numbers
the committed, still-unnumbered events it can see in id order with the next
values and commits: passes of a namespace are serialised by this row and only
ever hand out larger values, so a reader of `seq > after` never sees a gap that
is filled later. `pruned_through` is the largest seq retention has deleted: a
cursor below it has lost events.

Revision ID: 000008
Revises: 000007
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Id, Ts, U64

revision = "000008"
down_revision = "000007"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "event_sequencers",
        C("namespace_id", Id, "the namespace whose events this row numbers", primary_key=True),
        C("last_seq", U64, "the largest seq handed out (seqs are consecutive per namespace)"),
        C("pruned_through", U64, "the largest seq retention deleted (0: none); older cursors get 410"),
        C("numbered_at", Ts, "when the last pass numbered events", nullable=True),
        comment="per-namespace numbering of the event feed",
    )


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
