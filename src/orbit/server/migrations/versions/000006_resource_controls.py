"""Resource controls: resource keys and their usage, parked tasks, worker nodes per queue.

A task whose resource key has no free permit is *parked* on it (`tasks.parked_on`):
it leaves the claimable part of the dispatch index, so claims never walk over it,
and comes back when the key gives a permit back. The dispatch index therefore gains
`parked_on` before the order columns.

Revision ID: 000006
Revises: 000005
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Id, JsonText, Name, Short, Ts, U32, U64

revision = "000006"
down_revision = "000005"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "resource_keys",
        C("id", Id, "resource key id", primary_key=True),
        C("namespace_id", Id, "namespace whose queues share the key"),
        C("name", Name, "unique in the namespace, kept after retirement"),
        C("max_concurrency", U32, "permits: tasks holding the key at once (1-100000)"),
        C("revision", U64, "bumped by every configuration change"),
        C("retired_at", Ts, "set once by retire; the key then accepts no new references", nullable=True),
        C("created_at", Ts, "creation time (database clock)"),
        C("updated_at", Ts, "last configuration change"),
        sa.UniqueConstraint("namespace_id", "name", name="uq_resource_keys_namespace_name"),
        comment="named permit pools shared by the queues of a namespace",
    )
    op.create_index("ix_resource_keys_namespace_id", "resource_keys", ["namespace_id", "id"])
    op.create_table(
        "resource_key_usage",
        C("resource_key_id", Id, "the key", primary_key=True),
        C("unfinished", U64, "unfinished tasks that name the key (retirement needs 0)"),
        C("permits_in_use", U64, "tasks holding a permit of the key (leased or running)"),
        C("permits_freed_at", Ts, "latest database time at which a permit of the key was given back",
          nullable=True),
        comment="live counters of a resource key, kept off its configuration row",
    )
    op.add_column("tasks", C("resource_key_ids", JsonText, "JSON array of the ids of resource_keys, in the order "
                                                           "of their names; null without keys", nullable=True))
    op.add_column("tasks", C("parked_on", Id, "the saturated resource key a waiting task is parked on; null "
                                              "while it is claimable and once it leaves WAITING", nullable=True))
    op.drop_index("ix_tasks_dispatch", table_name="tasks")
    op.create_index("ix_tasks_dispatch", "tasks",
                    ["queue_id", "state", "parked_on", sa.text("priority DESC"), "available_at", "id"])
    op.create_index("ix_tasks_parked", "tasks", ["parked_on", sa.text("priority DESC"), "available_at", "id"])
    op.add_column("queue_usage", C(
        "priority_levels", U32, "bit p set: tasks of priority p were submitted to the queue (claims read only "
                                "those levels)", server_default=sa.text("1023")))
    op.create_table(
        "queue_nodes",
        C("queue_id", Id, "queue claimed on"),
        C("worker_node_id", Short, "node_id of the claiming worker sessions"),
        C("last_claim_at", Ts, "latest claim of the node on the queue (refreshed at most once a second)"),
        C("wanting_at", Ts, "latest claim of the node that was not fully served; null once one is",
          nullable=True),
        C("in_flight", U64, "permits of the queue the node's leases hold"),
        sa.PrimaryKeyConstraint("queue_id", "worker_node_id"),
        comment="worker nodes claiming on a queue, for node-fair dispatch and live usage",
    )


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
