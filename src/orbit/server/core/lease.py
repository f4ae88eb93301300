"""The lease lifecycle as pure decisions: Start, renew, complete, release, recovery, retry-or-fail.

A lease is LEASED (claimed, not started), RUNNING (its Start was authorized) or ENDED.
Each function takes the locked rows' fields and the database clock and says what happens;
the dispatch service writes it. Nothing here does I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from . import states
from .backoff import backoff_ms
from .deadlines import start_deadline_applies

LEASED, RUNNING, ENDED = "LEASED", "RUNNING", "ENDED"
DEFAULT_LEASE_MS = 30_000
MAX_LEASE_MS = 600_000
HEARTBEAT_MS = 10_000
MAX_LATE_REPORTS = 20
# The late evidence a lease keeps with results, encoded: a column holds at most 16 MiB and one
# statement may carry as much, while a report's result alone may take up to a frame (1 MiB).
MAX_LATE_REPORT_BYTES = 1024 * 1024


# What a Start writes on its task's row, not on its lease's, while the lease is live.
START_FIELDS = ("started_at", "start_msg_id", "start_response")
_START_ON_TASK = "start_on_task"  # marks a lease read as started from its task's row


def as_started(lease: Mapping[str, Any], task: Mapping[str, Any]) -> dict[str, Any]:
    """The lease as its Start left it. A Start writes only its task's row: RUNNING, one more
    attempt and its receipt (`START_FIELDS`). A task has at most one live lease, so a lease
    whose row reads LEASED under a RUNNING task is that task's started lease, its rate
    reservation consumed. Rows a Start wrote itself (before the task row kept it) read as they are."""
    out = dict(lease)
    if out["state"] == LEASED and task["state"] == states.RUNNING:
        out.update({f: task[f] for f in START_FIELDS}, state=RUNNING, reserved=False)
        out[_START_ON_TASK] = True
    return out


def start_fields(lease: Mapping[str, Any]) -> dict[str, Any]:
    """What the row of an ending lease gets of its Start, which its task's row kept meanwhile."""
    return {f: lease[f] for f in START_FIELDS} if lease.get(_START_ON_TASK) else {}


class Refusal(NamedTuple):
    """A command refused: the reply's error code and message (and when a retry may succeed)."""

    code: str
    message: str
    retry_after_ms: int | None = None


def is_current(state: str, expires_at: datetime, now: datetime) -> bool:
    """A lease still gives its holder the task: not ended and not expired."""
    return state in (LEASED, RUNNING) and expires_at > now


def keeps_late_report(count: int) -> bool:
    """Whether a lease keeps `count` late reports; later ones are answered, not stored."""
    return count <= MAX_LATE_REPORTS


def keeps_late_result(encoded_bytes: int) -> bool:
    """Whether a late report keeps its result: the lease's late evidence with it stays within
    MAX_LATE_REPORT_BYTES once encoded. Without its result a report is small (its error message
    is at most 4096 characters), so the count alone bounds the rest."""
    return encoded_bytes <= MAX_LATE_REPORT_BYTES


def not_current(outcome: str | None) -> Refusal:
    """Why a lease that is no longer current refuses a command."""
    if outcome == "CANCELLED":
        return Refusal("TASK_CANCELLED", "the task was cancelled")
    if outcome == "START_DEADLINE_EXCEEDED":
        return Refusal("START_DEADLINE_EXCEEDED", "the task's start deadline passed")
    return Refusal("LEASE_EXPIRED", "the lease is no longer current")


def renewed_until(now: datetime, lease_ms: int) -> datetime:
    return now + timedelta(milliseconds=min(lease_ms, MAX_LEASE_MS))


# ---------------------------------------------------------------- Start


class StartVerdict(NamedTuple):
    """`go` (count it on the rate window), `refuse` (nothing written), or `fail_task` (the
    task ends FAILED with `task_code` before it ever started, and the reply says `refusal`)."""

    kind: str
    refusal: Refusal | None = None
    task_code: str | None = None
    task_message: str | None = None


GO = StartVerdict("go")  # the common answer, built once: a verdict per Start is on the hot path


def start_verdict(*, state: str, expires_at: datetime, outcome: str | None, attempts: int,
                  start_deadline_at: datetime | None, deadline_at: datetime | None, paused: bool,
                  now: datetime) -> StartVerdict:
    if state == RUNNING:
        return StartVerdict("refuse", Refusal("STATE_CONFLICT", "the lease was already started by another message"))
    if not is_current(state, expires_at, now):
        return StartVerdict("refuse", not_current(outcome))
    if (start_deadline_at is not None and start_deadline_applies(states.LEASED, attempts)
            and start_deadline_at <= now):
        return StartVerdict("fail_task", Refusal("START_DEADLINE_EXCEEDED", "the task's start deadline passed"),
                            "START_DEADLINE_EXCEEDED", "the start deadline passed before any start")
    if deadline_at is not None and deadline_at <= now:
        return StartVerdict("fail_task", Refusal("LEASE_EXPIRED", "the task's total deadline passed; it ended FAILED"),
                            "DEADLINE_EXCEEDED", "the total deadline passed before the start")
    if paused:
        return StartVerdict("refuse", Refusal("QUEUE_PAUSED", "the queue is paused; retry within the lease", 1000))
    return GO


# ---------------------------------------------------------------- retry or fail


class AfterFailure(NamedTuple):
    """A failed attempt's task: back to WAITING at `next_at`, or FAILED with `code`."""

    retry: bool
    next_at: datetime | None = None
    code: str | None = None
    message: str | None = None


def after_failure(*, attempts: int, max_attempts: int, retryable: bool, cancel_requested: bool,
                  deadline_at: datetime | None, policy: Mapping[str, Any], code: str, message: str,
                  now: datetime, rand: random.Random | None = None) -> AfterFailure:
    """Retry with backoff while the budget and the deadline allow, else fail."""
    if retryable and not cancel_requested and attempts < max_attempts:
        next_at = now + timedelta(milliseconds=backoff_ms(policy, attempts, rand))
        if deadline_at is None or next_at < deadline_at:
            return AfterFailure(True, next_at)
        return AfterFailure(False, code="DEADLINE_EXCEEDED",
                            message=f"no retry fits before the deadline; last error: {message}")
    if retryable and not cancel_requested:
        return AfterFailure(False, code="ATTEMPTS_EXHAUSTED", message=f"attempt budget used up; last error: {message}")
    return AfterFailure(False, code=code, message=message)


# ---------------------------------------------------------------- complete and release


class CompleteVerdict(NamedTuple):
    """What a reported outcome does: `refuse`, `late` (kept as evidence, LEASE_LOST), or ends the
    attempt as `succeeded`, `cancelled`, `deadline` (cancelled after the total deadline: FAILED)
    or `failed` (retry-or-fail with `retryable` and `message`)."""

    kind: str
    refusal: Refusal | None = None
    retryable: bool = True
    message: str | None = None


SUCCEEDED = CompleteVerdict("succeeded")


def complete_verdict(*, state: str, expires_at: datetime, reported: str, error_message: str | None,
                     retryable: bool, cancel_requested: bool, deadline_at: datetime | None,
                     now: datetime) -> CompleteVerdict:
    if state == LEASED and is_current(state, expires_at, now):
        return CompleteVerdict("refuse", Refusal("STATE_CONFLICT",
                                                 "the lease was not started; report needs a Start first"))
    if state != RUNNING or expires_at <= now:
        return CompleteVerdict("late", Refusal(
            "LEASE_LOST", "the lease is no longer current; the report was kept as late evidence"))
    if reported == "succeeded":
        return SUCCEEDED
    if reported == "cancelled" and cancel_requested:
        if deadline_at is not None and deadline_at <= now:
            return CompleteVerdict("deadline", message="the total deadline passed; the worker stopped")
        return CompleteVerdict("cancelled")
    if reported == "cancelled":
        return CompleteVerdict("failed", retryable=False,
                               message="the worker reported cancelled without a cancel request")
    return CompleteVerdict("failed", retryable=retryable, message=error_message or "handler failed")


def release_refusal(*, state: str, expires_at: datetime, outcome: str | None, now: datetime) -> Refusal | None:
    """A lease may be given back only before its Start, while it is current."""
    if state == RUNNING and expires_at > now:
        return Refusal("STATE_CONFLICT", "a started attempt cannot be released; report its outcome")
    if not is_current(state, expires_at, now):
        return not_current(outcome)
    return None


# ---------------------------------------------------------------- recovery


def expired(state: str, expires_at: datetime, now: datetime) -> bool:
    """A lease recovery takes over: still LEASED or RUNNING, past its expiry."""
    return state in (LEASED, RUNNING) and expires_at <= now


def lease_lost_goes_to_review(on_lease_lost: str) -> bool:
    """An attempt that lost its lease while running has an unknown outcome: retry only if the
    task allows it, else a person reviews it."""
    return on_lease_lost != "retry"
