"""A queue's throughput: cumulative counters on its usage row, and their samples for history.

The counters (`queue_usage.started_total`, `succeeded_total`, `failed_total`) are counted in
the transactions that start attempts and end tasks, in the UPDATE of the queue's usage row
those transactions already write: exact across nodes, for no statement more. Every node
samples them every 5 s into `queue_samples` (one row per queue and 5-second bucket, the
primary key letting one node's sample win), only where they changed, plus a baseline every
30 minutes; samples older than an hour are pruned. Differences of samples are the history.

Revision ID: 000012
Revises: 000011
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Id, Ts, U64

revision = "000012"
down_revision = "000011"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    for column, comment in (
        ("started_total", "attempts of the queue's tasks whose Start was authorized, ever"),
        ("succeeded_total", "tasks of the queue that ended SUCCEEDED, ever (reviews included)"),
        ("failed_total", "tasks of the queue that ended FAILED, ever (retries exhausted, not retryable, "
                         "deadlines, reviews)"),
    ):
        op.add_column("queue_usage", C(column, U64, comment, server_default=sa.text("0")))
    op.create_table(
        "queue_samples",
        C("queue_id", Id, "the queue"),
        C("at", Ts, "start of the 5-second bucket (database clock) in which the totals were read"),
        C("started_total", U64, "queue_usage.started_total when sampled"),
        C("succeeded_total", U64, "queue_usage.succeeded_total when sampled"),
        C("failed_total", U64, "queue_usage.failed_total when sampled"),
        sa.PrimaryKeyConstraint("queue_id", "at"),
        comment="a queue's cumulative throughput counters, sampled when they change (kept one hour)",
    )
    op.create_index("ix_queue_samples_at", "queue_samples", ["at"])


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
