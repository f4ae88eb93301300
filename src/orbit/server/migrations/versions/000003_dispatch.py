"""Dispatch: leases (one row per claim of a task, an attempt once started), claim receipts, dispatch index.

Revision ID: 000003
Revises: 000002
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import AsciiKey, Bool, Id, JsonText, Short, Ts, U32

revision = "000003"
down_revision = "000002"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "leases",
        C("id", Id, "lease id handed to the worker", primary_key=True),
        C("task_id", Id, "leased task"),
        C("queue_id", Id, "queue of the task"),
        C("application_id", Id, "application of the task"),
        C("namespace_id", Id, "namespace of the task"),
        C("credential_id", Id, "worker credential that claimed it; replays must come from it"),
        C("session_id", Id, "worker session that claimed it (informational after reconnects)"),
        C("worker_node_id", Short, "the worker host's node_id from hello"),
        C("server_node_id", Short, "the server node that granted the claim"),
        C("attempt", U32, "the attempt number this lease runs once started"),
        C("state", Short, "LEASED, RUNNING or ENDED"),
        C("reserved", Bool, "holds a reserved rate-window slot (leased, not yet started)"),
        C("leased_at", Ts, "claim time (database clock)"),
        C("expires_at", Ts, "lease expiry; recovery acts after it"),
        C("started_at", Ts, "Start authorization time; null until started", nullable=True),
        C("ended_at", Ts, "when the lease ended", nullable=True),
        C("outcome", Short, "SUCCEEDED, FAILED, CANCELLED, LEASE_LOST, RELEASED, EXPIRED, REVOKED", nullable=True),
        C("error", JsonText, "JSON {code, message} of a failed outcome", nullable=True),
        C("start_msg_id", AsciiKey, "message id of the authorized Start (replays answer start_response)", nullable=True),
        C("start_response", JsonText, "the Start receipt returned to the worker", nullable=True),
        C("complete_msg_id", AsciiKey, "message id of the accepted complete/release", nullable=True),
        C("complete_response", JsonText, "the answer returned for that complete/release", nullable=True),
        C("late_reports", JsonText, "JSON array of reports that arrived after the lease was lost", nullable=True),
        C("push_pending", Bool, "a cancel_requested or lease_revoked frame still has to be pushed by server_node_id"),
        comment="leases of tasks; a started lease is an attempt",
    )
    op.create_index("ix_leases_task", "leases", ["task_id", "attempt"])
    op.create_index("ix_leases_state_expires", "leases", ["state", "expires_at"])
    op.create_index("ix_leases_push", "leases", ["server_node_id", "push_pending"])
    op.create_table(
        "worker_claims",
        C("credential_id", Id, "worker credential"),
        C("msg_id", AsciiKey, "client message id of the claim"),
        C("response", JsonText, "JSON array of the leases granted (replayed verbatim)"),
        C("created_at", Ts, "when the claim committed; pruned with idempotency records"),
        sa.PrimaryKeyConstraint("credential_id", "msg_id"),
        comment="claim receipts so that a resent claim returns the original leases",
    )
    op.create_index("ix_worker_claims_created_at", "worker_claims", ["created_at"])
    op.create_index(
        "ix_tasks_dispatch", "tasks", ["queue_id", "state", sa.text("priority DESC"), "available_at", "id"]
    )


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
