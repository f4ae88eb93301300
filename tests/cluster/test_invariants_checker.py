"""The database audit used after crashes must itself catch half-written state (no vacuous pass)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from .burst import Op, check_queue_state
from .nodes import Answer, execute

pytestmark = pytest.mark.cluster


def test_checker_flags_half_written_queue_state(tenant, mariadb_url):
    ns = tenant["namespace_id"]
    # The bootstrap queue (created by orbit-admin, no idempotency record) is complete.
    asyncio.run(check_queue_state(mariadb_url, ns))

    qid = uuid.uuid4().hex

    async def inject():
        # A queue row alone: no usage row, no audit record, no create record, no event.
        await execute(
            mariadb_url,
            "INSERT INTO queues (id, namespace_id, name, paused, max_concurrency, rate_per_second, "
            "max_unfinished_tasks, revision, retired_at, created_at, updated_at) "
            "VALUES (:id, :ns, :name, 0, 1, 1, 1, 2, NULL, NOW(6), NOW(6))",
            id=qid,
            ns=ns,
            name=f"half-{qid[:8]}",
        )
        # A placeholder idempotency record that never got its response.
        await execute(
            mariadb_url,
            "INSERT INTO idempotency_records (namespace_id, operation, idem_key, digest, resource_id, response, "
            "created_at) VALUES (:ns, 'queues.configure', 'orphan-key', :d, NULL, NULL, NOW(6))",
            ns=ns,
            d="0" * 64,
        )

    asyncio.run(inject())
    with pytest.raises(AssertionError) as info:
        asyncio.run(check_queue_state(mariadb_url, ns))
    text = str(info.value)
    for expected in (
        "queue without queue_usage row",
        "queue without exactly one queue.create audit",
        "queue without exactly one queue.created event",
        "revision bumps and configure audit records disagree",
        "idempotency record without response/resource",
    ):
        assert expected in text, (expected, text)

    # A client that was told 201 for a create the database does not have: a lost write.
    lost = Op("queues.create", "lost-key", "/v1/queues", {"name": "never-stored"})
    lost.answers.append(
        Answer(
            "node-x",
            201,
            b'{"request_id":"0","data":{"deduplicated":false,'
            b'"queue":{"id":"' + qid.encode() + b'","name":"never-stored"}}}',
        )
    )
    with pytest.raises(AssertionError) as info:
        asyncio.run(check_queue_state(mariadb_url, ns, [lost]))
    assert "2xx answer but no idempotency record (lost write)" in str(info.value)
