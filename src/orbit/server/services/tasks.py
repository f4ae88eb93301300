"""The producer side of tasks: submit (single and batch), reads, cancel, deadline sweep.

Backlog accounting: the queue's and the application's `unfinished` counters
change in the same transaction as the state change that causes them, with the
usage rows locked in the order queue_usage -> application_usage.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from pydantic import ValidationError

from ...models import CancelTaskRequest, ReviewTaskRequest, SubmitTaskItem, SubmitTaskRequest, omitted_nulls
from ..core import json_values, states
from ..core.admission import TimeRuleError, resolve_times
from ..core.deadlines import next_sweep, sweep_action
from ..core.ids import is_id, new_id
from ..core.dispatch_order import KeyRoom
from ..core.lease import START_FIELDS, as_started
from ..core.limits import QUEUE_FULL, Backlog, admit_in_order
from ..core.timefmt import format_ts, parse_rfc3339
from ..errors import (
    DomainError,
    application_full,
    describe_validation_error,
    idempotency_conflict,
    invalid_argument,
    not_found,
    queue_full,
    state_conflict,
    unauthenticated,
)
from ..store.db import Database
from ..store.dialect import PlanNoLongerHolds
from ..store.queries import credentials as credential_q
from ..store.queries import idempotency as idem_q
from ..store.queries import key_permits as key_q
from ..store.queries import leases as lease_q
from ..store.queries import queues as queue_q
from ..store.queries import tasks as task_q
from ..store.queries import usage as usage_q
from ..store.queries.usage import UsageChanges
from ..store.tx import ReadAhead, Tx
from . import metrics
from .auth import Principal
from .dispatch import ClaimReads, Handoff, claim_within, read_claims_ahead
from .idempotency import IdempotencyScope, Outcome, WriteRequest, insert_records, request_digest
from .outbox import emit_many, write_audit

OP_SUBMIT = "tasks.submit"
OP_SUBMIT_BATCH = "tasks.submit_batch"
OP_CANCEL = "tasks.cancel"
OP_REVIEW = "tasks.review"

DEFAULT_RETRY = {"initial_backoff_ms": 1000, "max_backoff_ms": 60000, "multiplier": 2.0, "jitter": 0.2}
_DEFAULT_RETRY_TEXT = orjson.dumps(DEFAULT_RETRY).decode()  # most tasks name no policy: encoded once


def _j(text: str | None) -> Any:
    return None if text is None else orjson.Fragment(text)


def task_json(row: Any, payload: Any = None) -> dict[str, Any]:
    """The task object of the API. Stored JSON columns pass through unparsed."""
    return {
        "id": row["id"],
        "namespace_id": row["namespace_id"],
        "queue_id": row["queue_id"],
        "schedule_id": row["schedule_id"],
        "trigger_at": format_ts(row["trigger_at"]),
        "state": row["state"],
        "payload": payload,
        "priority": int(row["priority"]),
        "resource_keys": _j(row["resource_keys"]),
        "max_attempts": int(row["max_attempts"]),
        "attempts": int(row["attempts"]),
        "retry": _j(row["retry_policy"]),
        "on_lease_lost": row["on_lease_lost"],
        "available_at": format_ts(row["available_at"]),
        "start_deadline_at": format_ts(row["start_deadline_at"]),
        "deadline_at": format_ts(row["deadline_at"]),
        "cancel_requested": bool(row["cancel_requested"]),
        "result": _j(row["result"]),
        "error": _j(row["error"]),
        "created_at": format_ts(row["created_at"]),
        "updated_at": format_ts(row["updated_at"]),
        "finished_at": format_ts(row["finished_at"]),
    }


def _event(row: Any, type_: str, **extra: Any) -> tuple[str, str, str, str, dict[str, Any]]:
    data = {"task_id": row["id"], "queue_id": row["queue_id"], "state": row["state"], **extra}
    return (row["namespace_id"], type_, "task", row["id"], data)


def _snapshot_without_payload(task: dict[str, Any]) -> dict[str, Any]:
    """Receipts are stored without the payload (immutable, kept on the task) to halve write volume."""
    return {k: v for k, v in task.items() if k != "payload"}


def _submit_receipt(row: dict[str, Any]) -> str | None:
    """What a submit's idempotency record keeps to replay its snapshot besides the task id (its
    resource id): the one field of the snapshot that neither stays on the task row nor is fixed
    at submission, `available_at`, and nothing when that was the acceptance time (no
    `available_at` was asked for), which the task row keeps as `created_at`.

    Tasks are never deleted and their other snapshot fields are either immutable or known at
    submission (WAITING, no attempt, no result, updated when created), so the snapshot is
    rebuilt from the row (`_rehydrate`) instead of stored with every receipt."""
    if row["available_at"] == row["created_at"]:
        return None
    return orjson.dumps({"submitted": {"id": row["id"], "available_at": format_ts(row["available_at"])}}).decode()


def receipt_snapshot(response: str | None, task_id: str) -> dict[str, Any]:
    """The task snapshot of a submit's record (its response and resource id): a stub for
    `_rehydrate` to complete."""
    submitted = orjson.loads(response)["submitted"] if response is not None else {"id": task_id}
    return {"id": submitted["id"], _AS_SUBMITTED: submitted}


_AS_SUBMITTED = "_as_submitted"  # marks a stub; task objects have no such field
_AT_SUBMISSION = {"state": states.WAITING, "attempts": 0, "cancel_requested": False, "result": None, "error": None,
                  "finished_at": None}


async def _rehydrate(tx: Tx, snapshots: list[dict[str, Any]]) -> None:
    """Complete stored task snapshots in place before replaying them: put their payloads back,
    and rebuild stubs from their task rows as they were at submission."""
    ids = sorted({s["id"] for s in snapshots if "payload" not in s})
    if not ids:
        return
    stubs = any(_AS_SUBMITTED in s for s in snapshots)
    rows = await tx.rows(task_q.for_replay(ids, full=stubs))
    by_id = {r["id"]: r for r in rows}
    for s in snapshots:
        if "payload" in s:
            continue
        row = by_id.get(s["id"])
        submitted = s.pop(_AS_SUBMITTED, None)
        if submitted is not None and row is not None:
            task = task_json({**row, **_AT_SUBMISSION, "updated_at": row["created_at"]}, _j(row["payload"]))
            task["available_at"] = submitted.get("available_at", task["created_at"])
            s.clear()
            s.update(task)
        else:
            s["payload"] = _j(row["payload"]) if row is not None else None


# ------------------------------------------------------------------ submit


@dataclass
class SubmitCommand:
    """One task to admit: its identity, validated request, or the validation error."""

    key: str
    digest: str
    req: SubmitTaskRequest | None
    raw: dict[str, Any] | None = None
    error: DomainError | None = None
    traceparent: str | None = None  # the request's trace context, kept for the worker (not identity)
    payload_text: str | None = None  # the payload as stored, when its size check encoded it already


def submit_digest(queue_id: str, fields: dict[str, Any]) -> str:
    """The same identity whether the task came alone or inside a batch."""
    return request_digest({"queue_id": queue_id}, fields)


def check_payload_size(req: SubmitTaskRequest, limit: int) -> str:
    """The payload as stored (its JSON text), or INVALID_ARGUMENT when it is too large or deep."""
    try:
        return json_values.encode(req.payload, limit).decode()
    except json_values.JsonValueError as exc:
        raise invalid_argument(f"payload: {exc}", "payload") from None


def batch_item_command(queue_id: str, index: int, item: Any, payload_limit: int,
                       traceparent: str | None = None) -> SubmitCommand:
    """Validate one batch item on its own; its errors name `tasks[i].field`."""
    if not isinstance(item, dict):
        return SubmitCommand("", "", None,
                             error=invalid_argument(f"tasks[{index}]: must be a JSON object", f"tasks[{index}]"))
    item = omitted_nulls(SubmitTaskItem, item)
    key = item.get("idempotency_key")
    fields = {k: v for k, v in item.items() if k != "idempotency_key"}
    try:
        # The item model is the request model plus its key: one validation serves both.
        parsed = req = SubmitTaskItem.model_validate(item)
        payload_text = check_payload_size(req, payload_limit)
    except ValidationError as exc:
        err = describe_validation_error(exc)
        field = f"tasks[{index}].{(err.details or {}).get('field', '')}".rstrip(".")
        err = invalid_argument(f"tasks[{index}].{err.message}", field)
        return SubmitCommand(key if isinstance(key, str) else "", "", None, error=err)
    except DomainError as exc:
        return SubmitCommand(parsed.idempotency_key, "", None,
                             error=invalid_argument(f"tasks[{index}].{exc.message}", f"tasks[{index}].payload"))
    return SubmitCommand(parsed.idempotency_key, submit_digest(queue_id, fields), req, fields,
                         traceparent=traceparent, payload_text=payload_text)


@dataclass
class Admission:
    outcome: Outcome | None = None
    error: DomainError | None = None
    row: dict[str, Any] | None = field(default=None, repr=False)  # a new task's stored row

    @property
    def new(self) -> bool:
        """A task was created (not refused, not a replay of an earlier submit)."""
        return self.outcome is not None and not self.outcome.deduplicated


def _new_task_row(
    principal: Principal, queue_id: str, req: SubmitTaskRequest, now: datetime, payload_text: str,
    keys: NamedKeys,
) -> dict[str, Any]:
    times = resolve_times(
        now,
        available_at=req.available_at,
        start_deadline_at=req.start_deadline_at,
        deadline_at=req.deadline_at,
        deadline_seconds=req.deadline_seconds,
    )
    retry_text = _DEFAULT_RETRY_TEXT
    if req.retry is not None:
        retry = req.retry.model_dump()
        if retry["max_backoff_ms"] < retry["initial_backoff_ms"]:
            raise TimeRuleError("retry.max_backoff_ms", "must be at least retry.initial_backoff_ms (default 60000)")
        retry_text = orjson.dumps(retry).decode()
    key_ids, parked_on = keys.resolve(req.resource_keys)
    return {
        "id": new_id(),
        "namespace_id": principal.namespace_id,
        "application_id": principal.application_id,
        "queue_id": queue_id,
        "schedule_id": None,
        "trigger_at": None,
        "state": states.WAITING,
        "payload": payload_text,
        "priority": req.priority,
        "resource_keys": orjson.dumps(req.resource_keys).decode() if req.resource_keys else "[]",
        "max_attempts": req.max_attempts,
        "attempts": 0,
        "retry_policy": retry_text,
        "on_lease_lost": req.on_lease_lost,
        "available_at": times.available_at,
        "start_deadline_at": times.start_deadline_at,
        "deadline_at": times.deadline_at,
        "cancel_requested": False,
        "cancel_reason": None,
        "sweep_at": next_sweep(states.WAITING, 0, times.deadline_at, times.start_deadline_at, False),
        "result": None,
        "error": None,
        "created_at": now,
        "updated_at": now,
        "finished_at": None,
        "resource_key_ids": orjson.dumps(key_ids).decode() if key_ids else None,
        "parked_on": parked_on,
        "traceparent": None,
    }


class NamedKeys:
    """The resource keys a batch of submits names, as read (share-locked) in its first round trip."""

    def __init__(self, rows: list[dict[str, Any]], rooms: list[dict[str, Any]]) -> None:
        self.rows = {r["name"]: r for r in rows}
        room = {r["name"]: KeyRoom(int(r["max_concurrency"]), int(r["permits_in_use"])) for r in rooms}
        self.full = {self.rows[n]["id"] for n, r in room.items() if n in self.rows and r.in_use >= r.max_concurrency}

    def resolve(self, names: list[str]) -> tuple[list[str], str | None]:
        """The keys' ids in the order named, and the key to park the task on at once (one
        without a free permit now), or refuse: every named key must exist and not be retired."""
        if not names:
            return [], None
        ids = []
        for name in names:
            row = self.rows.get(name)
            if row is None:
                raise invalid_argument(f"resource_keys: unknown resource key {name!r}", "resource_keys")
            if row["retired_at"] is not None:
                raise invalid_argument(f"resource_keys: the resource key {name!r} is retired", "resource_keys")
            ids.append(row["id"])
        return ids, next((k for k in sorted(ids) if k in self.full), None)


async def _read_for_admission(
    tx: Tx, principal: Principal, queue_id: str, keys: list[str], *, room: bool, credentials: list[str] = (),
    key_names: list[str] = (),
) -> tuple[dict[str, Any], dict[str, Any], set[str], NamedKeys]:
    """Share-lock the queue row (configure and retire, which take it exclusively, wait for us)
    and read the submit receipts of `keys`, in one round trip. With `room`, the queue also
    carries `room`: an unlocked snapshot of the backlog room left in it and its application.
    Of `credentials`, the ids still unrevoked come back (the third value). The resource keys
    named (`key_names`) are share-locked likewise, and read with their permits."""
    named = sorted(set(key_names))
    reads = [queue_q.share_for_admission(principal.namespace_id, queue_id)]
    if named:
        reads += [key_q.share_named(principal.namespace_id, named), key_q.rooms_named(principal.namespace_id, named)]
    if room:
        reads.append(usage_q.backlog(queue_id, principal.application_id))
    unique = sorted(set(keys))
    if unique:
        reads.append(idem_q.receipts(principal.namespace_id, OP_SUBMIT, unique))
    unique_creds = sorted(set(credentials))
    if unique_creds:
        reads.append(credential_q.unrevoked(unique_creds))
    rows, *rest = await tx.rows_multi(reads)
    named_keys = NamedKeys(rest.pop(0), rest.pop(0)) if named else NamedKeys([], [])
    valid = {r["id"] for r in rest.pop()} if unique_creds else set()
    if not rows:
        if unique_creds and not valid:
            raise unauthenticated()
        raise not_found("queue")
    tx.adopt_clock(rows[0])
    queue = dict(rows[0])
    if room:
        (b,) = rest[0]
        queue["room"] = Backlog(int(b["queue_unfinished"]), int(b["queue_limit"]), int(b["app_unfinished"]),
                                int(b["app_limit"])).room()
    return queue, {r["idem_key"]: r for r in (rest[-1] if unique else [])}, valid, named_keys


@dataclass
class _Candidate:
    index: int
    cmd: SubmitCommand
    row: dict[str, Any]
    task: dict[str, Any] | None = None  # the task object, once accepted


async def admit(
    tx: Tx, principal: Principal, queue_id: str, commands: list[SubmitCommand], *, optimistic: bool = True,
    recheck: list[str | None] | None = None, hold: list[dict[str, Any]] | None = None,
) -> list[Admission]:
    """Admit tasks in order in the caller's transaction: replays first, then the backlog limits.

    Lock order: queue row (shared), then queue_usage, then application_usage. `optimistic`
    writes the tasks first and takes their backlog slots last, so the hot usage rows stay
    locked only until the commit; when they do not all fit it raises `PlanNoLongerHolds`
    (see `Database.lock_last`), except for a lone command, which is refused outright.
    `recheck` names, per command, a credential whose revocation must be checked here (None: the
    request was authenticated against the database already). `hold`: see `_insert_accepted`
    (optimistic admissions only).
    """
    alone = len(commands) == 1
    rechecked = [c for c in recheck or () if c is not None]
    queue, records, unrevoked, named_keys = await _read_for_admission(
        tx, principal, queue_id, [c.key for c in commands if c.req is not None], room=optimistic and not alone,
        credentials=rechecked, key_names=[n for c in commands if c.req is not None for n in c.req.resource_keys])
    now = await tx.now()

    results: list[Admission | None] = [None] * len(commands)
    replays: list[dict[str, Any]] = []
    candidates: list[_Candidate] = []
    first_digest: dict[str, str] = {}
    for i, cmd in enumerate(commands):
        if recheck is not None and recheck[i] is not None and recheck[i] not in unrevoked:
            results[i] = Admission(error=unauthenticated())
            continue
        if cmd.req is None:
            results[i] = Admission(error=cmd.error)
            continue
        prior = records.get(cmd.key)
        if prior is not None:
            if prior["digest"] != cmd.digest:
                results[i] = Admission(error=idempotency_conflict())
                continue
            task = receipt_snapshot(prior["response"], prior["resource_id"])
            replays.append(task)
            results[i] = Admission(outcome=Outcome(True, {"task": task}, task["id"]))
            continue
        if cmd.key in first_digest:  # the same key earlier in this batch: resolved below
            continue
        if queue["retired_at"] is not None:
            results[i] = Admission(error=state_conflict("the queue is retired; it accepts no new tasks"))
            continue
        try:
            row = _new_task_row(principal, queue_id, cmd.req, now,
                                cmd.payload_text or orjson.dumps(cmd.req.payload).decode(), named_keys)
            row["traceparent"] = cmd.traceparent
        except TimeRuleError as exc:
            results[i] = Admission(error=invalid_argument(str(exc), exc.field))
            continue
        except DomainError as exc:
            results[i] = Admission(error=exc)
            continue
        first_digest[cmd.key] = cmd.digest  # a refused item leaves its key free for a later one
        candidates.append(_Candidate(i, cmd, row))

    if optimistic and not alone and len(candidates) > queue["room"]:
        raise PlanNoLongerHolds()  # some will be refused: decide which under the lock
    if optimistic and candidates:
        accepted = candidates
        await _insert_accepted(tx, principal, accepted, now, hold)
        await _take_slots(tx, principal, queue_id, len(accepted), _levels(accepted), alone=alone)
        references = UsageChanges()
        _count_references(references, accepted)
        await references.apply(tx)
    else:
        accepted = await _admit_many(tx, principal, queue, candidates, results)
        if accepted:
            await _insert_accepted(tx, principal, accepted, now)
    for c in accepted:
        results[c.index] = Admission(outcome=Outcome(False, {"task": c.task}, c.row["id"]), row=c.row)

    # Later items reusing a candidate's key replay (or conflict with) it. A candidate refused as
    # QUEUE_FULL/APPLICATION_FULL left no record, and any later new item is refused the same way.
    first_result = {c.cmd.key: results[c.index] for c in candidates}
    for i, cmd in enumerate(commands):
        if results[i] is None:
            first = first_result[cmd.key]
            if first.outcome is None:
                results[i] = first
            elif first_digest[cmd.key] != cmd.digest:
                results[i] = Admission(error=idempotency_conflict())
            else:
                results[i] = Admission(outcome=Outcome(True, first.outcome.data, first.outcome.resource_id))
    await _rehydrate(tx, replays)
    return [r for r in results if r is not None]


def _levels(accepted: list[_Candidate]) -> int:
    """The priority levels of these tasks as a bit mask (claims read the queue's levels only)."""
    mask = 0
    for c in accepted:
        mask |= 1 << int(c.row["priority"])
    return mask


async def _take_slots(tx: Tx, principal: Principal, queue_id: str, n: int, levels: int, *, alone: bool) -> None:
    """Take `n` backlog slots in the queue and the application if both have room. A refusal
    reruns the transaction locked first (`Database.lock_last`), which also tells, in a batch,
    which items still fit; a lone submit is refused outright where the store can tell now."""
    refused = await usage_q.take_backlog_slots(tx, queue_id, principal.application_id, n, levels)
    if refused is None:
        return
    if not alone:
        raise PlanNoLongerHolds()  # the rollback returns whichever slots were taken
    raise _full(refused)


def _full(refused: str) -> DomainError:
    return queue_full() if refused == QUEUE_FULL else application_full()


async def _admit_many(
    tx: Tx, principal: Principal, queue: Any, candidates: list[_Candidate], results: list[Admission | None]
) -> list[_Candidate]:
    """Batch: lock the usage rows once, accept in order until a limit is reached."""
    if not candidates:
        return []
    (u,) = await tx.rows(usage_q.queue_unfinished(queue["id"], lock=True))
    (au,) = await tx.rows(usage_q.application_usage_unfinished(principal.application_id, lock=True))
    (app,) = await tx.rows(usage_q.application_limit(principal.application_id))
    backlog = Backlog(int(u["unfinished"]), int(queue["max_unfinished_tasks"]), int(au["unfinished"]),
                      int(app["max_unfinished_tasks"]))
    accepted: list[_Candidate] = []
    for cand, refused in zip(candidates, admit_in_order(len(candidates), backlog)):
        if refused is None:
            accepted.append(cand)
        else:
            results[cand.index] = Admission(error=_full(refused))
    if accepted:
        usage = UsageChanges()
        usage.add(queue["id"], principal.application_id, unfinished=len(accepted))
        usage.note_levels(queue["id"], _levels(accepted))
        _count_references(usage, accepted)
        await usage.apply(tx)
    return accepted


def _count_references(usage: UsageChanges, accepted: list[_Candidate]) -> None:
    """Each accepted task is one more unfinished task naming each of its resource keys (a key
    cannot be retired while any is)."""
    for c in accepted:
        usage.count_keys(task_q.resource_key_ids(c.row), unfinished=1)


async def _insert_accepted(tx: Tx, principal: Principal, accepted: list[_Candidate], now: datetime,
                           hold: list[dict[str, Any]] | None = None) -> None:
    """Tasks, their receipts and `task.submitted` events, one statement each.
    Sets each candidate's task object. With `hold`, the task rows go there for the caller to write
    later (`_serve_claims`), unless one names resource keys (a claim may park it, with an UPDATE)."""
    records = []
    for c in accepted:
        c.task = task_json(c.row, payload=orjson.Fragment(c.row["payload"]))
        records.append((principal.namespace_id, OP_SUBMIT, c.cmd.key, c.cmd.digest, c.row["id"],
                        _submit_receipt(c.row), now))
    await insert_records(tx, records)
    if hold is not None and not any(c.row["resource_key_ids"] for c in accepted):
        hold.extend(c.row for c in accepted)
    else:
        await task_q.insert(tx, [c.row for c in accepted])
    await emit_many(tx, [_event(c.row, "task.submitted", priority=c.row["priority"]) for c in accepted])


@dataclass(frozen=True)
class QueuedSubmit:
    """One single-task submit waiting to share a transaction with others of its queue."""

    principal: Principal
    queue_id: str
    cmd: SubmitCommand
    verified: bool = True  # False: the credential's revocation is re-checked in the transaction

    @property
    def group(self) -> str:
        """Submits may share a transaction when they meet on the same usage rows and namespace."""
        return f"{self.queue_id}/{self.principal.namespace_id}/{self.principal.application_id}"


async def submit_group(db: Database, group: list[QueuedSubmit],
                       handoff: Handoff | None = None) -> tuple[list[Admission], list[Any] | None]:
    """Single submits of one group that arrived together, admitted in arrival order in one
    transaction: each keeps its own idempotency record, result and error. A lone submit
    is refused outright when full; a larger group decides per task under the lock.

    The `handoff`'s claims (of the group's queue, waiting on this node) are served in the same
    transaction once a task was admitted, after the submits' writes: the tasks are leased as they
    commit, without a claim transaction of their own. Returns the admissions and the claims'
    replies (None: the claims were not served and must run on their own)."""
    first = group[0]
    commands = [q.cmd for q in group]
    recheck = [None if q.verified else q.principal.credential_id for q in group]

    offered = handoff or Handoff(())

    async def body(tx: Tx, optimistic: bool) -> tuple[list[Admission], list[Any] | None]:
        claims = offered.offers()
        # The claims' reads travel with the submit's own: one round trip less before the COMMIT.
        reads = read_claims_ahead(tx, claims) if claims and optimistic else None
        held: list[dict[str, Any]] = []
        admissions = await admit(tx, first.principal, first.queue_id, commands, optimistic=optimistic,
                                 recheck=recheck if any(recheck) else None, hold=held if reads else None)
        return admissions, await _serve_claims(tx, offered, reads, admissions, held, optimistic=optimistic)

    try:
        admissions, served = await db.lock_last(body)
    except DomainError as exc:
        metrics.submitted(0, (exc.code,))
        raise
    metrics.submitted(sum(1 for a in admissions if a.new),
                      [a.error.code for a in admissions if a.error is not None])
    return admissions, served


async def _serve_claims(tx: Tx, handoff: Handoff, reads: ClaimReads | None, admissions: list[Admission],
                        held: list[dict[str, Any]], *, optimistic: bool) -> list[Any] | None:
    """Serve the `handoff`'s waiting claims once a task was admitted, then write the task rows
    `admit` held back for them: a task leased here is inserted LEASED rather than inserted and
    then updated. The claims' replies, or None when they were not served."""
    served = None
    claims = handoff.offers()
    if claims and any(a.new for a in admissions):
        served = await claim_within(tx, claims, optimistic=optimistic, reads=reads,
                                    arrived=await _arrived(tx, admissions), unwritten={r["id"]: r for r in held})
    await task_q.insert(tx, held)
    handoff.answer_as_commit_goes(tx, served)
    return served


async def _arrived(tx: Tx, admissions: list[Admission]) -> list[dict[str, Any]]:
    """The new tasks a claim may take at once, as its read of due tasks would show them."""
    now = await tx.now()
    rows = (task_q.claim_row(a.row, now) for a in admissions if a.new and a.row is not None)
    return [r for r in rows if r is not None]


def _item_json(a: Admission) -> dict[str, Any]:
    if a.error is not None:
        return {"error": {"code": a.error.code, "message": a.error.message}}
    assert a.outcome is not None
    return {"deduplicated": a.outcome.deduplicated, **a.outcome.data}


async def submit_batch(
    db: Database, principal: Principal, queue_id: str, scope: IdempotencyScope, commands: list[SubmitCommand],
    handoff: Handoff | None = None, *, verified: bool = True,
) -> tuple[Outcome, list[Any] | None]:
    """One transaction for the whole batch; the batch key only recognises a replay of the batch.

    Every item has its own key and receipt, so the batch's record refers to those receipts
    instead of repeating their snapshots, and it is inserted with the commit rather than
    reserved first and rewritten.

    The `handoff`'s claims (of the queue, waiting on this node) are served in the same
    transaction once an item was admitted, as `submit_group` serves them: returns the outcome
    and the claims' replies (None: they were not served and must run on their own).

    Unless the request was `verified` against the database, the credential's revocation is
    checked with the transaction's first round trip, before anything (a replay too) is
    answered: UNAUTHENTICATED then."""
    from .idempotency import lookup, record_new

    offered = handoff or Handoff(())

    async def body(tx: Tx, optimistic: bool) -> tuple[Outcome, list[Any] | None]:
        unrevoked = None if verified else tx.read_ahead([credential_q.unrevoked([principal.credential_id])])
        claims = offered.offers()
        reads = read_claims_ahead(tx, claims) if claims and optimistic else None
        try:
            previous = await lookup(tx, scope)
        except DomainError:  # a key conflict: a revoked credential hears that it is revoked instead
            await _still_unrevoked(tx, unrevoked)
            raise
        await _still_unrevoked(tx, unrevoked)
        if previous is not None:
            replay = await _replay_batch(tx, scope, previous)
            if replay is not None:
                return replay, None
            # Its item receipts were pruned, so the batch record (written with them) is past
            # its retention too: the batch runs as new, as each of its items would alone.
            await tx.defer(idem_q.delete(scope.namespace_id, scope.operation, scope.key))
        held: list[dict[str, Any]] = []
        results = await admit(tx, principal, queue_id, commands, optimistic=optimistic, hold=held if reads else None)
        items = [_item_json(a) for a in results]
        stored = [{"deduplicated": a.outcome.deduplicated, "ref": c.key} if a.outcome is not None else i
                  for a, c, i in zip(results, commands, items)]
        await record_new(tx, scope, {"results": stored}, queue_id)
        served = await _serve_claims(tx, offered, reads, results, held, optimistic=optimistic)
        return Outcome(False, {"results": items}, queue_id), served

    outcome, served = await db.lock_last(body)
    if not outcome.deduplicated:
        items = outcome.data["results"]
        metrics.submitted(new_tasks(outcome), [i["error"]["code"] for i in items if "error" in i])
    return outcome, served


async def _still_unrevoked(tx: Tx, unrevoked: ReadAhead | None) -> None:
    if unrevoked is not None and not (await tx.rows_ahead(unrevoked))[0]:
        raise unauthenticated()


def new_tasks(outcome: Outcome) -> int:
    """How many tasks a batch's outcome created (none for a replay of the batch)."""
    if outcome.deduplicated:
        return 0
    return sum(1 for i in outcome.data["results"] if "task" in i and not i["deduplicated"])


async def _replay_batch(tx: Tx, scope: IdempotencyScope, previous: Outcome) -> Outcome | None:
    """The stored answer of a batch, its tasks read back from the items' receipts; None when
    one of those receipts is gone."""
    stored = previous.data["results"]
    refs = sorted({r["ref"] for r in stored if "ref" in r})
    receipts: dict[str, dict[str, Any]] = {}
    if refs:
        rows = await tx.rows(idem_q.receipts(scope.namespace_id, OP_SUBMIT, refs))
        receipts = {r["idem_key"]: receipt_snapshot(r["response"], r["resource_id"]) for r in rows}
        if len(receipts) < len(refs):
            return None
    results = []
    snapshots = []
    for r in stored:
        if "ref" in r:
            task = receipts[r["ref"]]
            snapshots.append(task)
            r = {"deduplicated": r["deduplicated"], "task": task}
        results.append(r)
    await _rehydrate(tx, snapshots)
    return Outcome(True, {"results": results}, previous.resource_id)


# ------------------------------------------------------------------ reads


async def _visible_task(tx: Tx, principal: Principal, task_id: str, *, lock: bool = False) -> Any:
    if not is_id(task_id):
        raise not_found("task")
    row = await tx.one(task_q.by_id(principal.namespace_id, task_id, lock=lock))
    if row is None or not principal.can_see_queue(row["queue_id"]):
        raise not_found("task")
    return row


async def get_task(db: Database, principal: Principal, task_id: str) -> dict[str, Any]:
    async def read(tx: Tx):
        if not is_id(task_id):
            raise not_found("task")
        row = await tx.one(task_q.by_id(principal.namespace_id, task_id, payload=True))
        if row is None or not principal.can_see_queue(row["queue_id"]):
            raise not_found("task")
        return task_json(row, _j(row["payload"]))

    return await db.read(read)


@dataclass(frozen=True)
class TaskFilter:
    states: tuple[str, ...] = ()
    schedule_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None


def parse_task_filter(
    states_param: list[str], schedule_id: str | None, created_after: str | None, created_before: str | None
) -> TaskFilter:
    for s in states_param:
        if s not in states.ALL_STATES:
            raise invalid_argument(f"state: {s!r} is not one of {', '.join(states.ALL_STATES)}", "state")

    def ts(value: str | None, name: str) -> datetime | None:
        if value is None:
            return None
        try:
            return parse_rfc3339(value)
        except ValueError:
            raise invalid_argument(f"{name}: must be an RFC 3339 timestamp", name) from None

    return TaskFilter(tuple(dict.fromkeys(states_param)), schedule_id, ts(created_after, "created_after"),
                      ts(created_before, "created_before"))


async def list_tasks(
    db: Database, principal: Principal, queue_id: str, flt: TaskFilter, *, limit: int, before_id: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Newest first; the cursor is the last id returned (ids are time-ordered)."""
    principal.require_queue(queue_id)
    page = task_q.page(queue_id, states=flt.states, schedule_id=flt.schedule_id, created_after=flt.created_after,
                       created_before=flt.created_before, before_id=before_id, limit=limit + 1)

    async def read(tx: Tx):
        if not await tx.rows(queue_q.ids_in_namespace(principal.namespace_id, [queue_id])):
            raise not_found("queue")
        return await tx.rows(page)

    rows = await db.read(read)
    items = [task_json(r, _j(r["payload"])) for r in rows[:limit]]
    return items, (items[-1]["id"] if len(rows) > limit else None)


def attempt_json(row: Any) -> dict[str, Any]:
    """An attempt as its lease row (`lease_q.attempts`) and its task's row tell it."""
    lease = as_started(row, {"state": row["task_state"], **{f: row[f"task_{f}"] for f in START_FIELDS}})
    outcome = "RUNNING" if lease["state"] == states.RUNNING else (lease["outcome"] or "RUNNING")
    return {
        "number": int(lease["attempt"]),
        "node_id": lease["worker_node_id"],
        "worker_session_id": lease["session_id"],
        "lease_id": lease["id"],
        "leased_at": format_ts(lease["leased_at"]),
        # While the attempt runs, when its lease lapses unless renewed; after, when it last would have.
        "lease_expires_at": format_ts(lease["expires_at"]),
        "started_at": format_ts(lease["started_at"]),
        "ended_at": format_ts(lease["ended_at"]),
        "outcome": outcome,
        "error": _j(lease["error"]),
        "late_reports": _j(lease["late_reports"]) or [],
    }


async def list_attempts(
    db: Database, principal: Principal, task_id: str, *, limit: int, after_number: int | None
) -> tuple[list[dict[str, Any]], int | None]:
    """Started leases of a task, in attempt order, with any late evidence."""

    async def read(tx: Tx):
        await _visible_task(tx, principal, task_id)
        return await tx.rows(lease_q.attempts(task_id, after_number=after_number, limit=limit + 1))

    rows = await db.read(read)
    items = [attempt_json(r) for r in rows[:limit]]
    return items, (items[-1]["number"] if len(rows) > limit else None)


# ------------------------------------------------------------------ state changes


@dataclass
class TaskChange:
    """What a management write decided for one task; `_task_write` applies and records it."""

    changes: dict[str, Any]
    event: str
    event_data: dict[str, Any]
    usage: UsageChanges = field(default_factory=UsageChanges)
    audit_extra: dict[str, Any] = field(default_factory=dict)


Decide = Callable[[Tx, Any, datetime], Awaitable[TaskChange]]


async def _task_write(db: Database, w: WriteRequest, task_id: str, action: str, reason: str,
                      decide: Decide) -> Outcome:
    """One transaction: lock the task, replay or decide, then the change, counters, audit,
    event and idempotency record together."""
    from .idempotency import lookup, record, reserve

    principal, actor, scope = w.principal, w.actor, w.scope

    async def body(tx: Tx) -> Outcome:
        row = await _visible_task(tx, principal, task_id, lock=True)
        previous = await lookup(tx, scope)
        if previous is not None:
            await _rehydrate(tx, [previous.data["task"]])
            return previous
        await reserve(tx, scope)
        change = await decide(tx, row, await tx.now())
        await tx.defer(task_q.update(task_id, change.changes))
        if "state" in change.changes:  # counted in the metrics below, once committed
            change.usage.count_ended(row["queue_id"], change.changes["state"])
        await change.usage.apply(tx)
        before = _snapshot_without_payload(task_json(row))
        after = _snapshot_without_payload(task_json({**row, **change.changes}))
        await write_audit(
            tx, actor, namespace_id=row["namespace_id"], action=action, resource_type="task",
            resource_id=task_id, reason=reason, before=before, after={**after, **change.audit_extra},
        )
        await emit_many(tx, [_event({**row, **change.changes}, change.event, **change.event_data)])
        await record(tx, scope, {"task": after}, task_id)
        await _rehydrate(tx, [after])
        return Outcome(False, {"task": after}, task_id)

    outcome = await db.transaction(body)
    if not outcome.deduplicated:
        metrics.task_ended(outcome.data["task"]["state"])
    return outcome


async def cancel_task(db: Database, w: WriteRequest, task_id: str, req: CancelTaskRequest) -> Outcome:
    """WAITING/LEASED end CANCELLED now; RUNNING records the request and tells the worker."""

    async def decide(tx: Tx, row: Any, now: datetime) -> TaskChange:
        state = row["state"]
        if state in states.TERMINAL:
            raise state_conflict(f"the task is already {state}", state=state)
        if state == states.NEEDS_REVIEW:
            raise state_conflict("the task awaits review; resolve it with :review", state=state)
        if state == states.RUNNING:
            if row["cancel_requested"]:
                raise state_conflict("a cancel was already requested for this running task", state=state)
            lease = await tx.one(lease_q.live_for_task(task_id))
            if lease is not None:
                await tx.defer(lease_q.request_push(lease["id"]))
            return TaskChange({"cancel_requested": True, "cancel_reason": req.reason, "updated_at": now},
                              "task.cancel_requested", {"reason": req.reason})
        change = TaskChange(
            {"state": states.CANCELLED, "cancel_reason": req.reason, "updated_at": now, "finished_at": now,
             "parked_on": None},
            "task.cancelled", {"reason": req.reason},
        )
        keys = task_q.resource_key_ids(row)
        change.usage.add(row["queue_id"], row["application_id"], unfinished=-1, keys=keys)
        if state == states.LEASED:
            lease = await tx.one(lease_q.live_for_task(task_id))
            if lease is not None:
                await tx.defer(lease_q.end_for_task(lease["id"], states.CANCELLED, now))
                change.usage.add(row["queue_id"], row["application_id"], permits_in_use=-1,
                                 rate_reserved=-1 if lease["reserved"] else 0, keys=keys,
                                 node=lease["worker_node_id"])
        return change

    return await _task_write(db, w, task_id, "task.cancel", req.reason, decide)


async def review_task(db: Database, w: WriteRequest, task_id: str, req: ReviewTaskRequest) -> Outcome:
    """The only way out of NEEDS_REVIEW: a person decides what the unknown outcome was."""

    async def decide(tx: Tx, row: Any, now: datetime) -> TaskChange:
        if row["state"] != states.NEEDS_REVIEW:
            raise state_conflict(f"only NEEDS_REVIEW tasks can be reviewed; the task is {row['state']}",
                                 state=row["state"])
        audit = {"resolution": req.resolution, "evidence": req.evidence}
        if req.resolution == "RETRY":
            if int(row["attempts"]) >= int(row["max_attempts"]):
                raise state_conflict("no attempts are left in the task's budget", attempts=int(row["attempts"]))
            changes = {"state": states.WAITING, "available_at": now, "updated_at": now,
                       "sweep_at": next_sweep(states.WAITING, int(row["attempts"]), row["deadline_at"],
                                              row["start_deadline_at"], False)}
            return TaskChange(changes, "task.reviewed", {"resolution": req.resolution}, audit_extra=audit)
        changes = {"state": req.resolution, "updated_at": now, "finished_at": now}
        if req.resolution == states.FAILED:
            changes["error"] = orjson.dumps({"code": "REVIEWED_FAILED", "message": req.reason}).decode()
        change = TaskChange(changes, "task.reviewed", {"resolution": req.resolution}, audit_extra=audit)
        change.usage.add(row["queue_id"], row["application_id"], unfinished=-1, keys=task_q.resource_key_ids(row))
        return change

    return await _task_write(db, w, task_id, "task.review", req.reason, decide)


async def sweep_deadlines(db: Database, batch: int = 500) -> int:
    """Enforce deadlines without workers: waiting and leased tasks past their total or
    start deadline end FAILED (slot, permit and reservation released in the same
    transaction); running tasks past the total deadline get a cancel request.

    Work is found through `sweep_at` alone (`core/deadlines.py`), which the sweep
    moves on as it goes. Every node runs this; `SKIP LOCKED` divides the rows.
    """
    tallies = metrics.Tallies()

    async def body(tx: Tx) -> int:
        tally = tallies.new()
        now = await tx.now()
        due = await tx.rows(task_q.sweep_due(now, batch))
        if not due:
            return 0
        actions = {r["id"]: sweep_action(r["state"], int(r["attempts"]), r["deadline_at"], r["start_deadline_at"],
                                         bool(r["cancel_requested"]), now) for r in due}
        live = {}
        with_lease = sorted(r["id"] for r in due if r["state"] in (states.LEASED, states.RUNNING)
                            and actions[r["id"]].kind != "reschedule")
        if with_lease:
            for lease in await tx.rows(lease_q.live_for_tasks(with_lease)):
                live[lease["task_id"]] = lease
        usage = UsageChanges()
        events = []
        acted = 0
        for r in due:
            action = actions[r["id"]]
            lease = live.get(r["id"])
            if action.kind == "fail":
                acted += 1
                error = {"code": action.code, "message": action.message}
                await tx.defer(task_q.fail_swept(r["id"], orjson.dumps(error).decode(), now))
                keys = task_q.resource_key_ids(r)
                usage.add(r["queue_id"], r["application_id"], unfinished=-1, keys=keys)
                if lease is not None:
                    await tx.defer(lease_q.end_for_task(lease["id"], action.code, now))
                    usage.add(r["queue_id"], r["application_id"], permits_in_use=-1,
                              rate_reserved=-1 if lease["reserved"] else 0, keys=keys, node=lease["worker_node_id"])
                events.append(_event({**r, "state": states.FAILED}, "task.failed", error=error))
                tally.task_ended(states.FAILED)
                usage.count_ended(r["queue_id"], states.FAILED)
            elif action.kind == "cancel":
                acted += 1
                await tx.defer(task_q.request_cancel_swept(r["id"], action.message, now))
                if lease is not None:
                    await tx.defer(lease_q.request_push(lease["id"]))
                events.append(_event(r, "task.cancel_requested", reason=action.message))
            else:
                await tx.defer(task_q.move_sweep(r["id"], action.next_sweep_at))
        await usage.apply(tx)
        await emit_many(tx, events)
        return acted

    if not await db.any_row(task_q.any_sweep_due()):
        return 0
    acted = await db.transaction(body)
    tallies.publish()
    return acted
