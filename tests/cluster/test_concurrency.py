"""Two real server nodes on one MariaDB database: races are decided by the database.

Every burst is spread evenly over both nodes and fired at once over pre-opened
keep-alive connections, so the requests really overlap inside the database.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter

import pytest

from .nodes import Answer, async_client, fetch_all, get, post, stored_events, warm_up

pytestmark = pytest.mark.cluster

N = 40  # concurrent requests per burst, half through each node


def _conf_body(
    expected_revision: str, *, max_concurrency: int = 2, paused: bool = False, reason: str = "x"
) -> dict:
    return {
        "expected_revision": expected_revision,
        "reason": reason,
        "paused": paused,
        "max_concurrency": max_concurrency,
        "rate_per_second": 1,
        "max_unfinished_tasks": 100,
    }


def _no_5xx(answers: list[Answer]) -> None:
    assert all(a.answered for a in answers), [a for a in answers if not a.answered]
    bad = [a for a in answers if a.status >= 500]
    assert not bad, bad


def _statuses(answers: list[Answer]) -> Counter:
    return Counter((a.status, a.code) for a in answers)


def _envelope_ok(a: Answer) -> None:
    body = a.body
    assert len(body["request_id"]) == 32
    if a.ok:
        assert set(body) == {"request_id", "data"}, body
    else:
        assert set(body) == {"request_id", "error"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]


def test_concurrent_creates_of_one_name_have_exactly_one_winner(two_nodes, tenant, mariadb_url):
    """40 creates of the same name with different keys, split over both nodes: one 201, 39 × 409."""
    nodes = two_nodes.nodes
    token, ns = tenant["token"], tenant["namespace_id"]

    async def scenario():
        async with async_client() as client:
            await warm_up(client, nodes)
            rounds = []
            for _ in range(3):  # three independent races, each on a fresh name
                name = f"race-{uuid.uuid4().hex[:8]}"
                body = {"name": name, "max_concurrency": 4, "rate_per_second": 10}
                keys = [f"create-{name}-{i}" for i in range(N)]
                answers = await asyncio.gather(
                    *(
                        post(client, nodes[i % 2], "/v1/queues", body, token=token, key=k)
                        for i, k in enumerate(keys)
                    )
                )
                rounds.append((name, keys, answers))
            return rounds

    for name, keys, answers in asyncio.run(scenario()):
        _no_5xx(answers)
        for a in answers:
            _envelope_ok(a)
        counts = _statuses(answers)
        assert counts == Counter({(201, None): 1, (409, "STATE_CONFLICT"): N - 1}), counts
        # Both nodes took part in the race and both lost at least once.
        assert {a.node for a in answers if a.status == 409} == {n.name for n in nodes}
        winner = next(a for a in answers if a.status == 201)
        assert winner.data["deduplicated"] is False
        queue = winner.data["queue"]
        assert queue["name"] == name and queue["revision"] == "1"

        # The database holds exactly one queue, one record, one audit row and one event.
        rows = asyncio.run(
            fetch_all(
                mariadb_url,
                "SELECT id FROM queues WHERE namespace_id=:ns AND name=:n",
                ns=ns,
                n=name,
            )
        )
        assert [r["id"] for r in rows] == [queue["id"]]
        recs = asyncio.run(
            fetch_all(
                mariadb_url,
                "SELECT idem_key, resource_id, response FROM idempotency_records "
                "WHERE namespace_id=:ns AND operation='queues.create' AND idem_key LIKE :p",
                ns=ns,
                p=f"create-{name}-%",
            )
        )
        # A rejected request leaves no idempotency record: only the winner's key is stored.
        assert len(recs) == 1 and recs[0]["resource_id"] == queue["id"], recs
        assert json.loads(recs[0]["response"])["queue"] == queue
        audits = asyncio.run(
            fetch_all(
                mariadb_url,
                "SELECT idempotency_key FROM audit_records WHERE resource_id=:q AND action='queue.create'",
                q=queue["id"],
            )
        )
        assert [a["idempotency_key"] for a in audits] == [recs[0]["idem_key"]]
        events = asyncio.run(stored_events(mariadb_url, resource_id=queue["id"]))
        assert [e["type"] for e in events] == ["queue.created"]
        usage = asyncio.run(
            fetch_all(
                mariadb_url, "SELECT unfinished FROM queue_usage WHERE queue_id=:q", q=queue["id"]
            )
        )
        assert [int(u["unfinished"]) for u in usage] == [0]


def test_concurrent_configures_with_one_expected_revision_have_one_winner(
    two_nodes, tenant, mariadb_url
):
    """40 configures at expected_revision 1 (different keys, both nodes): one 200, the rest 409; then again at 2."""
    nodes = two_nodes.nodes
    token = tenant["token"]

    async def scenario():
        async with async_client() as client:
            await warm_up(client, nodes)
            created = await post(
                client,
                nodes[0],
                "/v1/queues",
                {
                    "name": f"conf-{uuid.uuid4().hex[:8]}",
                    "max_concurrency": 8,
                    "rate_per_second": 100,
                },
                token=token,
                key=uuid.uuid4().hex,
            )
            assert created.status == 201, created
            qid = created.data["queue"]["id"]
            path = f"/v1/queues/{qid}:configure"
            results = []
            for expected in ("1", "2"):
                # Every request carries different content (max_concurrency = i + 1) and its own key.
                bodies = [
                    _conf_body(expected, max_concurrency=i + 1, reason=f"race {expected}/{i}")
                    for i in range(N)
                ]
                answers = await asyncio.gather(
                    *(
                        post(
                            client,
                            nodes[i % 2],
                            path,
                            b,
                            token=token,
                            key=f"conf-{qid}-{expected}-{i}",
                        )
                        for i, b in enumerate(bodies)
                    )
                )
                views = await asyncio.gather(
                    *(get(client, n, f"/v1/queues/{qid}", token=token) for n in nodes)
                )
                results.append((expected, bodies, answers, views))
            return qid, results

    qid, results = asyncio.run(scenario())
    for expected, bodies, answers, views in results:
        _no_5xx(answers)
        for a in answers:
            _envelope_ok(a)
        counts = _statuses(answers)
        assert counts == Counter({(200, None): 1, (409, "STATE_CONFLICT"): N - 1}), counts
        i_win = next(i for i, a in enumerate(answers) if a.status == 200)
        won = answers[i_win].data
        assert won["deduplicated"] is False
        new_rev = str(int(expected) + 1)
        assert won["queue"]["revision"] == new_rev
        assert won["queue"]["max_concurrency"] == bodies[i_win]["max_concurrency"]
        # Both nodes read the same final state.
        for v in views:
            assert v.status == 200, v
            assert v.data["revision"] == new_rev
            assert v.data["max_concurrency"] == bodies[i_win]["max_concurrency"]
            assert v.data["rate_per_second"] == 1 and v.data["max_unfinished_tasks"] == 100

    # Final revision after the first race is 2 (checked above); after the second, 3.
    q = asyncio.run(fetch_all(mariadb_url, "SELECT revision FROM queues WHERE id=:q", q=qid))
    assert int(q[0]["revision"]) == 3
    audits = asyncio.run(
        fetch_all(
            mariadb_url,
            "SELECT idempotency_key, `before`, `after` FROM audit_records "
            "WHERE resource_id=:q AND action='queue.configure' ORDER BY id",
            q=qid,
        )
    )
    assert len(audits) == 2, audits
    assert [json.loads(a["after"])["revision"] for a in audits] == ["2", "3"]
    assert [json.loads(a["before"])["revision"] for a in audits] == ["1", "2"]
    recs = asyncio.run(
        fetch_all(
            mariadb_url,
            "SELECT idem_key FROM idempotency_records WHERE operation='queues.configure' AND resource_id=:q",
            q=qid,
        )
    )
    assert sorted(r["idem_key"] for r in recs) == sorted(a["idempotency_key"] for a in audits)
    events = [e for e in asyncio.run(stored_events(mariadb_url, resource_id=qid)) if e["type"] == "queue.configured"]
    assert len(events) == 2


def test_same_key_through_both_nodes_replays_the_original_snapshot(two_nodes, tenant, mariadb_url):
    """Identical creates with one key on both nodes: one 201, the rest byte-identical replays, forever."""
    a_node, b_node = two_nodes.nodes
    nodes = [a_node, b_node]
    token = tenant["token"]
    name = f"same-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "max_concurrency": 3, "rate_per_second": 7}
    key = f"same-key-{uuid.uuid4().hex}"

    async def scenario():
        async with async_client() as client:
            await warm_up(client, nodes)
            answers = await asyncio.gather(
                *(
                    post(client, nodes[i % 2], "/v1/queues", body, token=token, key=key)
                    for i in range(N)
                )
            )
            _no_5xx(answers)
            winners = [a for a in answers if a.status == 201]
            assert len(winners) == 1, _statuses(answers)
            original = winners[0]
            qid = original.data["queue"]["id"]
            path = f"/v1/queues/{qid}:configure"

            # Concurrent identical configures with one key: one fresh 200, the rest replays.
            ckey = f"same-conf-{uuid.uuid4().hex}"
            cbody = _conf_body("1", max_concurrency=5, paused=True, reason="pause for the test")
            conf = await asyncio.gather(
                *(post(client, nodes[i % 2], path, cbody, token=token, key=ckey) for i in range(N))
            )
            # A later configure (revision 2 → 3) moves the live state on.
            later = await post(
                client,
                a_node,
                path,
                _conf_body("2", max_concurrency=9, reason="later"),
                token=token,
                key=uuid.uuid4().hex,
            )
            # Replays through the *other* node still answer with the original snapshots.
            replay_create = await post(client, b_node, "/v1/queues", body, token=token, key=key)
            replay_conf = await post(client, b_node, path, cbody, token=token, key=ckey)
            replay_create_a = await post(client, a_node, "/v1/queues", body, token=token, key=key)
            # Same key, different content → IDEMPOTENCY_CONFLICT on either node.
            conflict = await asyncio.gather(
                *(
                    post(
                        client,
                        n,
                        "/v1/queues",
                        {**body, "max_concurrency": 4},
                        token=token,
                        key=key,
                    )
                    for n in nodes
                )
            )
            live = await get(client, b_node, f"/v1/queues/{qid}", token=token)
            return (
                answers,
                original,
                conf,
                later,
                replay_create,
                replay_conf,
                replay_create_a,
                conflict,
                live,
            )

    answers, original, conf, later, replay_create, replay_conf, replay_create_a, conflict, live = (
        asyncio.run(scenario())
    )

    # --- the create race
    assert _statuses(answers) == Counter({(201, None): 1, (200, None): N - 1}), _statuses(answers)
    assert original.data["deduplicated"] is False
    snapshot = original.raw_field("queue")
    for a in answers:
        _envelope_ok(a)
        if a is not original:
            assert a.data["deduplicated"] is True
            assert a.raw_field("queue") == snapshot, (a, original)
    assert {a.node for a in answers if a.status == 200} == {a_node.name, b_node.name}
    # Request ids are per request even for replays.
    assert len({a.body["request_id"] for a in answers}) == N

    # --- the configure race with one key
    _no_5xx(conf)
    assert _statuses(conf) == Counter({(200, None): N}), _statuses(conf)
    fresh = [c for c in conf if c.data["deduplicated"] is False]
    assert len(fresh) == 1, conf
    conf_snapshot = fresh[0].raw_field("queue")
    assert all(c.raw_field("queue") == conf_snapshot for c in conf)
    assert fresh[0].data["queue"]["revision"] == "2" and fresh[0].data["queue"]["paused"] is True

    assert later.status == 200 and later.data["queue"]["revision"] == "3", later

    # --- replays after the queue moved on: original snapshots, byte for byte
    for r in (replay_create, replay_create_a):
        assert r.status == 200, r
        assert r.data["deduplicated"] is True
        assert r.raw_field("queue") == snapshot
        assert r.data["queue"]["revision"] == "1" and r.data["queue"]["max_concurrency"] == 3
    assert replay_conf.status == 200 and replay_conf.data["deduplicated"] is True, replay_conf
    assert replay_conf.raw_field("queue") == conf_snapshot
    assert live.status == 200 and live.data["revision"] == "3" and live.data["max_concurrency"] == 9

    for c in conflict:
        assert (c.status, c.code) == (409, "IDEMPOTENCY_CONFLICT"), c

    # One queue, one create record, one create audit, one configure audit for ckey.
    qid = original.data["queue"]["id"]
    rows = asyncio.run(
        fetch_all(
            mariadb_url,
            "SELECT action, idempotency_key FROM audit_records WHERE resource_id=:q ORDER BY id",
            q=qid,
        )
    )
    assert [r["action"] for r in rows] == ["queue.create", "queue.configure", "queue.configure"], (
        rows
    )
    assert rows[0]["idempotency_key"] == key
