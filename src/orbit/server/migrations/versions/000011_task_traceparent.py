"""A submit's W3C trace context, kept with the task for the worker that runs it.

Revision ID: 000011
Revises: 000010
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Short

revision = "000011"
down_revision = "000010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column(
        "traceparent", Short, nullable=True,
        comment="the submit request's W3C traceparent header (valid ones only); handed to the worker with the "
                "lease so that the producer's trace continues in the handler",
    ))


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
