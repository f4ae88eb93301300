"""The audit log route (operations.md, "Audit").

Records span every queue of the namespace (their snapshots included), so reading them needs the
all-queues scope, like the event feed and every list spanning queues (README, authorization).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from ...models import AuditRecordPage
from ..services import audit as svc
from .common import Call, authenticated
from .openapi import Envelope, error_responses

router = APIRouter(tags=["audit"])

_ID_SCHEMA = {"pattern": "^[0-9a-f]{32}$", "minLength": 32, "maxLength": 32}


@router.get(
    "/v1/audit-records",
    responses={200: {"model": Envelope[AuditRecordPage]}, **error_responses(400, 401, 403, 503)},
    summary="Audit records of the namespace after a cursor, oldest first",
)
async def list_audit_records(
    call: Call = Depends(authenticated),
    resource_id: str | None = Query(None, description="only the records of this resource",
                                    json_schema_extra=_ID_SCHEMA),
    action: str | None = Query(None, description="only this action, e.g. queue.configure",
                               json_schema_extra={"pattern": svc.ACTION_PATTERN, "maxLength": svc.ACTION_MAX}),
    after: str | None = Query(None, description="the last id seen (next_after of the previous page)",
                              json_schema_extra=_ID_SCHEMA),
    limit: int = Query(svc.DEFAULT_LIMIT, ge=1, le=svc.MAX_LIMIT),
):
    who = call.require("audit:read", all_queues=True)
    items, next_after = await svc.list_audit_records(call.db, who, resource_id=resource_id, action=action,
                                                     after_id=after, limit=limit)
    return call.answer({"items": items, "next_after": next_after})
