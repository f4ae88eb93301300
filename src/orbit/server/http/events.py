"""The event feed route."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from ...models import EventPage
from ..services import events as svc
from .admission import WaitingWithoutSlot
from .common import Call, authorized
from .openapi import Envelope, error_responses
from .params import EventTypes, Flag, Limit, Seq, number

router = APIRouter(tags=["events"])


@router.get(
    "/v1/events",
    responses={200: {"model": Envelope[EventPage]}, **error_responses(400, 401, 403, 410, 503)},
    summary="Events of the namespace after a cursor, in order; long-polls up to wait_ms when none is newer",
)
async def list_events(
    call: Call = Depends(authorized("events:read", all_queues=True)),
    after: Annotated[Seq, Query(
        description="the last seq seen (next_after of the previous page); 0 for the start")] = "0",
    limit: Annotated[Limit, Query()] = svc.DEFAULT_LIMIT,
    wait_ms: Annotated[number(0, svc.MAX_WAIT_MS), Query()] = 0,
    type: Annotated[list[EventTypes], Query(
        description="event types, repeatable or comma-separated; `schedule.*` for a family")] = [],
    tail: Annotated[Flag, Query(description="read the newest `limit` seqs instead of those after `after` "
                                "(a live view's first page); `next_after` follows on from there")] = False,
):
    who = call.who
    # A long poll holds no admission slot while it waits for events.
    waiter = WaitingWithoutSlot(call.request, call.node.admission, call.node.sequencer)
    return call.answer(await svc.read_events(call.db, who, waiter, after=int(after), limit=limit,
                                             wait_ms=wait_ms, types=type, tail=tail))
