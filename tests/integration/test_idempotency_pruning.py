"""Records are kept for the retention period; a key reused after pruning is a new operation."""

from datetime import timedelta

import pytest
from sqlalchemy import update

from orbit.server.services.idempotency import prune
from orbit.server.store.tables import idempotency_records

pytestmark = pytest.mark.anyio


async def test_pruned_key_is_a_new_operation(tenant):
    body = {"name": "pruned-queue", "max_concurrency": 1, "rate_per_second": 1}
    assert (await tenant.post("/v1/queues", body, key="old-key")).status_code == 201
    assert (await tenant.post("/v1/queues", body, key="old-key")).status_code == 200
    await prune(tenant.db, timedelta(days=7))
    assert (await tenant.post("/v1/queues", body, key="old-key")).status_code == 200  # fresh records survive

    async def age(tx):
        await tx.execute(update(idempotency_records)
                         .where(idempotency_records.c.namespace_id == tenant.namespace_id,
                                idempotency_records.c.idem_key == "old-key")
                         .values(created_at=(await tx.now()) - timedelta(days=8)))

    await tenant.db.core_transaction(age)
    assert await prune(tenant.db, timedelta(days=7)) >= 1
    again = await tenant.post("/v1/queues", body, key="old-key")
    assert again.status_code == 409 and again.json()["error"]["code"] == "STATE_CONFLICT"  # a new create of a taken name
