"""A concurrent burst of queue creates/configures over several nodes, and the database audit after it.

`QueueBurst` runs many client coroutines that each loop: create a queue with a
unique name, or configure a queue it has seen at the revision it last saw
(random content, random key); now and then the same request is sent to two
nodes at once. A request that got no HTTP answer (the node died, the
connection broke) or a 503 is retried with the *same key and body* through
the next node until it gets an answer, as a careful client would. Every attempt
is recorded.

`check_queue_state(database_url, namespace_id, ops)` then reads the database
directly and asserts there is no half-written state and that every answer the
clients saw is reflected exactly (see its docstring).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from .nodes import Answer, ServerNode, fetch_all, post, stored_events

AUDIT_ACTION = {"queues.create": "queue.create", "queues.configure": "queue.configure"}


@dataclass
class Op:
    operation: str  # "queues.create" | "queues.configure"
    key: str
    path: str
    body: dict[str, Any]
    queue_id: str | None = None
    duplicated: bool = False
    answers: list[Answer] = field(default_factory=list)

    @property
    def name(self) -> str | None:
        return self.body.get("name")

    @property
    def ok_answers(self) -> list[Answer]:
        return [a for a in self.answers if a.ok]

    @property
    def http_answers(self) -> list[Answer]:
        return [a for a in self.answers if a.answered]

    @property
    def unresolved_sends(self) -> int:
        return sum(1 for a in self.answers if not a.answered)


class QueueBurst:
    def __init__(
        self,
        nodes: Sequence[ServerNode],
        token: str,
        *,
        clients: int = 16,
        configure_ratio: float = 0.5,
        duplicate_ratio: float = 0.1,
        retry_deadline: float = 25.0,
        seed: int | None = None,
    ) -> None:
        self.nodes = list(nodes)
        self.token = token
        self.clients = clients
        self.configure_ratio = configure_ratio
        self.duplicate_ratio = duplicate_ratio
        self.retry_deadline = retry_deadline
        self.rng = random.Random(seed)
        self.prefix = f"b{uuid.uuid4().hex[:8]}"
        self.ops: list[Op] = []
        self.revisions: dict[str, int] = {}
        self.completed = 0
        self.inflight: Counter = Counter()
        self._n = itertools.count()

    # ------------------------------------------------------------------ sending

    def _key(self) -> str:
        return f"{self.prefix}-{next(self._n)}-{uuid.uuid4().hex[:12]}"

    def _new_op(self) -> Op:
        if self.revisions and self.rng.random() < self.configure_ratio:
            qid = self.rng.choice(sorted(self.revisions))
            body = {
                "expected_revision": str(self.revisions[qid]),
                "reason": f"burst {next(self._n)}",
                "paused": self.rng.random() < 0.3,
                "max_concurrency": self.rng.randint(1, 50),
                "rate_per_second": self.rng.randint(1, 1000),
                "max_unfinished_tasks": self.rng.randint(1, 1000),
            }
            return Op("queues.configure", self._key(), f"/v1/queues/{qid}:configure", body, qid)
        body = {
            "name": f"{self.prefix}-q{next(self._n)}",
            "max_concurrency": self.rng.randint(1, 50),
            "rate_per_second": self.rng.randint(1, 1000),
        }
        if self.rng.random() < 0.5:
            body["max_unfinished_tasks"] = self.rng.randint(0, 1000)
        return Op("queues.create", self._key(), "/v1/queues", body)

    async def _send(self, client: httpx.AsyncClient, op: Op, node: ServerNode) -> Answer:
        self.inflight[node.name] += 1
        try:
            a = await post(client, node, op.path, op.body, token=self.token, key=op.key)
        finally:
            self.inflight[node.name] -= 1
        op.answers.append(a)
        self._learn(op, a)
        return a

    def _learn(self, op: Op, a: Answer) -> None:
        if a.ok:
            q = a.data["queue"]
            self.revisions[q["id"]] = max(self.revisions.get(q["id"], 0), int(q["revision"]))
        elif a.code == "STATE_CONFLICT" and op.queue_id:
            current = (a.body["error"].get("details") or {}).get("current_revision")
            if current:
                self.revisions[op.queue_id] = max(self.revisions.get(op.queue_id, 0), int(current))

    async def _resolve(self, client: httpx.AsyncClient, op: Op, first: ServerNode) -> Answer:
        """Send, and on a transport error or 503 resend the identical request through the other nodes."""
        a = await self._send(client, op, first)
        deadline = time.monotonic() + self.retry_deadline
        start = self.nodes.index(first)
        attempt = 0
        while (not a.answered or a.status == 503) and time.monotonic() < deadline:
            attempt += 1
            await asyncio.sleep(min(0.05 * attempt, 0.5) * (0.5 + self.rng.random()))
            a = await self._send(client, op, self.nodes[(start + attempt) % len(self.nodes)])
        return a

    async def _client(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            op = self._new_op()
            self.ops.append(op)
            node = self.rng.choice(self.nodes)
            if len(self.nodes) > 1 and self.rng.random() < self.duplicate_ratio:
                op.duplicated = True
                other = self.rng.choice([n for n in self.nodes if n is not node])
                await asyncio.gather(
                    self._resolve(client, op, node), self._resolve(client, op, other)
                )
            else:
                await self._resolve(client, op, node)
            self.completed += 1

    async def run(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        await asyncio.gather(*(self._client(client, stop) for _ in range(self.clients)))

    async def wait_completed(self, n: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while self.completed < n:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"burst completed only {self.completed}/{n} operations in {timeout}s"
                )
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------------ reporting

    def summary(self) -> dict[str, Any]:
        statuses = Counter()
        for op in self.ops:
            for a in op.answers:
                statuses[(op.operation, a.status, a.code, a.ok and a.data["deduplicated"])] += 1

        def broke_mid_request(
            op: Op,
        ) -> bool:  # sent, then the connection died (not a refused connect)
            return any(
                not a.answered and not a.error.startswith("ConnectError") for a in op.answers
            )

        return {
            "ops": len(self.ops),
            # the node died after committing but before answering: the retry got the stored receipt
            "committed_then_answer_lost": sum(
                1
                for op in self.ops
                if broke_mid_request(op)
                and not op.duplicated
                and op.ok_answers
                and all(a.data["deduplicated"] for a in op.ok_answers)
            ),
            # the node died before committing: the retry performed the operation afresh
            "died_before_commit_redone": sum(
                1
                for op in self.ops
                if broke_mid_request(op)
                and not op.duplicated
                and any(not a.data["deduplicated"] for a in op.ok_answers)
            ),
            "transport_errors": sum(op.unresolved_sends for op in self.ops),
            "retried_ops": sum(1 for op in self.ops if op.unresolved_sends),
            "statuses": {str(k): v for k, v in sorted(statuses.items(), key=str)},
        }

    def check_answers(self) -> None:
        """What the clients saw must be self-consistent, whatever happened to the nodes."""
        problems = []
        for op in self.ops:
            final = op.answers[-1] if op.answers else None
            if not op.http_answers or final is None or not final.answered or final.status == 503:
                problems.append(("unresolved", op.key, op.answers))
                continue
            for a in op.http_answers:
                if a.status == 503:  # UNAVAILABLE: retried with the same identity
                    continue
                if a.status >= 500:
                    problems.append(("5xx", op.key, a))
                replayed = a.status == 200 and a.data["deduplicated"]
                if op.operation == "queues.create" and not (a.status == 201 or replayed):
                    problems.append(("create answered neither 201 nor 200-deduplicated", op.key, a))
                if op.operation == "queues.configure" and a.status not in (200, 409):
                    problems.append(("configure answered unexpectedly", op.key, a))
                if a.status == 409 and a.code != "STATE_CONFLICT":
                    problems.append(("409 other than STATE_CONFLICT", op.key, a))
            oks = op.ok_answers
            if oks and any(400 <= a.status < 500 for a in op.http_answers):
                problems.append(("one key answered both 2xx and 4xx", op.key, op.answers))
            if sum(1 for a in oks if a.data["deduplicated"] is False) > 1:
                problems.append(("more than one non-deduplicated answer for one key", op.key, oks))
            if len({a.raw_field("queue") for a in oks}) > 1:
                problems.append(("replays differ from the original snapshot", op.key, oks))
        assert not problems, problems[:10]


# ---------------------------------------------------------------------- database audit


def _j(v: Any) -> Any:
    return json.loads(v) if isinstance(v, (str, bytes)) else v


async def check_queue_state(
    database_url: str, namespace_id: str, ops: Sequence[Op] = ()
) -> dict[str, int]:
    """Assert, straight from the database, that no queue write is half-done.

    * every queue has its queue_usage row, exactly one `queue.create` audit record,
      exactly one `queue.created` event, and — unless `orbit-admin` created it —
      exactly one `queues.create` idempotency record with a response;
    * every `queues.create` / `queues.configure` idempotency record has a response,
      a resource id and exactly one audit record with the same key and resource;
      every API audit record has its idempotency record;
    * every revision bump (2..revision) has exactly one `queue.configure` audit record
      (before = after - 1), one idempotency record and one `queue.configured` event,
      and the newest audit snapshot equals the live row;
    * for ``ops``: every request answered 2xx is stored exactly as answered; every
      request answered only 4xx left no record and no audit row; the queues that
      exist are exactly the creates that succeeded.
    """
    ns = namespace_id
    queues = await fetch_all(
        database_url,
        "SELECT q.id, q.name, q.paused, q.max_concurrency, q.rate_per_second, q.max_unfinished_tasks, "
        "q.revision, u.queue_id AS usage_queue_id, u.unfinished "
        "FROM queues q LEFT JOIN queue_usage u ON u.queue_id = q.id WHERE q.namespace_id = :ns",
        ns=ns,
    )
    records = await fetch_all(
        database_url,
        "SELECT operation, idem_key, resource_id, response FROM idempotency_records "
        "WHERE namespace_id = :ns AND operation IN ('queues.create', 'queues.configure')",
        ns=ns,
    )
    audits = await fetch_all(
        database_url,
        "SELECT action, resource_id, idempotency_key, actor, actor_credential_id, `before`, `after` "
        "FROM audit_records WHERE namespace_id = :ns AND resource_type = 'queue'",
        ns=ns,
    )
    events = [e for e in await stored_events(database_url, namespace_id=ns) if e["resource_type"] == "queue"]
    orphan_usage = await fetch_all(
        database_url,
        "SELECT u.queue_id FROM queue_usage u LEFT JOIN queues q ON q.id = u.queue_id WHERE q.id IS NULL",
    )
    problems: list[Any] = []
    if orphan_usage:
        problems.append(("queue_usage rows without a queue", orphan_usage))

    audits_by_q: dict[str, list[dict]] = defaultdict(list)
    for a in audits:
        audits_by_q[a["resource_id"]].append(a)
    audit_by_key: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for a in audits:
        if a["idempotency_key"] is not None:
            audit_by_key[(a["action"], a["idempotency_key"], a["resource_id"])].append(a)
    records_by_key = {(r["operation"], r["idem_key"]): r for r in records}
    records_by_q: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        records_by_q[r["resource_id"]].append(r)
    events_by_q: dict[str, Counter] = defaultdict(Counter)
    for e in events:
        events_by_q[e["resource_id"]][e["type"]] += 1

    # ---- every idempotency record is complete and has its audit record
    for r in records:
        if r["response"] is None or r["resource_id"] is None:
            problems.append(("idempotency record without response/resource (half-written)", r))
            continue
        matching = audit_by_key.get(
            (AUDIT_ACTION[r["operation"]], r["idem_key"], r["resource_id"]), []
        )
        if len(matching) != 1:
            problems.append(
                ("idempotency record without exactly one audit record", r, len(matching))
            )
        else:
            resp_queue = _j(r["response"])["queue"]
            if _j(matching[0]["after"]) != resp_queue:
                problems.append(("audit snapshot differs from the stored response", r["idem_key"]))
    # ---- every API audit record has its idempotency record
    for a in audits:
        if (
            a["action"] in ("queue.create", "queue.configure")
            and a["actor_credential_id"] is not None
        ):
            op = "queues.create" if a["action"] == "queue.create" else "queues.configure"
            rec = records_by_key.get((op, a["idempotency_key"]))
            if rec is None or rec["resource_id"] != a["resource_id"]:
                problems.append(
                    (
                        "audit record without its idempotency record",
                        a["action"],
                        a["idempotency_key"],
                    )
                )

    # ---- per queue
    for q in queues:
        qid, rev = q["id"], int(q["revision"])
        if q["usage_queue_id"] is None:
            problems.append(("queue without queue_usage row", qid))
        qa = audits_by_q.get(qid, [])
        creates = [a for a in qa if a["action"] == "queue.create"]
        configures = [a for a in qa if a["action"] == "queue.configure"]
        if len(creates) != 1:
            problems.append(("queue without exactly one queue.create audit", qid, len(creates)))
        elif creates[0]["actor_credential_id"] is not None:  # created through the API
            recs = [r for r in records_by_q.get(qid, []) if r["operation"] == "queues.create"]
            if len(recs) != 1 or recs[0]["response"] is None:
                problems.append(
                    ("API queue without exactly one complete queues.create record", qid, recs)
                )
            elif _j(recs[0]["response"])["queue"]["name"] != q["name"]:
                problems.append(("create record names another queue", qid))
        if events_by_q[qid]["queue.created"] != 1:
            problems.append(
                ("queue without exactly one queue.created event", qid, events_by_q[qid])
            )
        after_revs = sorted(int(_j(a["after"])["revision"]) for a in configures)
        if after_revs != list(range(2, rev + 1)):
            problems.append(
                ("revision bumps and configure audit records disagree", qid, rev, after_revs)
            )
        for a in configures:
            if int(_j(a["before"])["revision"]) != int(_j(a["after"])["revision"]) - 1:
                problems.append(("configure audit before/after revisions not consecutive", qid))
        n_conf_records = sum(
            1 for r in records_by_q.get(qid, []) if r["operation"] == "queues.configure"
        )
        if n_conf_records != rev - 1:
            problems.append(("configure records != revision - 1", qid, n_conf_records, rev))
        if events_by_q[qid]["queue.configured"] != rev - 1:
            problems.append(("queue.configured events != revision - 1", qid, events_by_q[qid], rev))
        if configures:
            newest = max(configures, key=lambda a: int(_j(a["after"])["revision"]))
            snap = _j(newest["after"])
            live = {
                "paused": bool(q["paused"]),
                "max_concurrency": int(q["max_concurrency"]),
                "rate_per_second": int(q["rate_per_second"]),
                "max_unfinished_tasks": int(q["max_unfinished_tasks"]),
                "revision": str(rev),
            }
            if {k: snap[k] for k in live} != live:
                problems.append(
                    ("newest configure snapshot differs from the live row", qid, snap, live)
                )

    # ---- what the clients were told
    if ops:
        names_in_db = {q["name"] for q in queues}
        ids_in_db = {q["id"] for q in queues}
        for op in ops:
            oks = op.ok_answers
            rec = records_by_key.get((op.operation, op.key))
            if oks:
                answered = oks[0].data["queue"]
                if rec is None:
                    problems.append(
                        ("2xx answer but no idempotency record (lost write)", op.key, oks[0])
                    )
                    continue
                if rec["response"] is None or _j(rec["response"])["queue"] != answered:
                    problems.append(("stored response differs from the answer", op.key))
                if op.operation == "queues.create":
                    if answered["id"] not in ids_in_db or answered["name"] != op.name:
                        problems.append(("2xx create but the queue is missing", op.key, answered))
                else:
                    aud = audit_by_key.get(("queue.configure", op.key, op.queue_id), [])
                    if len(aud) != 1 or _j(aud[0]["after"]) != answered:
                        problems.append(("2xx configure without its audit record", op.key))
            elif op.http_answers and all(400 <= a.status < 500 for a in op.http_answers):
                if rec is not None:
                    problems.append(("rejected request left an idempotency record", op.key, rec))
                if any(k[1] == op.key for k in audit_by_key):
                    problems.append(("rejected request left an audit record", op.key))
        # Burst keys and names start with the burst's prefix ("b1234abcd-").
        prefixes = tuple({op.key.split("-")[0] + "-" for op in ops})
        created = {op.name for op in ops if op.operation == "queues.create" and op.ok_answers}
        burst_names = {n for n in names_in_db if n.startswith(prefixes)}
        if created != burst_names:
            problems.append(
                (
                    "queues in the database != creates that succeeded",
                    sorted(created - burst_names)[:5],
                    sorted(burst_names - created)[:5],
                )
            )
        known_keys = {(op.operation, op.key) for op in ops}
        phantom = [k for k in records_by_key if k[1].startswith(prefixes) and k not in known_keys]
        if phantom:
            problems.append(("idempotency records nobody sent", phantom[:5]))

    assert not problems, problems[:15]
    return {
        "queues": len(queues),
        "records": len(records),
        "audits": len(audits),
        "events": len(events),
    }
