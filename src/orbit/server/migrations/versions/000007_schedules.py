"""Schedules: recurring task generation, its run records, and the tasks' identity per trigger point.

A generated task's identity is (schedule id, trigger point): a unique index on tasks
makes a second task for the same point impossible, whatever node generates it.

Revision ID: 000007
Revises: 000006
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import Bool, Id, JsonText, Name, Short, Ts, U32, U64

revision = "000007"
down_revision = "000006"
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "schedules",
        C("id", Id, "schedule id", primary_key=True),
        C("namespace_id", Id, "namespace of the schedule and its queue"),
        C("application_id", Id, "application of the namespace (backlog slots of generated tasks)"),
        C("queue_id", Id, "queue the generated tasks go to"),
        C("name", Name, "unique in the namespace, kept after retirement"),
        C("paused", Bool, "no generation while true; the cursor waits"),
        C("cron", Short, "5-field cron expression, or null for an interval", nullable=True),
        C("interval_seconds", U32, "fixed interval (1-31622400), or null for cron", nullable=True),
        C("timezone", Short, "IANA zone the cron expression is evaluated in"),
        C("start_at", Ts, "no trigger point before it", nullable=True),
        C("end_at", Ts, "no trigger point after it", nullable=True),
        C("misfire_policy", Short, "catch_up or latest"),
        C("catch_up_window_seconds", U32, "missed points older than this are recorded SKIPPED (MISFIRE)"),
        C("overlap", Short, "allow or skip (while the previous generated task is unfinished)"),
        C("task", JsonText, "the template of generated tasks (JSON)"),
        C("anchor_at", Ts, "interval schedules: points are anchor_at + k * interval_seconds"),
        C("next_trigger_at", Ts, "the cursor: the next trigger point to handle; null once past end_at",
          nullable=True),
        C("due_at", Ts, "next_trigger_at while the schedule generates (not paused, not retired); null "
                        "otherwise: the scheduler's index", nullable=True),
        C("last_trigger_at", Ts, "the latest trigger point handled", nullable=True),
        C("last_task_id", Id, "the latest task generated (overlap skip checks it)", nullable=True),
        C("revision", U64, "bumped by every configuration change"),
        C("retired_at", Ts, "set once by retire; no more generation", nullable=True),
        C("created_at", Ts, "creation time (database clock)"),
        C("updated_at", Ts, "last configuration change"),
        sa.UniqueConstraint("namespace_id", "name", name="uq_schedules_namespace_name"),
        comment="recurring task generation into one queue",
    )
    op.create_index("ix_schedules_namespace_id", "schedules", ["namespace_id", "id"])
    op.create_index("ix_schedules_queue_id", "schedules", ["queue_id", "id"])
    op.create_index("ix_schedules_due_at", "schedules", ["due_at"])
    op.create_table(
        "schedule_runs",
        C("schedule_id", Id, "the schedule"),
        C("trigger_at", Ts, "the trigger point handled"),
        C("outcome", Short, "SUBMITTED or SKIPPED"),
        C("task_id", Id, "the task generated (SUBMITTED)", nullable=True),
        C("reason", Short, "MISFIRE or OVERLAP (SKIPPED)", nullable=True),
        C("created_at", Ts, "when the point was handled (database clock)"),
        sa.PrimaryKeyConstraint("schedule_id", "trigger_at"),
        comment="one record per trigger point a schedule handled",
    )
    op.create_index("uq_tasks_schedule_trigger", "tasks", ["schedule_id", "trigger_at"], unique=True)


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
