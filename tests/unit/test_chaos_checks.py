"""The chaos run's end checks catch each kind of broken history (no vacuous pass)."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta

import pytest

from chaos import checks
from chaos.faults import KINDS, RESTART_DB, plan

T0 = datetime(2026, 12, 1, 12, 0, 0)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def task(tid, state, *, policy="retry", attempts=1, max_attempts=5, keys=(), created=0.0, finished=None, **payload):
    return {"id": tid, "queue_id": "q1", "state": state, "attempts": attempts, "max_attempts": max_attempts,
            "on_lease_lost": policy, "payload": json.dumps({"k": f"key-{tid}", **payload}),
            "resource_key_ids": json.dumps(list(keys)) if keys else None, "created_at": at(created),
            "finished_at": None if finished is None else at(finished)}


def lease(lid, tid, attempt, leased, started, ended, outcome, state="ENDED"):
    return {"id": lid, "task_id": tid, "queue_id": "q1", "attempt": attempt, "state": state, "reserved": 0,
            "leased_at": at(leased), "started_at": None if started is None else at(started),
            "ended_at": None if ended is None else at(ended), "outcome": outcome, "worker_node_id": "w1",
            "late_reports": None}


def run(lid, tid, attempt, outcome=None):
    out = [{"ev": "begin", "task": tid, "attempt": attempt, "lease": lid}]
    if outcome:
        out.append({"ev": "end", "task": tid, "attempt": attempt, "lease": lid, "outcome": outcome})
    return out


def good() -> checks.History:
    """Three tasks: one plain success, one that went to review after a lost lease, one that
    lost a lease under the retry policy and then succeeded (its handler ran twice)."""
    tasks = [task("t1", "SUCCEEDED", keys=("k1",), finished=1.0),
             task("t2", "NEEDS_REVIEW", policy="review", created=0.1),
             task("t3", "SUCCEEDED", attempts=2, keys=("k1",), created=0.2, finished=3.0)]
    leases = [lease("l1", "t1", 1, 0.1, 0.2, 1.0, "SUCCEEDED"),
              lease("l2", "t2", 1, 0.2, 0.3, 2.0, "LEASE_LOST"),
              lease("l3", "t3", 1, 1.1, 1.2, 1.9, "LEASE_LOST"),
              lease("l4", "t3", 2, 2.1, 2.2, 3.0, "SUCCEEDED")]
    executions = run("l1", "t1", 1, "ok") + run("l2", "t2", 1) + run("l3", "t3", 1, "ok") + run("l4", "t3", 2, "ok")
    limits = checks.Limits(queues={"q1": (2, 2)}, application=(2, 2), keys={"k1": 1},
                           backlogs={"q1": 3, "application": 3})
    accepted = {"key-t1": "t1", "key-t2": "t2", "key-t3": "t3"}
    return checks.History(tasks=tasks, leases=leases, limits=limits, accepted=accepted,
                          answers={k: [v, v] for k, v in accepted.items()}, executions=executions,
                          idempotency=dict(accepted))


def problems(h: checks.History) -> list[str]:
    return [p for ps in checks.check_all(h).values() for p in ps]


def test_a_sound_history_passes():
    assert problems(good()) == []


def _lease(h, lid):
    return next(x for x in h.leases if x["id"] == lid)


def _task(h, tid):
    return next(x for x in h.tasks if x["id"] == tid)


BREAKS = {
    "an accepted task is missing": (lambda h: h.tasks.pop(0), "not in the database"),
    "a key answered with two tasks": (lambda h: h.answers["key-t1"].append("t9"), "answered with different tasks"),
    "a task nobody was told of": (lambda h: h.tasks.append(task("t9", "SUCCEEDED", finished=0.5)),
                                  "never acknowledged"),
    "the idempotency record names another task": (lambda h: h.idempotency.update({"key-t1": "t2"}),
                                                  "idempotency record names"),
    "a task stuck RUNNING": (lambda h: _task(h, "t1").update(state="RUNNING"), "stuck"),
    "review under the retry policy": (lambda h: _task(h, "t2").update(on_lease_lost="retry"), "NEEDS_REVIEW but"),
    "an attempt after a loss under review": (
        lambda h: (_task(h, "t3").update(on_lease_lost="review")), "lost a started lease"),
    "attempts not counting the Starts": (lambda h: _task(h, "t1").update(attempts=2), "started leases"),
    "FAILED without a reason": (lambda h: (_task(h, "t1").update(state="FAILED"),
                                           _lease(h, "l1").update(outcome="FAILED")), "FAILED without"),
    "a handler run without a Start": (lambda h: _lease(h, "l1").update(started_at=None), "without a Start"),
    "a lease run twice": (lambda h: h.executions.extend(run("l1", "t1", 1)), "ran its handler 2 times"),
    "a run under an unknown lease": (lambda h: h.executions.extend(run("l9", "t1", 3)), "does not have"),
    "a success the handler never logged": (lambda h: h.executions.pop(1), "SUCCEEDED but its handler logged"),
    "a second run after an attempt that did not fail": (
        lambda h: _lease(h, "l3").update(outcome="EXPIRED"), "ran again after attempt 1"),
    "queue concurrency exceeded": (lambda h: h.limits.queues.update(q1=(1, 9)), "permits held at once"),
    "application rate exceeded": (lambda h: h.leases.extend([
        lease("l5", "t1", 9, 0.15, 0.25, 0.26, "RELEASED"), lease("l6", "t1", 9, 0.26, 0.27, 0.28, "RELEASED")]),
        "Starts in one window"),
    "resource key concurrency exceeded": (lambda h: _lease(h, "l3").update(leased_at=at(0.5)),
                                          "resource key k1: 2 permits"),
    "a task leased twice at once": (lambda h: _lease(h, "l4").update(leased_at=at(1.5)), "leased twice at once"),
}


def test_backlog_over_its_limit_is_caught():
    assert checks.check_backlogs({"q1": 3, "application": 3}, {"q1": 3, "application": 3}, "t") == []
    found = checks.check_backlogs({"q1": 4, "application": 4}, {"q1": 3, "application": 5}, "t")
    assert found == ["t backlog of q1: 4 unfinished tasks, limit 3"]


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_each_broken_history_is_caught(name):
    h = copy.deepcopy(good())
    breaker, expected = BREAKS[name]
    breaker(h)
    found = problems(h)
    assert any(expected in p for p in found), (name, found)


def snapshot(**usage) -> checks.Snapshot:
    row = {"unfinished": 1, "permits_in_use": 1, "rate_reserved": 1, "started_total": 1,
           "succeeded_total": 1, "failed_total": 0}
    row.update(usage)
    return checks.Snapshot(
        at=T0, queue_usage={"q1": row}, app_usage={"unfinished": 1, "permits_in_use": 1, "rate_reserved": 1},
        key_usage={"k1": {"unfinished": 1, "permits_in_use": 1}},
        tasks=[{"id": "t1", "queue_id": "q1", "state": "SUCCEEDED", "resource_key_ids": None},
               {"id": "t2", "queue_id": "q1", "state": "LEASED", "resource_key_ids": '["k1"]'}],
        leases=[{"task_id": "t1", "queue_id": "q1", "state": "ENDED", "reserved": 0, "started_at": T0,
                 "worker_node_id": "w1"},
                {"task_id": "t2", "queue_id": "q1", "state": "LEASED", "reserved": 1, "started_at": None,
                 "worker_node_id": "w1"}],
        queue_nodes=[{"queue_id": "q1", "worker_node_id": "w1", "in_flight": 1}])


def test_recount_agrees_with_matching_counters():
    assert checks.recount(snapshot()) == []


@pytest.mark.parametrize("column", ["unfinished", "permits_in_use", "rate_reserved", "started_total",
                                    "succeeded_total", "failed_total"])
def test_recount_catches_a_drifted_counter(column):
    s = snapshot(**{column: 7})
    assert any(f"{column}=7" in p for p in checks.recount(s))


def test_recount_catches_application_key_and_node_drift():
    s = snapshot()
    s.app_usage["permits_in_use"] = 0
    s.key_usage["k1"]["unfinished"] = 2
    s.queue_nodes[0]["in_flight"] = 3
    found = checks.recount(s)
    assert len(found) == 3, found


def test_fault_plan_is_replayable_and_bounded():
    a = plan(600, seed=7, nodes=3, workers=3, every=6, db_restarts=2, lease_ms=4000)
    assert a == plan(600, seed=7, nodes=3, workers=3, every=6, db_restarts=2, lease_ms=4000)
    assert a != plan(600, seed=8, nodes=3, workers=3, every=6, db_restarts=2, lease_ms=4000)
    assert sum(f.kind == RESTART_DB for f in a) == 2
    assert {f.kind for f in a} == set(KINDS)
    assert all(60 <= f.at <= 510 for f in a)
    assert all(0 <= f.target < 3 for f in a)
