"""The dispatch index keyed on whether a task waits rather than on its state, so that only
entering and leaving WAITING moves its entry; the expiry index likewise on whether a lease is live.

`ix_tasks_dispatch` was keyed (queue_id, state, …): every state change of a task moved its entry,
three per successful task (claim, Start, report), each a delete-mark and an insert in the index
and later a purge. Keyed (queue_id, waiting, …), where `waiting` is 1 while the task is WAITING,
a Start and a report leave the index alone: the database skips an index none of whose key
columns changed. The column is computed by the database from `state`, so no write can forget
it. On MariaDB it is stored (PERSISTENT), which rebuilds the tasks table once; on SQLite, where
ALTER TABLE can only add a virtual generated column, it is virtual and the index holds its value.

`ix_leases_state_expires` (state, expires_at) moved at the Start (LEASED to RUNNING); keyed
(live, expires_at), where `live` is 1 while the lease is LEASED or RUNNING, it moves when the
lease ends or is renewed, and the recovery sweep reads one range in expiry order instead of two.

Revision ID: 000016
Revises: 000015
"""

import sqlalchemy as sa
from alembic import op

revision = "000016"
down_revision = "000015"
branch_labels = None
depends_on = None

FLAGS = (
    ("tasks", "waiting", "state = 'WAITING'",
     "1 while the task is WAITING, else 0 (computed from state): a key of the dispatch index"),
    ("leases", "live", "state IN ('LEASED', 'RUNNING')",
     "1 while the lease is LEASED or RUNNING, else 0 (computed from state): a key of the expiry index"),
)


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for table, column, expression, comment in FLAGS:
        if sqlite:
            op.execute(f"ALTER TABLE {table} ADD COLUMN {column} BOOLEAN GENERATED ALWAYS AS ({expression}) VIRTUAL")
        else:
            op.execute(f"ALTER TABLE {table} ADD COLUMN {column} BOOLEAN AS ({expression}) PERSISTENT "
                       f"COMMENT '{comment}'")
    op.drop_index("ix_tasks_dispatch", table_name="tasks")
    op.create_index("ix_tasks_dispatch", "tasks",
                    ["queue_id", "waiting", "parked_on", sa.text("priority DESC"), "available_at", "id"])
    op.drop_index("ix_leases_state_expires", table_name="leases")
    op.create_index("ix_leases_live_expires", "leases", ["live", "expires_at"])


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
