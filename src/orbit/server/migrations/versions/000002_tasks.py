"""Tasks with their frozen policy, application usage counters.

Revision ID: 000002
Revises: 000001
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Bool, Id, JsonText, Short, Ts, U32, U64, Utf8Text

revision = "000002"
down_revision = "000001"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "application_usage",
        C("application_id", Id, "application id", primary_key=True),
        C("unfinished", U64, "tasks of the application holding a backlog slot"),
        C("permits_in_use", U64, "LEASED + RUNNING tasks of the application"),
        C("rate_window_start", Ts, "start of the application's one-second rate window", nullable=True),
        C("rate_window_used", U64, "Starts committed in the application's current window"),
        C("rate_reserved", U64, "window space reserved by leased, not yet started tasks"),
        comment="live application-wide counters; locked after queue_usage, never before",
    )
    op.execute(
        "INSERT INTO application_usage (application_id, unfinished, permits_in_use, rate_window_start, "
        "rate_window_used, rate_reserved) SELECT id, 0, 0, NULL, 0, 0 FROM applications"
    )
    op.create_table(
        "tasks",
        C("id", Id, "task id (UUIDv7: also the acceptance order)", primary_key=True),
        C("namespace_id", Id, "namespace of the queue"),
        C("application_id", Id, "application of the namespace, for application quotas"),
        C("queue_id", Id, "queue the task was submitted to"),
        C("schedule_id", Id, "schedule that generated the task", nullable=True),
        C("trigger_at", Ts, "schedule trigger point that generated the task", nullable=True),
        C("state", Short, "WAITING, LEASED, RUNNING, NEEDS_REVIEW, SUCCEEDED, FAILED, CANCELLED"),
        C("payload", JsonText, "JSON payload as submitted; never logged"),
        C("priority", U32, "0-9, higher dispatched first (frozen)"),
        C("resource_keys", JsonText, "JSON array of resource key names (frozen)"),
        C("max_attempts", U32, "attempt budget (frozen)"),
        C("attempts", U32, "authorized Starts so far"),
        C("retry_policy", JsonText, "JSON backoff policy (frozen)"),
        C("on_lease_lost", Short, "review | retry (frozen)"),
        C("available_at", Ts, "not dispatched before this time (UTC)"),
        C("start_deadline_at", Ts, "fails START_DEADLINE_EXCEEDED if not started by then", nullable=True),
        C("deadline_at", Ts, "total deadline for all attempts", nullable=True),
        C("cancel_requested", Bool, "a cancel was requested while the task was running"),
        C("cancel_reason", Utf8Text, "reason given with the cancel request", nullable=True),
        C("result", JsonText, "JSON result reported on success", nullable=True),
        C("error", JsonText, "JSON {code, message} of the last failure", nullable=True),
        C("created_at", Ts, "acceptance time (UTC)"),
        C("updated_at", Ts, "last state change (UTC)"),
        C("finished_at", Ts, "when the task reached a terminal state", nullable=True),
        comment="tasks; terminal states are final and rows are never deleted",
    )
    op.create_index("ix_tasks_queue_id", "tasks", ["queue_id", "id"])
    op.create_index("ix_tasks_queue_state", "tasks", ["queue_id", "state", "id"])
    op.create_index("ix_tasks_state_deadline", "tasks", ["state", "deadline_at"])
    op.create_index("ix_tasks_state_start_deadline", "tasks", ["state", "start_deadline_at"])
    op.create_index("ix_tasks_schedule_id", "tasks", ["schedule_id", "id"])


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
