"""Application quotas: read and configure the controls every namespace and queue of an
application shares (the enforcement is in the dispatch and submit paths)."""

from __future__ import annotations

from typing import Any

from ...models import ConfigureApplicationRequest, configure_controls
from ..core.ids import is_id
from ..core.timefmt import format_ts
from ..errors import not_found, stale_revision
from ..store.db import Database
from ..store.queries import applications as app_q
from ..store.tx import Tx
from .auth import Principal
from .idempotency import Outcome, WriteRequest, idempotent_write
from .outbox import emit, write_audit

OP_CONFIGURE = "applications.configure"
# Every quota, declared once by the configure model, with its JSON type.
QUOTAS = configure_controls(ConfigureApplicationRequest)


def application_json(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "name": row["name"],
        **{name: kind(row[name]) for name, kind in QUOTAS.items()},
        "unfinished_tasks": str(int(row["unfinished"])),
        "in_flight": str(int(row["permits_in_use"])),
        "revision": str(int(row["revision"])),
        "created_at": format_ts(row["created_at"]),
        "updated_at": format_ts(row["updated_at"]),
    }


def _own(principal: Principal, application_id: str) -> None:
    """A credential sees its own application only; any other id looks missing."""
    if not is_id(application_id) or application_id != principal.application_id:
        raise not_found("application")


async def get_application(db: Database, principal: Principal, application_id: str) -> dict[str, Any]:
    _own(principal, application_id)
    row = await db.read(lambda tx: tx.one(app_q.with_usage(application_id)))
    if row is None:
        raise not_found("application")
    return application_json(row)


async def configure_application(db: Database, w: WriteRequest, application_id: str,
                                req: ConfigureApplicationRequest) -> Outcome:
    """Replace every quota at once, guarded by `expected_revision`; audited, with an
    `application.configured` event in the namespace of the credential that configured it."""
    _own(w.principal, application_id)

    async def effect(tx: Tx):
        locked = await tx.one(app_q.lock_for_update(application_id))
        if locked is None:
            raise not_found("application")
        current = int(locked["revision"])
        if int(req.expected_revision) != current:
            raise stale_revision(req.expected_revision, current, "application")
        row = await tx.one(app_q.with_usage(application_id))
        before = application_json(row)
        changes = {**{q: getattr(req, q) for q in QUOTAS}, "revision": current + 1, "updated_at": await tx.now()}
        await tx.defer(app_q.configure(application_id, changes))
        after = application_json({**row, **changes})
        await write_audit(tx, w.actor, namespace_id=w.principal.namespace_id, action="application.configure",
                          resource_type="application", resource_id=application_id, reason=req.reason,
                          before=before, after=after)
        await emit(tx, namespace_id=w.principal.namespace_id, type="application.configured",
                   resource_type="application", resource_id=application_id,
                   data={"application": after, "reason": req.reason})
        return {"application": after}, application_id

    return await idempotent_write(db, w.scope, effect)
