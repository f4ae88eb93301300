"""Trace context: a submit's W3C `traceparent` travels with its task to the worker that runs it,
and the SDK worker runs the handler inside an OpenTelemetry span continuing that trace."""

from __future__ import annotations

import asyncio

import pytest

from .worker_client import Worker

pytestmark = pytest.mark.anyio

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def submit_traced(tenant, queue_id: str, traceparent: str | None, key: str | None = None) -> str:
    headers = tenant.headers(None, key or tenant.key())
    if traceparent is not None:
        headers["traceparent"] = traceparent
    r = await tenant.http.post(f"/v1/queues/{queue_id}/tasks", json={"payload": {"x": 1}}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["data"]["task"]["id"]


async def test_a_submits_traceparent_reaches_the_lease(tenant, base):
    q = await tenant.create_queue()
    traced = await submit_traced(tenant, q["id"], TRACE)
    plain = await submit_traced(tenant, q["id"], None)
    bogus = await submit_traced(tenant, q["id"], "00-00000000000000000000000000000000-00f067aa0ba902b7-01")
    headers = tenant.headers(None, tenant.key())
    headers["traceparent"] = TRACE
    r = await tenant.http.post(f"/v1/queues/{q['id']}/tasks:batch", headers=headers,
                               json={"tasks": [{"idempotency_key": "b-1", "payload": {}}]})
    batched = r.json()["data"]["results"][0]["task"]["id"]
    async with Worker.connect(base, tenant.token) as w:
        await w.hello(q["id"])
        msg = f"claim-{q['id']}"
        got = {t["task_id"]: t["traceparent"] for t in (await w.call("claim", id=msg, queue_id=q["id"],
                                                                      max_tasks=10))["tasks"]}
        assert got == {traced: TRACE, plain: None, bogus: None, batched: TRACE}
        replay = await w.call("claim", id=msg, queue_id=q["id"], max_tasks=10)
        assert {t["task_id"]: t["traceparent"] for t in replay["tasks"]} == got


async def test_the_sdk_worker_runs_the_handler_in_the_submits_trace(tenant, base):
    import orbit
    from opentelemetry import trace

    q = await tenant.create_queue()
    await submit_traced(tenant, q["id"], TRACE)
    seen: list[tuple[str | None, str]] = []
    async with orbit.AsyncClient(base, token=tenant.token) as client:
        worker = orbit.Worker(client, queues=[q["id"]], concurrency=1, claim_wait_ms=200)

        @worker.handler
        async def handle(task: orbit.TaskContext):
            seen.append((task.traceparent, format(trace.get_current_span().get_span_context().trace_id, "032x")))
            return {"ok": True}

        runner = asyncio.create_task(worker.arun())
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.05)
        await worker.astop()
        await runner
    assert seen == [(TRACE, "4bf92f3577b34da6a3ce929d0e0e4736")]
