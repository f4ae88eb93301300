"""The event feed route (operations.md, "Events")."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from ...models import EventPage
from ..errors import invalid_argument
from ..services import events as svc
from .common import Call, authenticated
from .openapi import Envelope, error_responses

router = APIRouter(tags=["events"])


@router.get(
    "/v1/events",
    responses={200: {"model": Envelope[EventPage]}, **error_responses(400, 401, 403, 410, 503)},
    summary="Events of the namespace after a cursor, in order; long-polls up to wait_ms when none is newer",
)
async def list_events(
    call: Call = Depends(authenticated),
    after: str = Query("0", description="the last seq seen (next_after of the previous page); 0 for the start"),
    limit: int = Query(svc.DEFAULT_LIMIT, ge=1, le=svc.MAX_LIMIT),
    wait_ms: int = Query(0, ge=0, le=svc.MAX_WAIT_MS),
    type: list[str] = Query([], description="event types, repeatable or comma-separated; `schedule.*` for a family"),
    tail: bool = Query(False, description="read the newest `limit` seqs instead of those after `after` "
                       "(a live view's first page); `next_after` follows on from there"),
):
    who = call.require("events:read", all_queues=True)
    if not after.isdigit() or len(after) > 20 or int(after) >= 2**64:
        raise invalid_argument("after: a decimal seq (uint64)", "after")
    return call.answer(await svc.read_events(call.db, who, call.node.sequencer, after=int(after), limit=limit,
                                             wait_ms=wait_ms, types=type, tail=tail))
