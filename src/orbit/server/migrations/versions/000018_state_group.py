"""The state index keyed on a task's state group rather than on its state, so that a Start leaves
it alone.

`ix_tasks_queue_state` (queue_id, state, id) lists a queue's tasks by state. Every state change
moved a task's entry, three per successful task (claim, Start, report), each a delete-mark and
an insert in the index and later a purge. Keyed (queue_id, state_group, id), where `state_group`
is the state except that LEASED and RUNNING are one group (HELD), the Start (LEASED to RUNNING)
changes no key column of it and the database skips it. A listing by LEASED or RUNNING reads the
HELD range, which the queue's concurrency bounds, and keeps the rows of the state asked for; the
other states keep a range of their own. Computed by the database from `state`, as `waiting` is
(000016): stored on MariaDB, virtual on SQLite.

Revision ID: 000018
Revises: 000017
"""

from alembic import op

revision = "000018"
down_revision = "000017"
branch_labels = None
depends_on = None

EXPRESSION = "CASE WHEN state IN ('LEASED', 'RUNNING') THEN 'HELD' ELSE state END"
COMMENT = ("the state, with LEASED and RUNNING as one group, HELD (computed from state): "
           "a key of the state index, which a Start then leaves alone")


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute(f"ALTER TABLE tasks ADD COLUMN state_group VARCHAR(64) GENERATED ALWAYS AS ({EXPRESSION}) VIRTUAL")
    else:
        op.execute(f"ALTER TABLE tasks ADD COLUMN state_group VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin "
                   f"AS ({EXPRESSION}) PERSISTENT "
                   f"COMMENT '{COMMENT}'")
    op.drop_index("ix_tasks_queue_state", table_name="tasks")
    op.create_index("ix_tasks_queue_group", "tasks", ["queue_id", "state_group", "id"])


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
