"""Foundation: tenancy, credentials, queues with their usage counters, idempotency, audit, events outbox.

Revision ID: 000001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from orbit.server.store.types import AsciiKey, Bool, Hash, Id, JsonText, Name, Seq, Short, Ts, U32, U64, Utf8Text

revision = "000001"
down_revision = None
branch_labels = None
depends_on = None


def C(name, type_, comment, **kw):
    return sa.Column(name, type_, comment=comment, nullable=kw.pop("nullable", False), **kw)


def upgrade() -> None:
    op.create_table(
        "applications",
        C("id", Id, "application id (UUIDv7, 32 hex)", primary_key=True),
        C("name", Name, "unique application name"),
        C("paused", Bool, "application-wide pause: blocks claims and Starts in every queue"),
        C("max_concurrency", U32, "application-wide execution permits"),
        C("rate_per_second", U32, "application-wide Starts per one-second window"),
        C("max_unfinished_tasks", U64, "application-wide backlog quota"),
        C("revision", U64, "configuration revision, +1 per configure"),
        C("created_at", Ts, "creation time (database clock, UTC)"),
        C("updated_at", Ts, "last configuration change (UTC)"),
        sa.UniqueConstraint("name", name="uq_applications_name"),
        comment="tenants; quotas shared by all their namespaces",
    )
    op.create_table(
        "namespaces",
        C("id", Id, "namespace id", primary_key=True),
        C("application_id", Id, "owning application"),
        C("name", Name, "name, unique within the application"),
        C("environment", Short, "label: development | staging | production"),
        C("created_at", Ts, "creation time (UTC)"),
        sa.UniqueConstraint("application_id", "name", name="uq_namespaces_app_name"),
        comment="environments of an application; every resource lives in one",
    )
    op.create_table(
        "credentials",
        C("id", Id, "credential id, the <id> part of orb_<id>_<secret>", primary_key=True),
        C("application_id", Id, "application the credential belongs to"),
        C("namespace_id", Id, "namespace the credential acts in"),
        C("secret_hash", Hash, "SHA-256 hex of the secret; the secret itself is never stored"),
        C("permissions", JsonText, "JSON array of permission names"),
        C("queue_scope", JsonText, "JSON: \"*\" or an array of queue ids"),
        C("label", Utf8Text, "free text shown by credentials list", nullable=True),
        C("created_at", Ts, "issue time (UTC)"),
        C("revoked_at", Ts, "revocation time; null while valid", nullable=True),
        C("revoke_reason", Utf8Text, "why it was revoked", nullable=True),
        comment="bearer credentials; only a hash of each secret",
    )
    op.create_table(
        "queues",
        C("id", Id, "queue id", primary_key=True),
        C("namespace_id", Id, "owning namespace"),
        C("name", Name, "name, unique within the namespace, kept after retirement"),
        C("paused", Bool, "blocks new claims and Starts; submits still accepted"),
        C("max_concurrency", U32, "execution permits (LEASED + RUNNING)"),
        C("rate_per_second", U32, "Start authorizations per one-second database window"),
        C("max_unfinished_tasks", U32, "backlog limit (WAITING, LEASED, RUNNING, NEEDS_REVIEW)"),
        C("revision", U64, "configuration revision: 1 at creation, +1 per configure and retire"),
        C("retired_at", Ts, "permanent retirement time; null while active", nullable=True),
        C("created_at", Ts, "creation time (UTC)"),
        C("updated_at", Ts, "last configuration change (UTC); counters do not touch it"),
        sa.UniqueConstraint("namespace_id", "name", name="uq_queues_namespace_name"),
        comment="queue configuration; live usage lives in queue_usage",
    )
    op.create_index("ix_queues_namespace_id", "queues", ["namespace_id", "id"])
    op.create_table(
        "queue_usage",
        C("queue_id", Id, "queue id", primary_key=True),
        C("unfinished", U64, "tasks holding a backlog slot"),
        C("permits_in_use", U64, "LEASED + RUNNING tasks holding an execution permit"),
        C("rate_window_start", Ts, "start of the current one-second rate window", nullable=True),
        C("rate_window_used", U64, "Starts committed in the current window"),
        C("rate_reserved", U64, "window space reserved by leased, not yet started tasks"),
        comment="live per-queue counters, locked FOR UPDATE by the transactions that change them",
    )
    op.create_table(
        "idempotency_records",
        C("namespace_id", Id, "scope part 1: namespace"),
        C("operation", Short, "scope part 2: operation name such as queues.create"),
        C("idem_key", AsciiKey, "scope part 3: the client's Idempotency-Key"),
        C("digest", Hash, "SHA-256 of the canonical JSON of path params and sent fields"),
        C("resource_id", Id, "resource the operation created or changed", nullable=True),
        C("response", JsonText, "the original data snapshot returned on replay", nullable=True),
        C("created_at", Ts, "when the operation committed (UTC); pruned after retention"),
        sa.PrimaryKeyConstraint("namespace_id", "operation", "idem_key"),
        comment="one row per accepted idempotent write",
    )
    op.create_index("ix_idempotency_records_created_at", "idempotency_records", ["created_at"])
    op.create_table(
        "audit_records",
        C("id", Id, "audit record id", primary_key=True),
        C("namespace_id", Id, "namespace of the resource, when it has one", nullable=True),
        C("time", Ts, "when the change committed (UTC)"),
        C("actor_credential_id", Id, "credential that made the change", nullable=True),
        C("actor", Short, "non-credential actor such as orbit-admin", nullable=True),
        C("action", Short, "e.g. queue.create, queue.configure, credential.revoke"),
        C("resource_type", Short, "queue, task, credential, ..."),
        C("resource_id", Id, "id of the changed resource"),
        C("reason", Utf8Text, "operator's reason, when the operation takes one", nullable=True),
        C("request_id", Id, "HTTP request id", nullable=True),
        C("idempotency_key", AsciiKey, "Idempotency-Key of the request", nullable=True),
        C("before", JsonText, "JSON snapshot before the change", nullable=True),
        C("after", JsonText, "JSON snapshot after the change", nullable=True),
        comment="append-only record of every management operation",
    )
    op.create_index("ix_audit_records_namespace_id", "audit_records", ["namespace_id", "id"])
    op.create_index("ix_audit_records_resource_id", "audit_records", ["resource_id", "id"])
    op.create_table(
        "events",
        C("id", Seq, "insertion order", primary_key=True, autoincrement=True),
        C("namespace_id", Id, "namespace the event belongs to"),
        C("seq", U64, "per-namespace published sequence; assigned after commit by the sequencer", nullable=True),
        C("type", Short, "event type such as queue.created"),
        C("time", Ts, "when the change committed (UTC)"),
        C("resource_type", Short, "queue, task, schedule, ..."),
        C("resource_id", Id, "id of the resource"),
        C("data", JsonText, "JSON event body"),
        comment="transactional outbox: written with every state change",
    )
    op.create_index("ix_events_namespace_seq", "events", ["namespace_id", "seq"])


def downgrade() -> None:
    raise NotImplementedError("Orbit migrations are forward-only")
