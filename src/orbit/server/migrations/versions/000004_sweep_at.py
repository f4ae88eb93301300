"""Deadline sweep through one column (`tasks.sweep_at`), and the clock of freed permits (`queue_usage`).

`tasks.sweep_at` replaces the two state-bearing deadline indexes.

Every state change used to rewrite four secondary-index entries that contain
`state`; two of them existed only so that the deadline sweep could find its
work. `sweep_at` is set when a task is accepted and moved on only by the sweep,
so claims, Starts and completes no longer touch a deadline index.

`queue_usage.permits_freed_at` lets a claim planned before it locks the usage
row prove that no permit it takes was freed at a later database time than the
lease it writes, so stored lease intervals never overlap beyond the limit.

Revision ID: 000004
Revises: 000003
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Ts

revision = "000004"
down_revision = "000003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column(
        "sweep_at", Ts, nullable=True,
        comment="when the deadline sweep must next look at the task (earliest deadline still able to act); "
                "set on acceptance, then moved only by the sweep; NULL when no deadline can act",
    ))
    least = "LEAST" if op.get_bind().dialect.name == "mysql" else "MIN"
    op.execute(
        "UPDATE tasks SET sweep_at = CASE "
        "WHEN state IN ('WAITING', 'LEASED') AND attempts = 0 THEN "
        f"{least}(COALESCE(deadline_at, start_deadline_at), COALESCE(start_deadline_at, deadline_at)) "
        "WHEN state IN ('WAITING', 'LEASED') THEN deadline_at "
        "WHEN state = 'RUNNING' AND cancel_requested = 0 THEN deadline_at "
        "ELSE NULL END"
    )
    op.drop_index("ix_tasks_state_deadline", table_name="tasks")
    op.drop_index("ix_tasks_state_start_deadline", table_name="tasks")
    op.create_index("ix_tasks_sweep_at", "tasks", ["sweep_at"])
    op.add_column("queue_usage", sa.Column(
        "permits_freed_at", Ts, nullable=True,
        comment="latest database time at which a permit of the queue was given back (a lease ended)",
    ))


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
