"""Which due tasks a claim takes: dispatch order with priority aging, and resource-key permits.

A claim reads the due, claimable tasks of each base priority in (available_at, acceptance)
order — within one base priority that is also the order of effective priority, since aging
only ever raises an older task — and merges the ten lists here. Nothing here does I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

MAX_PRIORITY = 9
AGING_STEP_S = 60  # due for longer than this: one level higher, and one more per further step
PRIORITIES = tuple(range(MAX_PRIORITY, -1, -1))


def effective_priority(priority: int, available_at: datetime, now: datetime) -> int:
    """The priority a due task is dispatched at: one level higher once due for longer than 60 s,
    one more per further 60 s, never above 9."""
    due_s = (now - available_at).total_seconds()
    if due_s <= AGING_STEP_S:
        return priority
    return min(MAX_PRIORITY, priority + math.ceil(due_s / AGING_STEP_S) - 1)


def in_dispatch_order(rows: Sequence[Any], now: datetime) -> list[Any]:
    """Rows (with `priority`, `available_at`, `id`) sorted as claims take them: effective
    priority first, then the earlier due time, then the earlier acceptance (ids grow with it).
    Within one base priority that is due-time order (aging only ever raises an older task)."""
    if len({r["priority"] for r in rows}) <= 1:
        return sorted(rows, key=lambda r: (r["available_at"], r["id"]))
    return sorted(rows, key=lambda r: (-effective_priority(int(r["priority"]), r["available_at"], now),
                                       r["available_at"], r["id"]))


class KeyRoom(NamedTuple):
    """A resource key's permits as a claim sees them."""

    max_concurrency: int
    in_use: int


class Choice(NamedTuple):
    """What a claim does with the candidates it read: lease `taken`, park `parked` (task index
    -> the saturated key it waits on), and leave the rest for a later claim."""

    taken: list[int]
    parked: dict[int, str]


def choose(candidate_keys: Sequence[Sequence[str]], room: int, keys: dict[str, KeyRoom]) -> Choice:
    """Walk the candidates in dispatch order while `room` (the other layers' grant) lasts: a
    candidate whose every key has a free permit is taken (and holds one of each); one with a
    saturated key is parked on the first such key (in key order), so that the tasks behind it
    are still served and later claims no longer read it."""
    if not any(candidate_keys):
        return Choice(list(range(min(room, len(candidate_keys)))), {})
    in_use = {k: r.in_use for k, r in keys.items()}
    taken: list[int] = []
    parked: dict[int, str] = {}
    for i, task_keys in enumerate(candidate_keys):
        if len(taken) >= room:
            break
        full = next((k for k in sorted(task_keys) if in_use[k] >= keys[k].max_concurrency), None)
        if full is not None:
            parked[i] = full
            continue
        for k in task_keys:
            in_use[k] += 1
        taken.append(i)
    return Choice(taken, parked)


# ---------------------------------------------------------------- node fairness

ACTIVE_WINDOW_S = 10  # a node that claimed on a queue within this is active on it
WANTING_WINDOW_S = 1.0  # a node whose unserved claim is this recent is still waiting (its row is kept fresher)


def is_active(last_claim_at: datetime, now: datetime) -> bool:
    """A node is active on a queue when one of its sessions claimed on it within the last 10 s."""
    return last_claim_at >= now - timedelta(seconds=ACTIVE_WINDOW_S)


def is_waiting(wanting_at: datetime | None, now: datetime) -> bool:
    """A node still waits while its latest unserved claim is recent (`note_due` keeps it so)."""
    return wanting_at is not None and wanting_at >= now - timedelta(seconds=WANTING_WINDOW_S)


def note_due(last_claim_at: datetime | None, wanting_at: datetime | None, wanting: bool, granted: int,
             now: datetime) -> bool:
    """Whether a node's claims on a queue rewrite its row there (`last_claim_at` None: it has none):
    when they were granted permits, when whether it still wants more flips, or when the row is half
    a wanting window old, so that a node that keeps waiting stays seen as waiting by the others."""
    if granted or last_claim_at is None:
        return True
    return wanting != (wanting_at is not None) or last_claim_at < now - timedelta(seconds=WANTING_WINDOW_S / 2)


def fair_share(max_concurrency: int, active_nodes: int) -> int:
    return math.ceil(max_concurrency / max(1, active_nodes))


def fair_room(max_concurrency: int, active_nodes: int, holding: int, others_waiting: bool) -> int | None:
    """How many more leases a node may take while another active node waits: up to its fair
    share. None when fairness does not limit it (one active node, or nobody else waiting)."""
    if active_nodes < 2 or not others_waiting:
        return None
    return max(0, fair_share(max_concurrency, active_nodes) - holding)
