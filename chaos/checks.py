"""What a chaos run must have left behind, checked from the database and the handler logs.

Every function here is pure: it takes rows (dicts as the database returns them) and log
records, and returns the problems it finds as sentences. `tests/unit/test_chaos_checks.py`
feeds each one a broken history, so a pass is never vacuous.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests.support.history import max_overlap, rate_windows

UNFINISHED = frozenset({"WAITING", "LEASED", "RUNNING", "NEEDS_REVIEW"})
SETTLED = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "NEEDS_REVIEW"})
ACTIVE = frozenset({"LEASED", "RUNNING"})
FAR = datetime(9999, 1, 1)


@dataclass
class Limits:
    """The configured limits of every layer (fixed for the whole run)."""

    queues: dict[str, tuple[int, int]]  # queue id -> (max_concurrency, rate_per_second)
    application: tuple[int, int]
    keys: dict[str, int]  # resource key id -> max_concurrency
    backlogs: dict[str, int] = field(default_factory=dict)  # queue id, or "application" -> max_unfinished_tasks


@dataclass
class History:
    """Everything the checks read: the run's rows, the producers' answers, the handlers' log."""

    tasks: list[dict[str, Any]]
    leases: list[dict[str, Any]]
    limits: Limits
    accepted: dict[str, str]  # idempotency key -> task id the producers were told
    answers: dict[str, list[str]] = field(default_factory=dict)  # key -> every task id answered for it
    executions: list[dict[str, Any]] = field(default_factory=list)
    idempotency: dict[str, str] = field(default_factory=dict)  # key -> resource id stored for it


def key_ids(task: Mapping[str, Any]) -> tuple[str, ...]:
    raw = task.get("resource_key_ids")
    return tuple(json.loads(raw)) if raw else ()


# ------------------------------------------------------------------ identities


def check_identities(h: History) -> list[str]:
    """Every accepted key has exactly one task, the one every answer for that key named."""
    problems = []
    for key, ids in h.answers.items():
        if len(set(ids)) > 1:
            problems.append(f"key {key} was answered with different tasks {sorted(set(ids))}")
    task_ids = Counter(t["id"] for t in h.tasks)
    accepted_ids = Counter(h.accepted.values())
    for tid, n in accepted_ids.items():
        if n > 1:
            problems.append(f"task {tid} was answered for {n} different keys")
    missing = sorted(set(accepted_ids) - set(task_ids))
    if missing:
        problems.append(f"{len(missing)} accepted tasks are not in the database (lost): {missing[:5]}")
    extra = sorted(set(task_ids) - set(accepted_ids))
    if extra:
        problems.append(f"{len(extra)} tasks in the database were never acknowledged to a producer "
                        f"(a key with two tasks, or an unknown writer): {extra[:5]}")
    for key, tid in h.accepted.items():
        stored = h.idempotency.get(key)
        if h.idempotency and stored != tid:
            problems.append(f"key {key}: idempotency record names {stored}, producer was told {tid}")
    return problems


# ------------------------------------------------------------------ outcomes


def _by_task(leases: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for lease in leases:
        out[lease["task_id"]].append(lease)
    for ls in out.values():
        ls.sort(key=lambda lease: (lease["leased_at"], lease["attempt"]))
    return out


def check_settled(h: History) -> list[str]:
    """No task lost in a non-final state once the run has drained."""
    stuck = [(t["id"], t["state"]) for t in h.tasks if t["state"] not in SETTLED]
    return [f"{len(stuck)} tasks stuck: {stuck[:5]}"] if stuck else []


def check_outcomes(h: History) -> list[str]:
    """Each task's end follows from its frozen policy and its attempts' history.

    * a task that succeeded has exactly one SUCCEEDED attempt, its last;
    * `NEEDS_REVIEW` exactly when the task's policy is `review` and its last started attempt
      lost its lease, and no attempt followed a lost one under that policy;
    * `FAILED` only for a planned permanent failure or a used-up attempt budget;
    * `attempts` counts the started leases.
    """
    problems = []
    leases = _by_task(h.leases)
    for t in h.tasks:
        ls = leases.get(t["id"], [])
        started = [lease for lease in ls if lease["started_at"] is not None]
        if int(t["attempts"]) != len(started):
            problems.append(f"task {t['id']}: attempts={t['attempts']} but {len(started)} started leases")
        for lease in ls:
            if lease["started_at"] is None and lease["outcome"] in ("SUCCEEDED", "FAILED", "LEASE_LOST"):
                problems.append(f"lease {lease['id']} ended {lease['outcome']} without a Start")
        succeeded = [lease for lease in ls if lease["outcome"] == "SUCCEEDED"]
        state = t["state"]
        if state == "SUCCEEDED" and (len(succeeded) != 1 or succeeded[0] is not ls[-1]):
            problems.append(f"task {t['id']} SUCCEEDED with {len(succeeded)} succeeded attempts")
        if state != "SUCCEEDED" and succeeded:
            problems.append(f"task {t['id']} is {state} but an attempt succeeded")
        lost = [lease for lease in started if lease["outcome"] == "LEASE_LOST"]
        review = t["on_lease_lost"] == "review"
        last_lost = bool(started) and started[-1]["outcome"] == "LEASE_LOST"
        if state == "NEEDS_REVIEW" and not (review and last_lost):
            problems.append(f"task {t['id']} is NEEDS_REVIEW but policy={t['on_lease_lost']} "
                            f"last attempt={started[-1]['outcome'] if started else None}")
        if review and lost and (state != "NEEDS_REVIEW" or lost[0] is not ls[-1]):
            problems.append(f"task {t['id']} (review) lost a started lease but is {state} "
                            f"with {len(ls) - ls.index(lost[0]) - 1} leases after it")
        if state == "FAILED":
            payload = json.loads(t["payload"]) if isinstance(t["payload"], str) else t["payload"]
            exhausted = int(t["attempts"]) >= int(t["max_attempts"])
            if not (payload.get("perm") or exhausted):
                problems.append(f"task {t['id']} FAILED without a planned permanent failure or an exhausted budget")
    return problems


def check_executions(h: History) -> list[str]:
    """A handler ran only under a Start, once per attempt, and again only after a recorded end.

    Every `begin` names a lease the database started for that task and attempt; no lease ran
    twice; a succeeded or handler-failed attempt has the handler's matching `end`; and a task
    ran more than once only where each earlier attempt ended FAILED (its handler's report) or
    LEASE_LOST (a loss the database recorded).
    """
    problems = []
    lease_by_id = {lease["id"]: lease for lease in h.leases}
    begins: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in h.executions:
        (begins if e["ev"] == "begin" else ends)[e["lease"]].append(e)
    for lid, bs in begins.items():
        lease = lease_by_id.get(lid)
        if lease is None:
            problems.append(f"handler ran under lease {lid}, which the database does not have")
            continue
        if lease["started_at"] is None:
            problems.append(f"handler ran under lease {lid} without a Start (outcome {lease['outcome']})")
        if bs[0]["task"] != lease["task_id"] or int(bs[0]["attempt"]) != int(lease["attempt"]):
            problems.append(f"lease {lid}: handler saw task {bs[0]['task']} attempt {bs[0]['attempt']}, "
                            f"database has {lease['task_id']} attempt {lease['attempt']}")
        if len(bs) > 1:
            problems.append(f"lease {lid} ran its handler {len(bs)} times")
    for lease in h.leases:
        outcome, got = lease["outcome"], [e["outcome"] for e in ends.get(lease["id"], [])]
        if outcome == "SUCCEEDED" and got != ["ok"]:
            problems.append(f"lease {lease['id']} SUCCEEDED but its handler logged {got or 'no end'}")
        if outcome == "FAILED" and got not in (["error"], ["cancelled"]):
            problems.append(f"lease {lease['id']} FAILED but its handler logged {got or 'no end'}")
    ran: dict[str, list[str]] = defaultdict(list)
    for lid, bs in begins.items():
        ran[bs[0]["task"]].append(lid)
    for tid, lids in ran.items():
        ordered = sorted((lease_by_id[lid] for lid in lids if lid in lease_by_id), key=lambda x: x["attempt"])
        for earlier in ordered[:-1]:
            if earlier["outcome"] not in ("FAILED", "LEASE_LOST"):
                problems.append(f"task {tid} ran again after attempt {earlier['attempt']} ended "
                                f"{earlier['outcome']} (no loss or failure recorded)")
    return problems


# ------------------------------------------------------------------ limits


def _held(lease: Mapping[str, Any]) -> tuple[datetime, datetime]:
    """A lease holds its permits from its claim to its end (an open one: to the end of time)."""
    return lease["leased_at"], lease["ended_at"] or FAR


def check_limits(h: History) -> list[str]:
    """Overlapping permits and Starts per window within every layer: queue, application, key."""
    problems = []
    task_keys = {t["id"]: key_ids(t) for t in h.tasks}
    by_queue: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    by_key: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for lease in h.leases:
        by_queue[lease["queue_id"]].append(lease)
        for k in task_keys.get(lease["task_id"], ()):
            by_key[k].append(lease)

    def layer(name: str, leases: Sequence[Mapping[str, Any]], concurrency: int, rate: int | None) -> None:
        overlap = max_overlap(_held(lease) for lease in leases)
        if overlap > concurrency:
            problems.append(f"{name}: {overlap} permits held at once, limit {concurrency}")
        if rate is not None:
            windows = rate_windows(lease["started_at"] for lease in leases if lease["started_at"] is not None)
            worst = max(windows, default=0)
            if worst > rate:
                problems.append(f"{name}: {worst} Starts in one window, limit {rate}")

    for qid, (concurrency, rate) in h.limits.queues.items():
        layer(f"queue {qid}", by_queue.get(qid, []), concurrency, rate)
    layer("application", h.leases, *h.limits.application)
    for kid, concurrency in h.limits.keys.items():
        layer(f"resource key {kid}", by_key.get(kid, []), concurrency, None)
    for tid, ls in _by_task(h.leases).items():
        if max_overlap(_held(lease) for lease in ls) > 1:
            problems.append(f"task {tid} was leased twice at once")
    return problems


def check_backlogs(unfinished: Mapping[str, int], limits: Mapping[str, int], at: str) -> list[str]:
    """Unfinished tasks counted in one consistent snapshot within each backlog limit.

    Backlogs are checked on snapshots, not on `created_at`/`finished_at`: an admission reads
    the database clock before it waits for the usage row that an ending task holds, so its
    `created_at` can precede the `finished_at` of the task whose slot it took."""
    return [f"{at} backlog of {layer}: {unfinished.get(layer, 0)} unfinished tasks, limit {limit}"
            for layer, limit in limits.items() if unfinished.get(layer, 0) > limit]


# ------------------------------------------------------------------ counters


@dataclass
class Snapshot:
    """The usage rows and the rows they count, read in one consistent database snapshot."""

    at: datetime
    queue_usage: dict[str, dict[str, Any]]
    app_usage: dict[str, Any]
    key_usage: dict[str, dict[str, Any]]
    tasks: list[dict[str, Any]]  # id, queue_id, state, resource_key_ids
    leases: list[dict[str, Any]]  # task_id, queue_id, state, reserved, started_at, worker_node_id
    queue_nodes: list[dict[str, Any]] = field(default_factory=list)


def recount(s: Snapshot) -> list[str]:
    """Every counter equals a recount of the rows it counts, at the same instant."""
    problems = []
    keys_of = {t["id"]: key_ids(t) for t in s.tasks}
    want_q: dict[str, Counter] = defaultdict(Counter)
    want_app: Counter = Counter()
    want_k: dict[str, Counter] = defaultdict(Counter)
    for t in s.tasks:
        q = want_q[t["queue_id"]]
        if t["state"] in UNFINISHED:
            q["unfinished"] += 1
            want_app["unfinished"] += 1
            for k in keys_of[t["id"]]:
                want_k[k]["unfinished"] += 1
        if t["state"] == "SUCCEEDED":
            q["succeeded_total"] += 1
        elif t["state"] == "FAILED":
            q["failed_total"] += 1
    in_flight: Counter = Counter()
    for lease in s.leases:
        q = want_q[lease["queue_id"]]
        if lease["started_at"] is not None:
            q["started_total"] += 1
        if lease["state"] in ACTIVE:
            q["permits_in_use"] += 1
            want_app["permits_in_use"] += 1
            in_flight[(lease["queue_id"], lease["worker_node_id"])] += 1
            for k in keys_of.get(lease["task_id"], ()):
                want_k[k]["permits_in_use"] += 1
            if lease["state"] == "LEASED" and lease["reserved"]:
                q["rate_reserved"] += 1
                want_app["rate_reserved"] += 1
    at = s.at.isoformat(timespec="milliseconds")
    columns = ("unfinished", "permits_in_use", "rate_reserved", "started_total", "succeeded_total", "failed_total")
    for qid, row in s.queue_usage.items():
        for c in columns:
            if int(row[c]) != want_q[qid][c]:
                problems.append(f"{at} queue {qid} {c}={row[c]}, recount {want_q[qid][c]}")
    for c in ("unfinished", "permits_in_use", "rate_reserved"):
        if int(s.app_usage[c]) != want_app[c]:
            problems.append(f"{at} application {c}={s.app_usage[c]}, recount {want_app[c]}")
    for kid, row in s.key_usage.items():
        for c in ("unfinished", "permits_in_use"):
            if int(row[c]) != want_k[kid][c]:
                problems.append(f"{at} resource key {kid} {c}={row[c]}, recount {want_k[kid][c]}")
    for row in s.queue_nodes:
        got, want = int(row["in_flight"]), in_flight[(row["queue_id"], row["worker_node_id"])]
        if got != want:
            problems.append(f"{at} queue {row['queue_id']} node {row['worker_node_id']} in_flight={got}, recount {want}")
    return problems


def check_all(h: History) -> dict[str, list[str]]:
    return {"identities": check_identities(h), "settled": check_settled(h), "outcomes": check_outcomes(h),
            "executions": check_executions(h), "limits": check_limits(h)}
