"""Applications, namespaces and credentials: what `orbit-admin` and `orbit dev` manage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import or_, select

from ..core.ids import is_id, new_id
from ..core.timefmt import format_ts
from ..store.db import Tx
from ..store.tables import application_usage, applications, credentials, namespaces, queues
from .auth import insert_credential
from .outbox import Actor, emit, write_audit
from .queues import insert_queue, queue_json

ENVIRONMENTS = ("development", "staging", "production")
ADMIN = Actor(name="orbit-admin")

# Defaults for a new application: the maxima of resources.md.
APP_DEFAULTS = {"max_concurrency": 1_000_000, "rate_per_second": 10_000_000, "max_unfinished_tasks": 100_000_000}
# The queue that bootstrap creates when it does not exist yet.
BOOTSTRAP_QUEUE = {"max_concurrency": 100, "rate_per_second": 1000, "max_unfinished_tasks": 100_000}


class AdminError(Exception):
    """A refusal that the CLI prints and turns into a non-zero exit."""


async def ensure_application(tx: Tx, name: str) -> dict[str, Any]:
    row = await tx.one_or_none(select(applications).where(applications.c.name == name))
    if row is not None:
        return dict(row)
    now = await tx.now()
    values = {"id": new_id(), "name": name, "paused": False, "revision": 1, "created_at": now, "updated_at": now, **APP_DEFAULTS}
    await tx.execute(applications.insert().values(**values))
    await tx.execute(
        application_usage.insert().values(
            application_id=values["id"], unfinished=0, permits_in_use=0, rate_window_start=None,
            rate_window_used=0, rate_reserved=0,
        )
    )
    await write_audit(tx, ADMIN, namespace_id=None, action="application.create", resource_type="application",
                      resource_id=values["id"], after={"id": values["id"], "name": name})
    return values


async def ensure_namespace(tx: Tx, application_id: str, name: str, environment: str) -> dict[str, Any]:
    if environment not in ENVIRONMENTS:
        raise AdminError(f"environment must be one of {', '.join(ENVIRONMENTS)}")
    row = await tx.one_or_none(
        select(namespaces).where(namespaces.c.application_id == application_id, namespaces.c.name == name)
    )
    if row is not None:
        if row["environment"] != environment:
            raise AdminError(
                f"namespace {name!r} exists with environment {row['environment']!r}, not {environment!r}"
            )
        return dict(row)
    values = {"id": new_id(), "application_id": application_id, "name": name, "environment": environment,
              "created_at": await tx.now()}
    await tx.execute(namespaces.insert().values(**values))
    await write_audit(tx, ADMIN, namespace_id=values["id"], action="namespace.create", resource_type="namespace",
                      resource_id=values["id"], after={"id": values["id"], "name": name, "environment": environment})
    return values


async def ensure_queue(tx: Tx, namespace_id: str, name: str) -> dict[str, Any]:
    row = await tx.one_or_none(select(queues).where(queues.c.namespace_id == namespace_id, queues.c.name == name))
    if row is not None:
        return queue_json(row, 0)
    snapshot = await insert_queue(tx, namespace_id=namespace_id, name=name, **BOOTSTRAP_QUEUE)
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
    await write_audit(tx, ADMIN, namespace_id=namespace["id"], action="credential.issue",
                      resource_type="credential", resource_id=cred_id,
                      after={"id": cred_id, "permissions": perms, "queue_scope": queue_scope})
    return IssuedCredential(cred_id, token, application["id"], namespace["id"], namespace["environment"],
                            queue_id, perms, queue_scope)


async def find_application(tx: Tx, ref: str) -> dict[str, Any]:
    cond = applications.c.name == ref
    if is_id(ref):
        cond = or_(cond, applications.c.id == ref)
    row = await tx.one_or_none(select(applications).where(cond))
    if row is None:
        raise AdminError(f"no application {ref!r}")
    return dict(row)


async def find_namespace(tx: Tx, application_id: str, ref: str) -> dict[str, Any]:
    cond = namespaces.c.name == ref
    if is_id(ref):
        cond = or_(cond, namespaces.c.id == ref)
    row = await tx.one_or_none(select(namespaces).where(namespaces.c.application_id == application_id, cond))
    if row is None:
        raise AdminError(f"no namespace {ref!r} in that application")
    return dict(row)


async def check_queues_exist(tx: Tx, namespace_id: str, queue_ids: list[str]) -> None:
    """A scope naming queues that are not in the namespace would silently reach nothing."""
    rows = await tx.all(select(queues.c.id).where(queues.c.namespace_id == namespace_id, queues.c.id.in_(queue_ids)))
    missing = sorted(set(queue_ids) - {r["id"] for r in rows})
    if missing:
        raise AdminError(f"--queue-scope {missing[0]} is not a queue of that namespace")


async def list_credentials(tx: Tx, application_id: str | None) -> list[dict[str, Any]]:
    stmt = select(
        credentials.c.id, credentials.c.application_id, credentials.c.namespace_id, credentials.c.permissions,
        credentials.c.queue_scope, credentials.c.label, credentials.c.created_at, credentials.c.revoked_at,
        credentials.c.revoke_reason,
    ).order_by(credentials.c.id)
    if application_id is not None:
        stmt = stmt.where(credentials.c.application_id == application_id)
    rows = await tx.all(stmt)
    out = []
    for r in rows:
        d = dict(r)
        d["permissions"] = orjson.loads(d["permissions"])
        d["queue_scope"] = orjson.loads(d["queue_scope"])
        out.append(d)
    return out


async def revoke_credential(tx: Tx, credential_id: str, reason: str) -> bool:
    """Revoke; returns False when it was already revoked (nothing changes then)."""
    if not reason.strip():
        raise AdminError("--reason must not be blank")
    row = await tx.one_or_none(select(credentials).where(credentials.c.id == credential_id).with_for_update())
    if row is None:
        raise AdminError(f"no credential {credential_id!r}")
    if row["revoked_at"] is not None:
        return False
    now = await tx.now()
    await tx.execute(
        credentials.update().where(credentials.c.id == credential_id).values(revoked_at=now, revoke_reason=reason)
    )
    await write_audit(tx, ADMIN, namespace_id=row["namespace_id"], action="credential.revoke",
                      resource_type="credential", resource_id=credential_id, reason=reason,
                      before={"revoked_at": None}, after={"revoked_at": format_ts(now)})
    return True
