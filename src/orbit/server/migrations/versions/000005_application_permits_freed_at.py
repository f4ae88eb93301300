"""The clock of freed application permits (`application_usage.permits_freed_at`).

An application's concurrency is checked by claims the way a queue's is: a claim
planned before it locks the usage rows proves that no application permit it takes
was given back at a later database time than the leases it writes, so stored lease
intervals never overlap beyond the application's limit either.

Revision ID: 000005
Revises: 000004
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Ts

revision = "000005"
down_revision = "000004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("application_usage", sa.Column(
        "permits_freed_at", Ts, nullable=True,
        comment="latest database time at which a permit of the application was given back (a lease ended)",
    ))


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
