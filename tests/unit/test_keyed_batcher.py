"""The per-queue claim batcher: one transaction at a time per key, bounded by the claims' weight."""

import asyncio

import pytest

from orbit.server.batching import KeyedBatcher

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_batches_are_bounded_by_weight_and_answer_each_command():
    batches: list[list[int]] = []

    async def run(cmds: list[int]) -> list[dict]:
        batches.append(cmds)
        await asyncio.sleep(0)
        return [{"ok": True, "echo": c} for c in cmds]

    b: KeyedBatcher[int, int] = KeyedBatcher("t", run, weight=lambda c: c, max_weight=400)
    replies = await asyncio.gather(*(b.submit("q", w) for w in [100] * 10 + [900, 50]))
    assert [r["echo"] for r in replies] == [100] * 10 + [900, 50]
    assert [sum(x) for x in batches] == [400, 400, 200, 900, 50]  # an over-weight command still runs alone


async def test_keys_are_served_independently_and_failures_reach_their_callers():
    async def run(cmds: list[str]) -> list[dict]:
        if "bad" in cmds:
            raise RuntimeError("boom")
        return [{"ok": True} for _ in cmds]

    b: KeyedBatcher[str, str] = KeyedBatcher("t", run)
    ok, bad = await asyncio.gather(b.submit("a", "x"), b.submit("b", "bad"), return_exceptions=True)
    assert ok == {"ok": True} and isinstance(bad, RuntimeError)
    assert await b.submit("b", "y") == {"ok": True}  # the key is served again afterwards
