"""The audit log route.

Records span every queue of the namespace (their snapshots included), so reading them needs the
all-queues scope, like the event feed and every list spanning queues.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from ...models import AuditRecordPage
from ..services import audit as svc
from .common import Call, authorized
from .openapi import Envelope, error_responses
from .params import Action, Id, Limit

router = APIRouter(tags=["audit"])



@router.get(
    "/v1/audit-records",
    responses={200: {"model": Envelope[AuditRecordPage]}, **error_responses(400, 401, 403, 503)},
    summary="Audit records of the namespace after a cursor, oldest first",
)
async def list_audit_records(
    call: Call = Depends(authorized("audit:read", all_queues=True)),
    resource_id: Annotated[Id | None, Query(description="only the records of this resource")] = None,
    action: Annotated[Action | None, Query(description="only this action, e.g. queue.configure")] = None,
    after: Annotated[Id | None, Query(description="the last id seen (next_after of the previous page)")] = None,
    limit: Annotated[Limit, Query()] = svc.DEFAULT_LIMIT,
):
    who = call.who
    items, next_after = await svc.list_audit_records(call.db, who, resource_id=resource_id, action=action,
                                                     after_id=after, limit=limit)
    return call.answer({"items": items, "next_after": next_after})
