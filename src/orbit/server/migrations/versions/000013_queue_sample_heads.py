"""Each queue's latest throughput sample, kept apart: `queue_sample_heads`.

The sampler compared every queue's counters with its latest sample, found by a step back into
`queue_samples`' primary key per queue: one page read per queue once the hour of samples had
outgrown the buffer pool (0.3-0.6 s a run with 10,000 queues and 120 samples each). The heads
are one small row per queue, read in memory whatever the history's length: the sampler compares
the usage rows with them, moves those that need a sample and writes the samples of the moved
ones. Pruning deletes samples only; a head stays. Filled here from each queue's latest sample.

Revision ID: 000013
Revises: 000012
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Id, Ts, U64

revision = "000013"
down_revision = "000012"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "queue_sample_heads",
        C("queue_id", Id, "the queue", primary_key=True),
        C("at", Ts, "bucket of the queue's latest sample (start of a 5-second bucket, database clock)"),
        C("started_total", U64, "queue_samples.started_total of that sample"),
        C("succeeded_total", U64, "queue_samples.succeeded_total of that sample"),
        C("failed_total", U64, "queue_samples.failed_total of that sample"),
        comment="each queue's latest throughput sample (a copy, kept when the sample is pruned): what the "
                "sampler compares the counters with",
    )
    op.execute("INSERT INTO queue_sample_heads (queue_id, at, started_total, succeeded_total, failed_total) "
               "SELECT s.queue_id, s.at, s.started_total, s.succeeded_total, s.failed_total FROM queue_samples s "
               "JOIN (SELECT queue_id, MAX(at) AS at FROM queue_samples GROUP BY queue_id) l "
               "ON l.queue_id = s.queue_id AND l.at = s.at")


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
