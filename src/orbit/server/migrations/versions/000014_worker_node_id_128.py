"""A worker's node_id whole: 128 characters, as the worker protocol allows (it was cut to 64).

`leases.worker_node_id` and `queue_nodes.worker_node_id` go from VARCHAR(64) to VARCHAR(128),
still ASCII (hello refuses other characters): on MariaDB widening an ASCII VARCHAR within 255
bytes is an instant change, whereas another character set would copy the leases table, which
holds every lease ever granted. SQLite does not enforce the length; its tables are rebuilt with
the new declared type all the same, so that both schemas read alike.

Revision ID: 000014
Revises: 000013
"""

from alembic import op

from orbit.server.store.types import NodeId, Short

revision = "000014"
down_revision = "000013"
branch_labels = None
depends_on = None

COLUMNS = (
    ("leases", "the worker host's node_id from hello (1-128 printable ASCII characters)"),
    ("queue_nodes", "node_id of the claiming worker sessions (1-128 printable ASCII characters)"),
)


def upgrade() -> None:
    for table, comment in COLUMNS:
        with op.batch_alter_table(table) as batch:
            batch.alter_column("worker_node_id", type_=NodeId, existing_type=Short, existing_nullable=False,
                               comment=comment)


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
