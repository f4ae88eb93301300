"""Property-based: whatever a worker sends, each frame gets a reply or the socket is closed with
1008 (workers.md, "Error codes"), never an unhandled exception; the node and another session on
it carry on. Frames are generated as valid frames with one field replaced, dropped or added,
arbitrary JSON values, objects with junk ids and types, text that is not JSON, binary frames,
frames nested deeper than any parser or `repr` takes, and frames over the size limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import orjson
import pytest
import structlog
import websockets
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orbit.server.ws.session import MAX_FRAME_BYTES

from .test_worker_protocol import base  # noqa: F401
from .worker_client import Worker

pytestmark = pytest.mark.anyio

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
MSG_ID = re.compile(r"[\x21-\x7e]{1,128}")
CODES = {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND", "RATE_LIMITED", "QUEUE_PAUSED",
         "LEASE_EXPIRED", "LEASE_LOST", "TASK_CANCELLED", "START_DEADLINE_EXCEEDED", "STATE_CONFLICT",
         "UNAVAILABLE"}
SOME_ID = "0" * 31 + "1"  # a well-formed id no queue or lease has
TEMPLATES: dict[str, dict[str, Any]] = {
    "hello": {"node_id": "prop-node", "queues": [], "sdk": "prop"},
    "claim": {"queue_id": SOME_ID, "max_tasks": 1, "lease_ms": 30_000, "wait_ms": 0},
    "start": {"lease_id": SOME_ID},
    "renew": {"lease_id": SOME_ID, "lease_ms": 30_000},
    "complete": {"lease_id": SOME_ID, "outcome": "succeeded", "result": {"x": 1}},
    "release": {"lease_id": SOME_ID},
    "ping": {},
}
FIELDS = sorted({"id", "type"} | {f for t in TEMPLATES.values() for f in t} | {"error", "payload"})

texts = st.text(max_size=20)
scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | texts
           | st.sampled_from(["", SOME_ID, "succeeded", "failed", "cancelled", "hello", "x" * 129, "\u0000"]))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts | st.sampled_from(FIELDS), inner,
                                                                          max_size=3), max_leaves=8)
msg_ids = st.from_regex(MSG_ID, fullmatch=True) | json_values


@st.composite
def mutated(draw) -> dict[str, Any]:
    """A valid frame of some type with one field replaced, dropped or added."""
    kind = draw(st.sampled_from(sorted(TEMPLATES)))
    frame = {"id": draw(st.from_regex(MSG_ID, fullmatch=True)), "type": kind, **TEMPLATES[kind]}
    change = draw(st.sampled_from(["replace", "drop", "add", "none"]))
    name = draw(st.sampled_from(FIELDS) | texts)
    if change == "drop":
        frame.pop(name, None)
    elif change != "none":
        frame[name] = draw(json_values)
    return frame


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep(depth: int, where: str) -> str:
    if where == "type":
        return '{"id":"deep","type":' + _nested(depth) + "}"
    return '{"id":"deep","type":"complete","lease_id":"' + SOME_ID + '","outcome":"succeeded","result":' \
        + _nested(depth) + "}"


raw_frames = st.one_of(
    mutated().map(json.dumps),
    st.fixed_dictionaries({"id": msg_ids, "type": json_values}).map(json.dumps),
    st.dictionaries(st.sampled_from(FIELDS) | texts, json_values, max_size=5).map(json.dumps),
    json_values.map(json.dumps),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
    st.binary(max_size=40),
    st.builds(_deep, st.integers(min_value=1, max_value=1100), st.sampled_from(["type", "result"])),
)


def expects_close(raw: str | bytes) -> bool:
    """Frames without a usable id: binary, too large, not JSON (as the server's parser reads it:
    no lone surrogates, at most 1024 levels), not an object, no valid id."""
    if isinstance(raw, bytes) or len(raw) > MAX_FRAME_BYTES:
        return True
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return True
    msg_id = value.get("id") if isinstance(value, dict) else None
    return not (isinstance(msg_id, str) and MSG_ID.fullmatch(msg_id))


@pytest.fixture
async def bystander(tenant, base):  # noqa: F811
    """Another session on the node, which every example must leave working."""
    async with Worker.connect(base, tenant.token) as w:
        await w.hello()
        yield w


async def _reply(ws, msg_id: str) -> dict[str, Any]:
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if msg.get("reply_to") == msg_id:
            return msg


@PROPERTY
@given(hello_first=st.booleans(), frames=st.lists(raw_frames, min_size=1, max_size=4))
@example(hello_first=True, frames=['{"id":"x1","type":[]}', '{"id":"x2","type":{}}', '{"id":"x3","type":7}'])
@example(hello_first=False, frames=['{"id":"x1","type":[]}'])
@example(hello_first=True, frames=["{}"])
@example(hello_first=True, frames=[_deep(1000, "type")])
@example(hello_first=True, frames=[_deep(300, "result")])
@example(hello_first=True, frames=[_deep(1025, "type")])
@example(hello_first=True, frames=[b'{"id":"bin","type":"ping"}'])
@example(hello_first=True, frames=['{"id":"big","type":"ping","x":"' + "x" * MAX_FRAME_BYTES + '"}'])
async def test_every_frame_is_answered_or_closes_1008(tenant, base, bystander, hello_first, frames,  # noqa: F811
                                                      caplog):
    caplog.set_level(logging.ERROR)
    url = base.replace("http", "ws", 1) + "/v1/workers/connect"
    with structlog.testing.capture_logs() as events:
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {tenant.token}"},
                                      max_size=None) as ws:
            if hello_first:
                await ws.send(json.dumps({"id": "hello-prop", "type": "hello", "node_id": "n", "queues": []}))
                assert (await _reply(ws, "hello-prop"))["ok"]
            for raw in frames:
                await ws.send(raw)
                if expects_close(raw):
                    with pytest.raises(websockets.ConnectionClosed):
                        await _reply(ws, "never")
                    assert ws.close_code == 1008, (ws.close_code, ws.close_reason)
                    break
                msg_id = orjson.loads(raw)["id"]
                reply = await _reply(ws, msg_id)
                assert isinstance(reply["ok"], bool), reply
                if not reply["ok"]:
                    assert reply["error"]["code"] in CODES, reply
                    assert reply["error"]["code"] != "UNAVAILABLE", reply  # nothing here is an outage
                    assert len(reply["error"]["message"]) < 300, reply
    # The node and the other session carry on; nothing failed unexpectedly on the way.
    assert (await bystander.call("ping"))["ok"]
    assert not [e for e in events if e["log_level"] in ("error", "critical")], events
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records


async def test_a_result_too_deep_to_store_is_refused_and_spares_the_other_reports(tenant, base):  # noqa: F811
    """A result the encoder cannot write (nested beyond its 254 levels) is refused when checked:
    it never reaches the group commit, where it would fail the other sessions' reports too."""
    from .test_worker_protocol import submit, task

    q = await tenant.create_queue(max_concurrency=10)
    ids = await submit(tenant, q["id"], 2)
    async with Worker.connect(base, tenant.token) as a, Worker.connect(base, tenant.token) as b:
        leases = {}
        for w in (a, b):
            await w.hello(q["id"])
            [lease] = (await w.call("claim", queue_id=q["id"], max_tasks=1))["tasks"]
            assert (await w.call("start", lease_id=lease["lease_id"]))["ok"]
            leases[w] = lease
        deep: object = 1
        for _ in range(300):
            deep = [deep]
        bad, good = await asyncio.gather(
            a.call("complete", lease_id=leases[a]["lease_id"], outcome="succeeded", result=deep),
            b.call("complete", lease_id=leases[b]["lease_id"], outcome="succeeded", result={"fine": True}))
        assert bad["error"]["code"] == "INVALID_ARGUMENT" and "result" in bad["error"]["message"], bad
        assert good["ok"] and good["task_state"] == "SUCCEEDED", good
        assert (await task(tenant, leases[a]["task_id"]))["state"] == "RUNNING"
        assert (await a.call("complete", lease_id=leases[a]["lease_id"], outcome="succeeded", result=[[1]]))["ok"]
    assert {(await task(tenant, i))["state"] for i in ids} == {"SUCCEEDED"}
