"""A claim waiting on a node is served by the transaction of a submit to its queue on that node
(no claim transaction of its own), with every guarantee a claim has: limits, replay, counters."""

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from asyncmy.errors import OperationalError
from sqlalchemy import select

from orbit.server.services import dispatch
from orbit.server.store.dialect import MYSQL
from orbit.server.store.tables import leases, queue_usage, tasks
from orbit.server.store.tx import Tx

from .queue_helpers import event_rows
from .worker_client import Worker

pytestmark = pytest.mark.anyio


async def _rows(tenant, table, column, value):
    async def read(tx):
        return [dict(r) for r in (await tx.all(select(table).where(column == value)))]
    return await tenant.db.core_read(read)


async def _waiting_claim(w: Worker, queue_id: str, msg_id: str, wait_ms: int = 5000) -> asyncio.Task:
    claim = asyncio.create_task(w.call("claim", id=msg_id, queue_id=queue_id, max_tasks=5, wait_ms=wait_ms))
    await asyncio.sleep(0.3)  # its first transaction found nothing: it waits
    assert not claim.done()
    return claim


async def _submit(tenant, http: httpx.AsyncClient, queue_id: str) -> httpx.Response:
    return await http.post(f"/v1/queues/{queue_id}/tasks", json={"payload": {"n": 1}}, headers=tenant.headers(None, tenant.key()))


async def _served_while_waiting(tenant, w: Worker, http: httpx.AsyncClient, queue_id: str,
                                msg_id: str) -> tuple[str, dict]:
    """A task submitted while a claim waits on its node: its id and that claim's reply."""
    claim = await _waiting_claim(w, queue_id, msg_id)
    r = await _submit(tenant, http, queue_id)
    assert r.status_code == 201, r.text
    return r.json()["data"]["task"]["id"], await asyncio.wait_for(claim, 5)


async def _running(tenant, w: Worker, http: httpx.AsyncClient, queue_id: str) -> dict:
    """A task submitted while a claim waits, leased to that claim and started: its lease."""
    first = await _waiting_claim(w, queue_id, "c-1")
    assert (await _submit(tenant, http, queue_id)).status_code == 201
    (running,) = (await asyncio.wait_for(first, 5))["tasks"]
    assert (await w.call("start", lease_id=running["lease_id"]))["ok"]
    return running


async def test_a_submit_leases_its_task_to_the_claim_waiting_on_its_node(tenant, base):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        task_id, got = await _served_while_waiting(tenant, w, http, q["id"], "c-wait")
        assert got["ok"] and [t["task_id"] for t in got["tasks"]] == [task_id]
        lease_id = got["tasks"][0]["lease_id"]
        (task_row,) = await _rows(tenant, tasks, tasks.c.id, task_id)
        (lease_row,) = await _rows(tenant, leases, leases.c.task_id, task_id)
        # One transaction: the lease carries the submit's database time.
        assert lease_row["leased_at"] == task_row["created_at"] and task_row["state"] == "LEASED"
        events = await event_rows(tenant.db, task_id)
        assert [e["type"] for e in events] == ["task.submitted", "task.leased"]
        if tenant.db.dialect == MYSQL:  # where writes wait for the COMMIT, both share one batch row
            assert events[0]["batch_id"] == events[1]["batch_id"]
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 1 and u["unfinished"] == 1
        again = await w.call("claim", id="c-wait", queue_id=q["id"], max_tasks=5)
        assert again["tasks"] == got["tasks"]  # a resent claim replays what the submit granted
        assert (await w.call("start", lease_id=lease_id))["ok"]
        done = await w.call("complete", lease_id=lease_id, outcome="succeeded", result=None)
        assert done["ok"] and done["task_state"] == "SUCCEEDED"
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 0 and u["unfinished"] == 0


async def test_a_refused_submit_serves_no_claim_and_the_claim_waits_on(tenant, base):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100, max_unfinished_tasks=1)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        first = await _waiting_claim(w, q["id"], "c-1")
        assert (await _submit(tenant, http, q["id"])).status_code == 201
        (held,) = (await asyncio.wait_for(first, 5))["tasks"]
        claim = await _waiting_claim(w, q["id"], "c-2", wait_ms=1500)
        full = await _submit(tenant, http, q["id"])
        assert full.status_code == 429 and full.json()["error"]["code"] == "QUEUE_FULL"
        assert (await asyncio.wait_for(claim, 5))["tasks"] == []  # waited its whole wait_ms
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 1 and u["unfinished"] == 1
        assert (await w.call("start", lease_id=held["lease_id"]))["ok"]


async def test_a_claim_served_within_the_limits_only_takes_what_fits(tenant, base):
    """Concurrency 1 with one task running: the submit's transaction serves the waiting claim
    nothing, and the claim goes on waiting until a permit comes back."""
    q = await tenant.create_queue(max_concurrency=1, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        running = await _running(tenant, w, http, q["id"])
        claim = await _waiting_claim(w, q["id"], "c-2")
        r = await _submit(tenant, http, q["id"])
        second_id = r.json()["data"]["task"]["id"]
        await asyncio.sleep(0.3)
        assert not claim.done()  # served nothing: concurrency 1 is taken
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 1
        await w.call("complete", lease_id=running["lease_id"], outcome="succeeded", result=None)
        got = await asyncio.wait_for(claim, 5)
        assert [t["task_id"] for t in got["tasks"]] == [second_id]


@pytest.mark.parametrize("priority", [0, 9])
async def test_a_submit_serves_its_waiting_claim_in_dispatch_order(tenant, base, no_polling, priority):
    """A task already due but not claimed yet (it fell due while the claim waited; no poll here)
    goes before the submitted one at the same priority, after it at a lower one: the claim's
    reads travel with the submit's first round trip and the new task joins them."""
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        claim = asyncio.create_task(w.call("claim", id="c-1", queue_id=q["id"], max_tasks=1, wait_ms=5000))
        await asyncio.sleep(0.3)
        # Due a second from now: not yet when the submit admits it, even on a slow machine.
        soon = (datetime.now(UTC) + timedelta(seconds=1.0)).isoformat()
        r = await http.post(f"/v1/queues/{q['id']}/tasks", json={"payload": {"n": 0}, "available_at": soon},
                            headers=tenant.headers(None, tenant.key()))
        assert r.status_code == 201, r.text
        early_id = r.json()["data"]["task"]["id"]
        await asyncio.sleep(1.5)
        assert not claim.done()  # due now, but nothing woke the claim
        r = await http.post(f"/v1/queues/{q['id']}/tasks", json={"payload": {"n": 1}, "priority": priority},
                            headers=tenant.headers(None, tenant.key()))
        assert r.status_code == 201, r.text
        new_id = r.json()["data"]["task"]["id"]
        (leased,) = (await asyncio.wait_for(claim, 5))["tasks"]
        assert leased["task_id"] == (new_id if priority > 0 else early_id)
        (new_row,) = await _rows(tenant, tasks, tasks.c.id, new_id)
        (lease_row,) = await _rows(tenant, leases, leases.c.id, leased["lease_id"])
        assert lease_row["leased_at"] == new_row["created_at"]  # in the submit's transaction
        rest = await w.call("claim", queue_id=q["id"], max_tasks=5)
        assert [t["task_id"] for t in rest["tasks"]] == [early_id if priority > 0 else new_id]


async def test_several_waiting_claims_share_a_burst_in_one_transaction(tenant, base):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as a, Worker.connect(base, tenant.token) as b, \
            httpx.AsyncClient(base_url=base) as http:
        await a.hello(q["id"])
        await b.hello(q["id"])
        ca = await _waiting_claim(a, q["id"], "c-a")
        cb = await _waiting_claim(b, q["id"], "c-b")
        sent = await asyncio.gather(*(_submit(tenant, http, q["id"]) for _ in range(8)))
        ids = {r.json()["data"]["task"]["id"] for r in sent}
        got = [t["task_id"] for c in await asyncio.gather(ca, cb) for t in c["tasks"]]
        assert got and len(got) == len(set(got)) and set(got) <= ids
        rest = await a.call("claim", queue_id=q["id"], max_tasks=10)
        assert set(got) | {t["task_id"] for t in rest["tasks"]} == ids  # every task leased once
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 8 and u["unfinished"] == 8


async def test_a_report_wakes_a_waiting_claim_when_a_task_waits_for_its_permit(tenant, base, no_polling):
    q = await tenant.create_queue(max_concurrency=1, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        running = await _running(tenant, w, http, q["id"])
        second = (await _submit(tenant, http, q["id"])).json()["data"]["task"]["id"]
        claim = await _waiting_claim(w, q["id"], "c-2", wait_ms=5000)
        done = await w.call("complete", lease_id=running["lease_id"], outcome="succeeded", result=None)
        assert done["ok"]
        got = await asyncio.wait_for(claim, 10)  # woken by the report, not by a poll
        assert [t["task_id"] for t in got["tasks"]] == [second]


async def test_a_report_wakes_no_claim_when_no_task_waits(tenant, base, no_polling, claim_transactions):
    q = await tenant.create_queue(max_concurrency=5, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, Worker.connect(base, tenant.token) as idle, \
            httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        await idle.hello(q["id"])
        assert (await _submit(tenant, http, q["id"])).status_code == 201
        (held,) = (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
        assert (await w.call("start", lease_id=held["lease_id"]))["ok"]
        waiting = await _waiting_claim(idle, q["id"], "c-idle", wait_ms=1500)
        before = len(claim_transactions)
        done = await w.call("complete", lease_id=held["lease_id"], outcome="succeeded", result=None)
        assert done["ok"]
        assert (await asyncio.wait_for(waiting, 5))["tasks"] == []
        # The permit came back with no task left to take it: the waiting claim ran no transaction
        # again, not even when its wait ended.
        assert len(claim_transactions) == before


async def _submit_batch(tenant, http: httpx.AsyncClient, queue_id: str, n: int, key: str | None = None,
                        keys: list[str] | None = None) -> httpx.Response:
    items = [{"idempotency_key": (keys[i] if keys else tenant.key()), "payload": {"i": i}} for i in range(n)]
    return await http.post(f"/v1/queues/{queue_id}/tasks:batch", json={"tasks": items},
                           headers=tenant.headers(None, key or tenant.key()))


def _batch_ids(r: httpx.Response) -> list[str]:
    assert r.status_code == 200, r.text
    return [item["task"]["id"] for item in r.json()["data"]["results"] if "task" in item]


async def test_a_batch_leases_its_tasks_to_the_claims_waiting_on_its_node(tenant, base, no_polling,
                                                                          claim_transactions):
    q = await tenant.create_queue(max_concurrency=20, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as a, Worker.connect(base, tenant.token) as b, \
            httpx.AsyncClient(base_url=base) as http:
        await a.hello(q["id"])
        await b.hello(q["id"])
        ca = await _waiting_claim(a, q["id"], "c-a")
        cb = await _waiting_claim(b, q["id"], "c-b")
        before = sum(claim_transactions)
        ids = _batch_ids(await _submit_batch(tenant, http, q["id"], 8))
        got_a, got_b = await asyncio.wait_for(asyncio.gather(ca, cb), 5)
        leased = [t["task_id"] for t in got_a["tasks"] + got_b["tasks"]]
        # Five each at most (their max_tasks), in the batch's order, each task once.
        assert len(got_a["tasks"]) == 5 and len(got_b["tasks"]) == 3
        assert leased == ids
        assert sum(claim_transactions) == before  # no claim transaction of their own
        for task_id in leased:
            (task_row,) = await _rows(tenant, tasks, tasks.c.id, task_id)
            (lease_row,) = await _rows(tenant, leases, leases.c.task_id, task_id)
            assert lease_row["leased_at"] == task_row["created_at"] and task_row["state"] == "LEASED"
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 8 and u["unfinished"] == 8
        again = await a.call("claim", id="c-a", queue_id=q["id"], max_tasks=5)
        assert again["tasks"] == got_a["tasks"]  # a resent claim replays what the batch granted


async def test_a_batch_larger_than_its_waiting_claims_wakes_others_for_the_rest(tenant, base, no_polling):
    q = await tenant.create_queue(max_concurrency=20, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as a, httpx.AsyncClient(base_url=base) as http:
        await a.hello(q["id"])
        ca = await _waiting_claim(a, q["id"], "c-a")
        ids = _batch_ids(await _submit_batch(tenant, http, q["id"], 12))
        got = await asyncio.wait_for(ca, 5)
        assert [t["task_id"] for t in got["tasks"]] == ids[:5]
        rest = await a.call("claim", queue_id=q["id"], max_tasks=20)
        assert [t["task_id"] for t in rest["tasks"]] == ids[5:]


async def test_a_batch_within_the_limits_leases_only_what_fits(tenant, base, no_polling):
    q = await tenant.create_queue(max_concurrency=2, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as a, httpx.AsyncClient(base_url=base) as http:
        await a.hello(q["id"])
        ca = await _waiting_claim(a, q["id"], "c-a")
        ids = _batch_ids(await _submit_batch(tenant, http, q["id"], 4))
        got = await asyncio.wait_for(ca, 5)
        assert [t["task_id"] for t in got["tasks"]] == ids[:2]
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 2 and u["unfinished"] == 4


async def test_a_replayed_batch_serves_no_claim_and_the_claim_waits_on(tenant, base, no_polling):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as a, httpx.AsyncClient(base_url=base) as http:
        await a.hello(q["id"])
        key, keys = tenant.key(), [tenant.key() for _ in range(3)]
        first = await a.call("claim", queue_id=q["id"], max_tasks=5, wait_ms=0)
        assert first["tasks"] == []
        ids = _batch_ids(await _submit_batch(tenant, http, q["id"], 3, key=key, keys=keys))
        taken = await a.call("claim", queue_id=q["id"], max_tasks=5)
        assert [t["task_id"] for t in taken["tasks"]] == ids
        claim = await _waiting_claim(a, q["id"], "c-w", wait_ms=1000)
        replay = await _submit_batch(tenant, http, q["id"], 3, key=key, keys=keys)
        assert _batch_ids(replay) == ids and all(i["deduplicated"] is False for i in replay.json()["data"]["results"])
        assert (await asyncio.wait_for(claim, 5))["tasks"] == []  # the replay leased nothing again
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 3 and u["unfinished"] == 3


async def test_a_batch_of_known_items_serves_no_claim(tenant, base, no_polling):
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as a, httpx.AsyncClient(base_url=base) as http:
        await a.hello(q["id"])
        keys = [tenant.key() for _ in range(2)]
        ids = _batch_ids(await _submit_batch(tenant, http, q["id"], 2, keys=keys))
        taken = await a.call("claim", queue_id=q["id"], max_tasks=5)
        assert [t["task_id"] for t in taken["tasks"]] == ids
        claim = await _waiting_claim(a, q["id"], "c-w", wait_ms=1000)
        again = await _submit_batch(tenant, http, q["id"], 2, keys=keys)  # a new batch key, items known
        assert _batch_ids(again) == ids
        assert all(i["deduplicated"] for i in again.json()["data"]["results"])
        assert (await asyncio.wait_for(claim, 5))["tasks"] == []


@pytest.fixture
def leased_by_update(monkeypatch):
    """Ids of the tasks an `UPDATE … SET state = 'LEASED'` took out of WAITING from now on."""
    from orbit.server.store.queries import tasks as task_q

    ids: list[str] = []
    original = task_q.mark_leased

    def recorded(task_ids, now, **kw):
        ids.extend(task_ids)
        return original(task_ids, now, **kw)

    monkeypatch.setattr(task_q, "mark_leased", recorded)
    return ids


async def test_a_task_leased_by_its_own_submit_is_written_leased(tenant, base, no_polling, leased_by_update):
    q = await tenant.create_queue(max_concurrency=20, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as a, httpx.AsyncClient(base_url=base) as http:
        await a.hello(q["id"])
        ca = await _waiting_claim(a, q["id"], "c-a")
        ids = _batch_ids(await _submit_batch(tenant, http, q["id"], 7))
        got = await asyncio.wait_for(ca, 5)
        assert [t["task_id"] for t in got["tasks"]] == ids[:5]
        # Inserted LEASED, not inserted WAITING and then updated; the two left over stay WAITING.
        assert leased_by_update == []
        states = {i: (await _rows(tenant, tasks, tasks.c.id, i))[0]["state"] for i in ids}
        assert [states[i] for i in ids] == ["LEASED"] * 5 + ["WAITING"] * 2
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 5 and u["unfinished"] == 7
        rest = await a.call("claim", queue_id=q["id"], max_tasks=20)
        assert [t["task_id"] for t in rest["tasks"]] == ids[5:]
        assert leased_by_update == ids[5:]  # a claim of its own leases written tasks with an UPDATE
        for t in got["tasks"] + rest["tasks"]:
            assert (await a.call("start", lease_id=t["lease_id"]))["ok"]


async def test_a_task_naming_a_resource_key_is_written_before_the_claim_takes_it(tenant, base, no_polling,
                                                                                 leased_by_update):
    q = await tenant.create_queue(max_concurrency=20, rate_per_second=100)
    r = await tenant.http.post("/v1/resource-keys", json={"name": "rk-handoff", "max_concurrency": 5},
                               headers=tenant.headers(None, tenant.key()))
    assert r.status_code == 201, r.text
    async with Worker.connect(base, tenant.token) as a, httpx.AsyncClient(base_url=base) as http:
        await a.hello(q["id"])
        ca = await _waiting_claim(a, q["id"], "c-a")
        r = await http.post(f"/v1/queues/{q['id']}/tasks", json={"payload": {}, "resource_keys": ["rk-handoff"]},
                            headers=tenant.headers(None, tenant.key()))
        assert r.status_code == 201, r.text
        task_id = r.json()["data"]["task"]["id"]
        got = await asyncio.wait_for(ca, 5)
        assert [t["task_id"] for t in got["tasks"]] == [task_id]
        assert leased_by_update == [task_id]
        (row,) = await _rows(tenant, tasks, tasks.c.id, task_id)
        assert row["state"] == "LEASED"


@pytest.fixture
def held_commit(monkeypatch):
    """On MariaDB, the COMMIT of a transaction that wrote leases goes out late, or fails once
    (set `fail`): what a waiting claim's reply must not depend on. `starts` counts Start
    transactions; `written` is set once such a transaction's writes are made."""
    state = {"delay": 0.5, "fail": False, "held": 0, "starts": 0, "written": asyncio.Event()}
    real = Tx._run_mysql
    real_start = dispatch.start

    async def run(self, statements):
        leases = any(d.startswith("INSERT INTO leases") for d in self._deferred)
        if statements == ["COMMIT"] and getattr(self, "_wrote_leases", False):
            state["held"] += 1
            if state["fail"]:
                state["fail"] = False
                raise OperationalError(1213, "Deadlock found when trying to get lock")
            await asyncio.sleep(state["delay"])
        out = await real(self, statements)
        if leases:
            self._wrote_leases = True
            state["written"].set()
        return out

    async def start(db, commands):
        state["starts"] += 1
        return await real_start(db, commands)

    monkeypatch.setattr(Tx, "_run_mysql", run)
    monkeypatch.setattr(dispatch, "start", start)
    return state


async def test_a_served_claim_is_answered_as_the_commit_goes_and_its_start_waits_for_it(tenant, base, held_commit):
    """The claim hears its lease once the submit's writes are made and its guards held, while
    its COMMIT is out. Its Start goes at once: its locking reads wait in the database for the
    commit, and it starts the attempt in one transaction."""
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        claim = await _waiting_claim(w, q["id"], "c-early")
        submit = asyncio.create_task(_submit(tenant, http, q["id"]))
        (lease,) = (await asyncio.wait_for(claim, 5))["tasks"]
        if tenant.db.dialect == MYSQL:
            assert held_commit["written"].is_set() and held_commit["held"] == 1 and not submit.done()
        started = await w.call("start", lease_id=lease["lease_id"])
        assert (await submit).status_code == 201
        assert started["ok"] and started["attempt"] == 1
        assert held_commit["starts"] == 1
        (lease_row,) = await _rows(tenant, leases, leases.c.id, lease["lease_id"])
        (task_row,) = await _rows(tenant, tasks, tasks.c.id, lease["task_id"])
        # A live lease's Start is on its task's row.
        assert lease_row["state"] == "LEASED" and task_row["started_at"] is not None
        assert task_row["state"] == "RUNNING"


async def test_a_claim_answered_before_a_failed_commit_is_unknown_to_its_start_and_the_task_waits(
        tenant, base, held_commit):
    """The transaction that answered the claim failed at its COMMIT; its rerun serves the claim
    no more (its reply is out), so the task waits for another claim and the lease never existed."""
    held_commit["fail"] = True
    q = await tenant.create_queue(max_concurrency=10, rate_per_second=100)
    async with Worker.connect(base, tenant.token) as w, httpx.AsyncClient(base_url=base) as http:
        await w.hello(q["id"])
        task_id, got = await _served_while_waiting(tenant, w, http, q["id"], "c-lost")
        if tenant.db.dialect != MYSQL:
            return  # no COMMIT travels with the writes: the claim was answered after it
        (phantom,) = got["tasks"]  # of the transaction that did not commit (the rerun gave new ids)
        refused = await w.call("start", lease_id=phantom["lease_id"])
        assert refused["ok"] is False and refused["error"]["code"] == "NOT_FOUND"
        assert await _rows(tenant, leases, leases.c.id, phantom["lease_id"]) == []
        assert await _rows(tenant, leases, leases.c.task_id, task_id) == []
        (task_row,) = await _rows(tenant, tasks, tasks.c.id, task_id)
        assert task_row["state"] == "WAITING"
        (u,) = await _rows(tenant, queue_usage, queue_usage.c.queue_id, q["id"])
        assert u["permits_in_use"] == 0 and u["unfinished"] == 1
        (lease,) = (await w.call("claim", id="c-next", queue_id=q["id"], max_tasks=5))["tasks"]
        assert lease["task_id"] == task_id
        assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
