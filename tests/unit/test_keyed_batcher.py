"""The batchers: per key one transaction at a time, bounded by the claims' weight; a failed group
runs again command by command."""

import asyncio

import pytest

from orbit.server.batching import GroupCommitter, KeyedBatcher
from orbit.server.errors import DatabaseUnavailable, ValueRefused

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


async def test_a_failed_group_runs_again_one_command_at_a_time():
    """A group that fails (a value the database refused, a bug) is run again command by
    command: only the command at fault fails, the others get their answers."""
    batches: list[list[str]] = []

    async def run(cmds: list[str]) -> list[dict]:
        batches.append(cmds)
        await asyncio.sleep(0)
        if "bad" in cmds:
            raise ValueRefused()
        return [{"echo": c} for c in cmds]

    keyed: KeyedBatcher[str, dict] = KeyedBatcher("t", run)
    replies = await asyncio.gather(*(keyed.submit("q", c) for c in ["a", "bad", "c"]), return_exceptions=True)
    assert replies[0] == {"echo": "a"} and replies[2] == {"echo": "c"} and isinstance(replies[1], ValueRefused)
    assert batches == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]

    batches.clear()
    group: GroupCommitter[str] = GroupCommitter("t", run)
    group.start()
    try:
        futures = [group.enqueue(c) for c in ["a", "bad", "c"]]
        replies = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        await group.stop()
    assert replies[0] == {"echo": "a"} and replies[2] == {"echo": "c"} and isinstance(replies[1], ValueRefused)
    assert batches == [["a", "bad", "c"], ["a"], ["bad"], ["c"]]


async def test_an_outage_fails_the_whole_group_at_once():
    """The database being unavailable is everyone's answer: no command is run again alone."""
    batches: list[list[str]] = []

    async def run(cmds: list[str]) -> list[dict]:
        batches.append(cmds)
        raise DatabaseUnavailable("down")

    keyed: KeyedBatcher[str, dict] = KeyedBatcher("t", run)
    replies = await asyncio.gather(*(keyed.submit("q", c) for c in ["a", "b"]), return_exceptions=True)
    assert all(isinstance(r, DatabaseUnavailable) for r in replies) and batches == [["a", "b"]]
