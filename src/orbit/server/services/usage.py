"""Counter changes of one transaction, applied to the usage rows in one fixed order.

Rows are written sorted, queues before applications, so that any two
transactions touching the same usage rows take their locks in the same order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import update

from ..core.rate_window import RateWindow
from ..store.db import Tx
from ..store.tables import application_usage, queue_usage


@dataclass
class Delta:
    unfinished: int = 0
    permits: int = 0
    reserved: int = 0

    def is_zero(self) -> bool:
        return not (self.unfinished or self.permits or self.reserved)


class UsageChanges:
    def __init__(self) -> None:
        self.queues: dict[str, Delta] = defaultdict(Delta)
        self.apps: dict[str, Delta] = defaultdict(Delta)
        self.windows: dict[str, RateWindow] = {}

    def add(self, queue_id: str, application_id: str, *, unfinished: int = 0, permits: int = 0, reserved: int = 0) -> None:
        for d in (self.queues[queue_id], self.apps[application_id]):
            d.unfinished += unfinished
            d.permits += permits
            d.reserved += reserved

    def set_window(self, queue_id: str, window: RateWindow) -> None:
        """The queue's rate window after this transaction (its `reserved` is not written here)."""
        self.windows[queue_id] = window

    async def apply(self, tx: Tx) -> None:
        qu, au = queue_usage, application_usage
        for qid in sorted(set(self.queues) | set(self.windows)):
            d = self.queues.get(qid, Delta())
            values: dict = {}
            if d.unfinished:
                values["unfinished"] = qu.c.unfinished + d.unfinished
            if d.permits:
                values["permits_in_use"] = qu.c.permits_in_use + d.permits
            if d.reserved:
                values["rate_reserved"] = qu.c.rate_reserved + d.reserved
            w = self.windows.get(qid)
            if w is not None:
                values["rate_window_start"] = w.start
                values["rate_window_used"] = w.used
            if values:
                await tx.execute(update(qu).where(qu.c.queue_id == qid).values(**values))
        for aid in sorted(self.apps):
            d = self.apps[aid]
            if d.is_zero():
                continue
            values = {}
            if d.unfinished:
                values["unfinished"] = au.c.unfinished + d.unfinished
            if d.permits:
                values["permits_in_use"] = au.c.permits_in_use + d.permits
            if d.reserved:
                values["rate_reserved"] = au.c.rate_reserved + d.reserved
            await tx.execute(update(au).where(au.c.application_id == aid).values(**values))
