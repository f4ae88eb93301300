"""The tables as SQLAlchemy Core sees them: which columns hold timestamps (store/tx.py), and the
Core statements of tests and tools. The schema itself is created by the migrations."""

from __future__ import annotations

from sqlalchemy import Column, Computed, Index, MetaData, PrimaryKeyConstraint, Table, UniqueConstraint

from ...models import ConfigureQueueRequest, configure_controls
from .types import U32, U64, AsciiKey, Bool, Hash, Id, JsonText, Name, NodeId, Short, Ts, Utf8Text

metadata = MetaData()


def _queue_controls() -> list[Column]:
    """One column per control of a queue, named as the API names it (their exact SQL types are
    the migrations'; Core only needs the names)."""
    return [Column(name, Bool if kind is bool else U64, nullable=False)
            for name, kind in configure_controls(ConfigureQueueRequest).items()]


applications = Table(
    "applications",
    metadata,
    Column("id", Id, primary_key=True),
    Column("name", Name, nullable=False),
    Column("paused", Bool, nullable=False),
    Column("max_concurrency", U32, nullable=False),
    Column("rate_per_second", U32, nullable=False),
    Column("max_unfinished_tasks", U64, nullable=False),
    Column("revision", U64, nullable=False),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    UniqueConstraint("name", name="uq_applications_name"),
)

namespaces = Table(
    "namespaces",
    metadata,
    Column("id", Id, primary_key=True),
    Column("application_id", Id, nullable=False),
    Column("name", Name, nullable=False),
    Column("environment", Short, nullable=False),
    Column("created_at", Ts, nullable=False),
    UniqueConstraint("application_id", "name", name="uq_namespaces_app_name"),
)

credentials = Table(
    "credentials",
    metadata,
    Column("id", Id, primary_key=True),
    Column("application_id", Id, nullable=False),
    Column("namespace_id", Id, nullable=False),
    Column("secret_hash", Hash, nullable=False),
    Column("permissions", JsonText, nullable=False),
    Column("queue_scope", JsonText, nullable=False),
    Column("label", Utf8Text, nullable=True),
    Column("created_at", Ts, nullable=False),
    Column("revoked_at", Ts, nullable=True),
    Column("revoke_reason", Utf8Text, nullable=True),
)

queues = Table(
    "queues",
    metadata,
    Column("id", Id, primary_key=True),
    Column("namespace_id", Id, nullable=False),
    Column("name", Name, nullable=False),
    *_queue_controls(),
    Column("revision", U64, nullable=False),
    Column("retired_at", Ts, nullable=True),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    UniqueConstraint("namespace_id", "name", name="uq_queues_namespace_name"),
    Index("ix_queues_namespace_id", "namespace_id", "id"),
)

queue_usage = Table(
    "queue_usage",
    metadata,
    Column("queue_id", Id, primary_key=True),
    Column("unfinished", U64, nullable=False),
    Column("permits_in_use", U64, nullable=False),
    Column("rate_window_start", Ts, nullable=True),
    Column("rate_window_used", U64, nullable=False),
    Column("rate_reserved", U64, nullable=False),
    Column("permits_freed_at", Ts, nullable=True),
    Column("priority_levels", U32, nullable=False),
    Column("started_total", U64, nullable=False),
    Column("succeeded_total", U64, nullable=False),
    Column("failed_total", U64, nullable=False),
)

queue_samples = Table(
    "queue_samples",
    metadata,
    Column("queue_id", Id, nullable=False),
    Column("at", Ts, nullable=False),
    Column("started_total", U64, nullable=False),
    Column("succeeded_total", U64, nullable=False),
    Column("failed_total", U64, nullable=False),
    PrimaryKeyConstraint("queue_id", "at"),
    Index("ix_queue_samples_at", "at"),
)

queue_sample_heads = Table(
    "queue_sample_heads",
    metadata,
    Column("queue_id", Id, primary_key=True),
    Column("at", Ts, nullable=False),
    Column("started_total", U64, nullable=False),
    Column("succeeded_total", U64, nullable=False),
    Column("failed_total", U64, nullable=False),
)

idempotency_records = Table(
    "idempotency_records",
    metadata,
    Column("namespace_id", Id, nullable=False),
    Column("operation", Short, nullable=False),
    Column("idem_key", AsciiKey, nullable=False),
    Column("digest", Hash, nullable=False),
    Column("resource_id", Id, nullable=True),
    Column("response", JsonText, nullable=True),
    Column("created_at", Ts, nullable=False),
    PrimaryKeyConstraint("namespace_id", "operation", "idem_key"),
    Index("ix_idempotency_records_created_at", "created_at"),
)

audit_records = Table(
    "audit_records",
    metadata,
    Column("id", Id, primary_key=True),
    Column("namespace_id", Id, nullable=True),
    Column("time", Ts, nullable=False),
    Column("actor_credential_id", Id, nullable=True),
    Column("actor", Short, nullable=True),
    Column("action", Short, nullable=False),
    Column("resource_type", Short, nullable=False),
    Column("resource_id", Id, nullable=False),
    Column("reason", Utf8Text, nullable=True),
    Column("request_id", Id, nullable=True),
    Column("idempotency_key", AsciiKey, nullable=True),
    Column("before", JsonText, nullable=True),
    Column("after", JsonText, nullable=True),
    Column("seq", U64, nullable=True),
    Index("ix_audit_records_namespace_seq", "namespace_id", "seq"),
    Index("ix_audit_records_resource_id", "resource_id", "seq"),
    Index("ix_audit_records_namespace_action", "namespace_id", "action", "seq"),
)

audit_sequencers = Table(
    "audit_sequencers",
    metadata,
    Column("namespace_id", Id, primary_key=True),
    Column("last_seq", U64, nullable=False),
)

event_batches = Table(
    "event_batches",
    metadata,
    Column("batch_id", Id, primary_key=True),
    Column("namespace_id", Id, nullable=False),
    Column("seq", U64, nullable=True),
    Column("count", U32, nullable=False),
    Column("created_at", Ts, nullable=False),
    Column("events", JsonText, nullable=True),
    Index("ix_event_batches_namespace_seq", "namespace_id", "seq"),
)

application_usage = Table(
    "application_usage",
    metadata,
    Column("application_id", Id, primary_key=True),
    Column("unfinished", U64, nullable=False),
    Column("permits_in_use", U64, nullable=False),
    Column("rate_window_start", Ts, nullable=True),
    Column("rate_window_used", U64, nullable=False),
    Column("rate_reserved", U64, nullable=False),
    Column("permits_freed_at", Ts, nullable=True),
)

tasks = Table(
    "tasks",
    metadata,
    Column("id", Id, primary_key=True),
    Column("namespace_id", Id, nullable=False),
    Column("application_id", Id, nullable=False),
    Column("queue_id", Id, nullable=False),
    Column("schedule_id", Id, nullable=True),
    Column("trigger_at", Ts, nullable=True),
    Column("state", Short, nullable=False),
    Column("payload", JsonText, nullable=False),
    Column("priority", U32, nullable=False),
    Column("resource_keys", JsonText, nullable=False),
    Column("max_attempts", U32, nullable=False),
    Column("attempts", U32, nullable=False),
    Column("retry_policy", JsonText, nullable=False),
    Column("on_lease_lost", Short, nullable=False),
    Column("available_at", Ts, nullable=False),
    Column("start_deadline_at", Ts, nullable=True),
    Column("deadline_at", Ts, nullable=True),
    Column("cancel_requested", Bool, nullable=False),
    Column("cancel_reason", Utf8Text, nullable=True),
    Column("result", JsonText, nullable=True),
    Column("error", JsonText, nullable=True),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    Column("finished_at", Ts, nullable=True),
    Column("sweep_at", Ts, nullable=True),
    Column("resource_key_ids", JsonText, nullable=True),
    Column("parked_on", Id, nullable=True),
    Column("traceparent", Short, nullable=True),
    Column("started_at", Ts, nullable=True),
    Column("start_msg_id", AsciiKey, nullable=True),
    Column("start_response", JsonText, nullable=True),
    Column("waiting", Bool, Computed("state = 'WAITING'"), nullable=True),
    Column("state_group", Short, Computed("CASE WHEN state IN ('LEASED', 'RUNNING') THEN 'HELD' ELSE state END"),
           nullable=True),
    Index("ix_tasks_queue_id", "queue_id", "id"),
    Index("ix_tasks_queue_group", "queue_id", "state_group", "id"),
    Index("ix_tasks_sweep_at", "sweep_at"),
    Index("ix_tasks_schedule_id", "schedule_id", "id"),
)

leases = Table(
    "leases",
    metadata,
    Column("id", Id, primary_key=True),
    Column("task_id", Id, nullable=False),
    Column("queue_id", Id, nullable=False),
    Column("application_id", Id, nullable=False),
    Column("namespace_id", Id, nullable=False),
    Column("credential_id", Id, nullable=False),
    Column("session_id", Id, nullable=False),
    Column("worker_node_id", NodeId, nullable=False),
    Column("server_node_id", Short, nullable=False),
    Column("attempt", U32, nullable=False),
    Column("state", Short, nullable=False),
    Column("reserved", Bool, nullable=False),
    Column("leased_at", Ts, nullable=False),
    Column("expires_at", Ts, nullable=False),
    Column("started_at", Ts, nullable=True),
    Column("ended_at", Ts, nullable=True),
    Column("outcome", Short, nullable=True),
    Column("error", JsonText, nullable=True),
    Column("start_msg_id", AsciiKey, nullable=True),
    Column("start_response", JsonText, nullable=True),
    Column("complete_msg_id", AsciiKey, nullable=True),
    Column("complete_response", JsonText, nullable=True),
    Column("late_reports", JsonText, nullable=True),
    Column("push_pending", Bool, nullable=False),
    Column("live", Bool, Computed("state IN ('LEASED', 'RUNNING')"), nullable=True),
    Index("ix_leases_task", "task_id", "attempt"),
    Index("ix_leases_live_expires", "live", "expires_at"),
    Index("ix_leases_push", "server_node_id", "push_pending"),
)

resource_keys = Table(
    "resource_keys",
    metadata,
    Column("id", Id, primary_key=True),
    Column("namespace_id", Id, nullable=False),
    Column("name", Name, nullable=False),
    Column("max_concurrency", U32, nullable=False),
    Column("revision", U64, nullable=False),
    Column("retired_at", Ts, nullable=True),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    UniqueConstraint("namespace_id", "name", name="uq_resource_keys_namespace_name"),
    Index("ix_resource_keys_namespace_id", "namespace_id", "id"),
)

resource_key_usage = Table(
    "resource_key_usage",
    metadata,
    Column("resource_key_id", Id, primary_key=True),
    Column("unfinished", U64, nullable=False),
    Column("permits_in_use", U64, nullable=False),
    Column("permits_freed_at", Ts, nullable=True),
)

queue_nodes = Table(
    "queue_nodes",
    metadata,
    Column("queue_id", Id, nullable=False),
    Column("worker_node_id", NodeId, nullable=False),
    Column("last_claim_at", Ts, nullable=False),
    Column("wanting_at", Ts, nullable=True),
    Column("in_flight", U64, nullable=False),
    PrimaryKeyConstraint("queue_id", "worker_node_id"),
)

schedules = Table(
    "schedules",
    metadata,
    Column("id", Id, primary_key=True),
    Column("namespace_id", Id, nullable=False),
    Column("application_id", Id, nullable=False),
    Column("queue_id", Id, nullable=False),
    Column("name", Name, nullable=False),
    Column("paused", Bool, nullable=False),
    Column("cron", Short, nullable=True),
    Column("interval_seconds", U32, nullable=True),
    Column("timezone", Short, nullable=False),
    Column("start_at", Ts, nullable=True),
    Column("end_at", Ts, nullable=True),
    Column("misfire_policy", Short, nullable=False),
    Column("catch_up_window_seconds", U32, nullable=False),
    Column("overlap", Short, nullable=False),
    Column("task", JsonText, nullable=False),
    Column("anchor_at", Ts, nullable=False),
    Column("next_trigger_at", Ts, nullable=True),
    Column("due_at", Ts, nullable=True),
    Column("last_trigger_at", Ts, nullable=True),
    Column("last_task_id", Id, nullable=True),
    Column("revision", U64, nullable=False),
    Column("retired_at", Ts, nullable=True),
    Column("created_at", Ts, nullable=False),
    Column("updated_at", Ts, nullable=False),
    UniqueConstraint("namespace_id", "name", name="uq_schedules_namespace_name"),
    Index("ix_schedules_namespace_id", "namespace_id", "id"),
    Index("ix_schedules_queue_id", "queue_id", "id"),
    Index("ix_schedules_due_at", "due_at"),
)

schedule_runs = Table(
    "schedule_runs",
    metadata,
    Column("schedule_id", Id, nullable=False),
    Column("trigger_at", Ts, nullable=False),
    Column("outcome", Short, nullable=False),
    Column("task_id", Id, nullable=True),
    Column("reason", Short, nullable=True),
    Column("created_at", Ts, nullable=False),
    PrimaryKeyConstraint("schedule_id", "trigger_at"),
)

event_sequencers = Table(
    "event_sequencers",
    metadata,
    Column("namespace_id", Id, primary_key=True),
    Column("last_seq", U64, nullable=False),
    Column("pruned_through", U64, nullable=False),
    Column("numbered_at", Ts, nullable=True),
)

worker_claims = Table(
    "worker_claims",
    metadata,
    Column("credential_id", Id, nullable=False),
    Column("msg_id", AsciiKey, nullable=False),
    Column("response", JsonText, nullable=False),
    Column("created_at", Ts, nullable=False),
    PrimaryKeyConstraint("credential_id", "msg_id"),
    Index("ix_worker_claims_created_at", "created_at"),
)
