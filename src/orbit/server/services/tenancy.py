"""Applications, namespaces and credentials: what `orbit-admin` and `orbit dev` manage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..core.ids import is_id, new_id
from ..core.timefmt import format_ts
from ..store.queries import applications as app_q
from ..store.queries import credentials as cred_q
from ..store.queries import queues as queue_q
from ..store.queries import usage as usage_q
from ..store.tx import Tx
from .auth import insert_credential
from .outbox import Actor, emit, write_audit
from .queues import insert_queue, queue_json

ENVIRONMENTS = ("development", "staging", "production")
ADMIN = Actor(name="orbit-admin")

# Defaults for a new application: the largest quotas an application accepts.
APP_DEFAULTS = {"max_concurrency": 1_000_000, "rate_per_second": 10_000_000, "max_unfinished_tasks": 100_000_000}
# The queue that bootstrap creates when it does not exist yet.
BOOTSTRAP_QUEUE = {"max_concurrency": 100, "rate_per_second": 1000, "max_unfinished_tasks": 100_000}


class AdminError(Exception):
    """A refusal that the CLI prints and turns into a non-zero exit."""


async def ensure_application(tx: Tx, name: str) -> dict[str, Any]:
    row = await tx.one(app_q.by_name(name))
    if row is not None:
        return row
    now = await tx.now()
    values = {"id": new_id(), "name": name, "paused": False, "revision": 1, "created_at": now, "updated_at": now,
              **APP_DEFAULTS}
    await tx.defer(app_q.insert(values))
    await tx.defer(usage_q.insert_application_row(values["id"]))
    await write_audit(tx, ADMIN, namespace_id=None, action="application.create", resource_type="application",
                      resource_id=values["id"], after={"id": values["id"], "name": name})
    return values


async def ensure_namespace(tx: Tx, application_id: str, name: str, environment: str) -> dict[str, Any]:
    if environment not in ENVIRONMENTS:
        raise AdminError(f"environment must be one of {', '.join(ENVIRONMENTS)}")
    row = await tx.one(app_q.namespace_by_name(application_id, name))
    if row is not None:
        if row["environment"] != environment:
            raise AdminError(
                f"namespace {name!r} exists with environment {row['environment']!r}, not {environment!r}"
            )
        return row
    values = {"id": new_id(), "application_id": application_id, "name": name, "environment": environment,
              "created_at": await tx.now()}
    await tx.defer(app_q.insert_namespace(values))
    await write_audit(tx, ADMIN, namespace_id=values["id"], action="namespace.create", resource_type="namespace",
                      resource_id=values["id"], after={"id": values["id"], "name": name, "environment": environment})
    return values


async def ensure_queue(tx: Tx, namespace_id: str, name: str) -> dict[str, Any]:
    row = await tx.one(queue_q.by_name(namespace_id, name))
    if row is not None:
        return queue_json(row, 0)
    snapshot = await insert_queue(tx, namespace_id=namespace_id, name=name, controls=BOOTSTRAP_QUEUE)
    await write_audit(tx, ADMIN, namespace_id=namespace_id, action="queue.create", resource_type="queue",
                      resource_id=snapshot["id"], reason="bootstrap", after=snapshot)
    await emit(tx, namespace_id=namespace_id, type="queue.created", resource_type="queue",
               resource_id=snapshot["id"], data={"queue": snapshot})
    return snapshot


@dataclass
class IssuedCredential:
    credential_id: str
    token: str
    application_id: str
    namespace_id: str
    environment: str
    queue_id: str | None
    permissions: list[str]
    queue_scope: str | list[str]

    def as_file(self) -> dict[str, Any]:
        return {
            "credential_id": self.credential_id,
            "token": self.token,
            "application_id": self.application_id,
            "namespace_id": self.namespace_id,
            "environment": self.environment,
            "queue_id": self.queue_id,
            "permissions": self.permissions,
            "queue_scope": self.queue_scope,
        }


def credential_json(row: dict[str, Any]) -> dict[str, Any]:
    """A credential as the audit trail records it: what it may do, never its token or the token's hash."""
    return {
        "id": row["id"],
        "application_id": row["application_id"],
        "namespace_id": row["namespace_id"],
        "permissions": row["permissions"],
        "queue_scope": row["queue_scope"],
        "label": row["label"],
        "created_at": format_ts(row["created_at"]),
        "revoked_at": format_ts(row["revoked_at"]),
        "revoke_reason": row["revoke_reason"],
    }


async def issue_credential(
    tx: Tx,
    *,
    application: dict[str, Any],
    namespace: dict[str, Any],
    permissions: list[str],
    queue_scope: str | list[str],
    queue_id: str | None = None,
    label: str | None = None,
) -> IssuedCredential:
    perms = sorted(set(permissions))
    cred_id, token = await insert_credential(
        tx, application_id=application["id"], namespace_id=namespace["id"], permissions=perms,
        queue_scope=queue_scope, label=label,
    )
    issued = {"id": cred_id, "application_id": application["id"], "namespace_id": namespace["id"],
              "permissions": perms, "queue_scope": queue_scope, "label": label, "created_at": await tx.now(),
              "revoked_at": None, "revoke_reason": None}
    await write_audit(tx, ADMIN, namespace_id=namespace["id"], action="credential.issue",
                      resource_type="credential", resource_id=cred_id, after=credential_json(issued))
    return IssuedCredential(cred_id, token, application["id"], namespace["id"], namespace["environment"],
                            queue_id, perms, queue_scope)


async def find_application(tx: Tx, ref: str) -> dict[str, Any]:
    row = await tx.one(app_q.by_name_or_id(ref) if is_id(ref) else app_q.by_name(ref))
    if row is None:
        raise AdminError(f"no application {ref!r}")
    return row


async def find_namespace(tx: Tx, application_id: str, ref: str) -> dict[str, Any]:
    row = await tx.one(app_q.namespace_by_name_or_id(application_id, ref) if is_id(ref)
                       else app_q.namespace_by_name(application_id, ref))
    if row is None:
        raise AdminError(f"no namespace {ref!r} in that application")
    return row


async def check_queues_exist(tx: Tx, namespace_id: str, queue_ids: list[str]) -> None:
    """A scope naming queues that are not in the namespace would silently reach nothing."""
    rows = await tx.rows(queue_q.ids_in_namespace(namespace_id, queue_ids))
    missing = sorted(set(queue_ids) - {r["id"] for r in rows})
    if missing:
        raise AdminError(f"--queue-scope {missing[0]} is not a queue of that namespace")


async def list_credentials(tx: Tx, application_id: str | None) -> list[dict[str, Any]]:
    rows = await tx.rows(cred_q.listing(application_id))
    for r in rows:
        r["permissions"] = orjson.loads(r["permissions"])
        r["queue_scope"] = orjson.loads(r["queue_scope"])
    return rows


async def revoke_credential(tx: Tx, credential_id: str, reason: str) -> bool:
    """Revoke; returns False when it was already revoked (nothing changes then)."""
    if not reason.strip():
        raise AdminError("--reason must not be blank")
    row = await tx.one(cred_q.lock_for_update(credential_id))
    if row is None:
        raise AdminError(f"no credential {credential_id!r}")
    if row["revoked_at"] is not None:
        return False
    now = await tx.now()
    await tx.defer(cred_q.revoke(credential_id, now, reason))
    before = {**row, "permissions": orjson.loads(row["permissions"]), "queue_scope": orjson.loads(row["queue_scope"])}
    await write_audit(tx, ADMIN, namespace_id=row["namespace_id"], action="credential.revoke",
                      resource_type="credential", resource_id=credential_id, reason=reason,
                      before=credential_json(before),
                      after=credential_json({**before, "revoked_at": now, "revoke_reason": reason}))
    return True
