"""Idempotent writes: the generic wrapper every state-changing request goes through.

The placeholder record is inserted *before* the effect so that two concurrent
requests with the same key serialise on its primary key: the second waits for
the first, then finds the committed record and replays it. A rejected request
rolls the placeholder back with everything else, leaving no record.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson

from ..core import json_values
from ..errors import idempotency_conflict, invalid_argument
from ..store.db import Database
from ..store.queries import idempotency as idem_q
from ..store.tx import Tx
from .auth import Principal
from .outbox import Actor


def request_digest(path_params: dict[str, Any], body: Any) -> str:
    """SHA-256 of canonical JSON of the path parameters plus the fields actually sent."""
    try:
        canonical = orjson.dumps({"body": body, "path": path_params}, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:  # deeper than any value the rules admit (json_values.MAX_DEPTH)
        raise invalid_argument(f"body: nested too deeply (at most {json_values.MAX_DEPTH} levels)") from None
    return hashlib.sha256(canonical).hexdigest()


@dataclass(frozen=True)
class IdempotencyScope:
    namespace_id: str
    operation: str
    key: str
    digest: str


@dataclass(frozen=True)
class Outcome:
    """The snapshot a write returned; `deduplicated` is true for a replay."""

    deduplicated: bool
    data: dict[str, Any]
    resource_id: str | None = None


@dataclass(frozen=True)
class WriteRequest:
    """What every management write carries besides its body: who, through which request, and
    under which idempotency scope."""

    principal: Principal
    actor: Actor
    scope: IdempotencyScope


Effect = Callable[[Tx], Awaitable[tuple[dict[str, Any], str | None]]]


async def lookup(tx: Tx, scope: IdempotencyScope) -> Outcome | None:
    """Replay (same digest) or conflict (different digest) for an already used key."""
    row = await tx.one(idem_q.lookup(scope.namespace_id, scope.operation, scope.key))
    if row is None:
        return None
    if row["digest"] != scope.digest:
        raise idempotency_conflict()
    return Outcome(True, orjson.loads(row["response"]), row["resource_id"])


async def reserve(tx: Tx, scope: IdempotencyScope) -> None:
    """Insert the placeholder; a concurrent holder of the key makes us run again and replay."""
    await idem_q.reserve(tx, scope.namespace_id, scope.operation, scope.key, scope.digest, await tx.now())


async def record(tx: Tx, scope: IdempotencyScope, data: dict[str, Any], resource_id: str | None) -> None:
    """Fill in the placeholder, with the transaction's next round trip."""
    await tx.defer(idem_q.record(scope.namespace_id, scope.operation, scope.key, orjson.dumps(data).decode(),
                                 resource_id))


async def insert_records(tx: Tx, rows: list[tuple[Any, ...]]) -> None:
    """Insert finished records (namespace, operation, key, digest, resource id, response, created
    at) with the commit, for keys found free earlier in the transaction; a key taken meanwhile
    runs the transaction again, which then replays it."""
    await idem_q.insert(tx, rows)


async def record_new(tx: Tx, scope: IdempotencyScope, data: dict[str, Any], resource_id: str | None) -> None:
    """The record of a write whose key `lookup` found free (no placeholder round trips)."""
    await insert_records(tx, [(scope.namespace_id, scope.operation, scope.key, scope.digest, resource_id,
                               orjson.dumps(data).decode(), await tx.now())])


async def run_idempotent(tx: Tx, scope: IdempotencyScope, effect: Effect) -> Outcome:
    """Inside an open transaction: replay, or reserve + effect + record."""
    previous = await lookup(tx, scope)
    if previous is not None:
        return previous
    await reserve(tx, scope)
    data, resource_id = await effect(tx)
    await record(tx, scope, data, resource_id)
    return Outcome(False, data, resource_id)


async def idempotent_write(db: Database, scope: IdempotencyScope, effect: Effect) -> Outcome:
    """One transaction: idempotency record, effect, audit and events commit together."""
    return await db.transaction(lambda tx: run_idempotent(tx, scope, effect))


async def prune(db: Database, retention: timedelta, batch: int = 1000) -> int:
    """Delete idempotency records and claim receipts older than the retention period, in bounded batches."""
    total = 0
    for batch_of in (idem_q.prune_records, idem_q.prune_worker_claims):
        while True:

            async def one_batch(tx: Tx, batch_of=batch_of) -> int:
                cutoff = (await tx.now()) - retention
                return await tx.count(batch_of(cutoff, batch))

            n = await db.transaction(one_batch)
            total += n
            if n < batch:
                break
    return total
