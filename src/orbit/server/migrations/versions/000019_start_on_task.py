"""A Start is written on its task's row alone: the started attempt's time, message id and
receipt stay there while its lease is live, and go onto the lease row when the lease ends.

A Start wrote two rows: the task (RUNNING, one more attempt) and its lease (RUNNING, the start
receipt for replays, the reservation consumed). A task has at most one live lease, so a task
that is RUNNING says that its live lease was started; the receipt the Start answered is kept
beside it, and the lease row is written once more only when the lease ends, which writes it
anyway. A lease row that reads LEASED while its task is RUNNING is therefore started, its Start
on the task row (`core.lease.as_started`). Lease rows of attempts started before this revision
keep their Start on their own row and are read as they are.

Revision ID: 000019
Revises: 000018
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import AsciiKey, JsonText, Ts

revision = "000019"
down_revision = "000018"
branch_labels = None
depends_on = None

COLUMNS = (
    ("started_at", Ts, "Start authorization time of the task's latest attempt; its lease row gets it when the "
                       "lease ends"),
    ("start_msg_id", AsciiKey, "message id of that Start, for replays while its lease is live"),
    ("start_response", JsonText, "what that Start answered, for replays while its lease is live"),
)


def upgrade() -> None:
    for name, type_, comment in COLUMNS:
        op.add_column("tasks", sa.Column(name, type_, nullable=True, comment=comment))


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
