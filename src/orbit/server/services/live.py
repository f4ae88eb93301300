"""Live usage of a queue, and why a task waits: read-only views at the database clock, for
operators, the dashboard and the SDK. Neither changes any revision."""

from __future__ import annotations

from typing import Any

from ..core import blockers as rules
from ..core.ids import is_id
from ..core.timefmt import format_ts
from ..errors import not_found
from ..store.db import Database
from ..store.queries import key_permits as key_q
from ..store.queries import queues as queue_q
from ..store.queries import tasks as task_q
from ..store.queries import usage as usage_q
from ..store.tx import Tx
from .auth import Principal


def _nodes(rows: list[dict[str, Any]]) -> list[rules.NodeUse]:
    return [rules.NodeUse(r["worker_node_id"], int(r["in_flight"]), r["last_claim_at"], r["wanting_at"])
            for r in rows]


async def queue_usage(db: Database, principal: Principal, queue_id: str) -> dict[str, Any]:
    """Counts per state, permits held, the open rate window and the nodes active on the queue."""
    if not is_id(queue_id) or not principal.can_see_queue(queue_id):
        raise not_found("queue")

    async def read(tx: Tx) -> dict[str, Any]:
        queue, waiting, held, usage, nodes = await tx.rows_multi([
            queue_q.with_usage(principal.namespace_id, queue_id), usage_q.waiting_counts(queue_id),
            usage_q.held_counts(queue_id), usage_q.queue_rows([queue_id]), key_q.nodes([queue_id])])
        if not queue:
            raise not_found("queue")
        (w,), (u,) = waiting, usage
        now = w["db_now"]
        per_state = {r["state"]: int(r["n"]) for r in held}
        window = usage_q.window_of(u)
        return {
            "queue_id": queue_id,
            "at": format_ts(now),
            "unfinished_tasks": str(int(u["unfinished"])),
            "waiting": str(int(w["waiting"]) - int(w["not_due"])),
            "delayed": str(int(w["not_due"])),
            "leased": str(per_state.get("LEASED", 0)),
            "running": str(per_state.get("RUNNING", 0)),
            "needs_review": str(per_state.get("NEEDS_REVIEW", 0)),
            "in_flight": str(int(u["permits_in_use"])),
            "rate_window": {"started_at": format_ts(window.start), "used": str(window.used),
                            "reserved": str(window.reserved)} if window.is_open(now) else None,
            "active_nodes": [{"node_id": n.node_id, "in_flight": str(n.in_flight),
                              "last_claim_at": format_ts(n.last_claim_at)}
                             for n in sorted(rules.active(_nodes(nodes), now), key=lambda n: n.node_id)],
        }

    return await db.read(read)


async def task_blockers(db: Database, principal: Principal, task_id: str) -> dict[str, Any]:
    """Every control that holds the task now; empty when the next claim can take it, or when
    the task is not waiting (its state says where it is)."""
    if not is_id(task_id):
        raise not_found("task")

    async def read(tx: Tx) -> dict[str, Any]:
        task = await tx.one(task_q.by_id(principal.namespace_id, task_id))
        if task is None or not principal.can_see_queue(task["queue_id"]):
            raise not_found("task")
        qid, aid = task["queue_id"], task["application_id"]
        key_ids = list(task_q.resource_key_ids(task))
        reads = [queue_q.controls([qid]), usage_q.queue_rows([qid], clock=True), usage_q.application_rows([aid]),
                 key_q.nodes([qid])]
        if key_ids:
            reads.append(key_q.described(key_ids))
        (q,), (u,), (au,), nodes, *keys = await tx.rows_multi(reads)
        now = u["db_now"]
        queue = rules.Layer(bool(q["paused"]), q["retired_at"] is not None, int(q["max_concurrency"]),
                            int(q["rate_per_second"]), int(u["permits_in_use"]), usage_q.window_of(u))
        app = rules.Layer(bool(q["application_paused"]), False, int(q["application_max_concurrency"]),
                          int(q["application_rate_per_second"]), int(au["permits_in_use"]),
                          usage_q.window_of(au))
        described = [rules.Key(k["name"], int(k["max_concurrency"]), int(k["permits_in_use"]),
                               k["retired_at"] is not None) for k in (keys[0] if keys else [])]
        return {"task_id": task_id, "state": task["state"], "at": format_ts(now),
                "blockers": rules.blockers(state=task["state"], available_at=task["available_at"], now=now,
                                           queue=queue, application=app, keys=described, nodes=_nodes(nodes))}

    return await db.read(read)
