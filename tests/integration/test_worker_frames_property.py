"""Property-based: whatever a worker sends, each frame gets a reply in the protocol's shape or the
socket is closed with 1008 (policy violation), never an unhandled exception; another
session on the node claims, starts and completes a task meanwhile and afterwards; nothing is
logged at error level and no value reaches the database only to be refused there.

Frames are valid frames of every command (on a real queue and a real lease) with one to three
mutations (a field replaced by a value of the wrong type, a huge or odd string, a huge, negative
or fractional number, deep nesting; a field dropped or added; the type swapped), the JSON text
of such frames damaged, arbitrary JSON values, text that is not JSON, text frames that are not
UTF-8, binary and empty frames, and frames over the node's frame limit: in bytes (four-byte
characters), and over the WebSocket layer's own limit, which that layer closes with 1009
("message too big") before any application code sees it. They are sent one at a time or all at
once. ORBIT_FUZZ_EXAMPLES sets the number of examples per backend (CI: 60); the frame counts
are printed at the end.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
import structlog
import websockets
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.ws.session import MAX_FRAME_BYTES

from .test_worker_protocol import submit
from .worker_client import Worker, serve

pytestmark = pytest.mark.anyio

EXAMPLES = int(os.environ.get("ORBIT_FUZZ_EXAMPLES", "60"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
# The WebSocket layer's own message limit (uvicorn's ws_max_size, which the test server and
# `orbit server` keep): beyond it the layer closes with 1009 before the session sees the frame.
TRANSPORT_LIMIT = 16 * 1024 * 1024
MSG_ID = re.compile(r"[\x21-\x7e]{1,128}")
CODES = {"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND", "RATE_LIMITED", "QUEUE_PAUSED",
         "LEASE_EXPIRED", "LEASE_LOST", "TASK_CANCELLED", "START_DEADLINE_EXCEEDED", "STATE_CONFLICT",
         "UNAVAILABLE"}
SOME_ID = "0" * 31 + "1"  # a well-formed id no queue or lease has
# Replaced in each example by the fuzzed queue's id and a lease on it that the fuzzed session may use.
QUEUE, LEASE = "$QUEUE$", "$LEASE$"
TEMPLATES: dict[str, list[dict[str, Any]]] = {
    "hello": [{"node_id": "prop-node", "queues": [QUEUE], "sdk": "prop"}],
    "claim": [{"queue_id": QUEUE, "max_tasks": 1, "lease_ms": 30_000, "wait_ms": 0}],
    "start": [{"lease_id": LEASE}],
    "renew": [{"lease_id": LEASE, "lease_ms": 30_000}],
    "complete": [{"lease_id": LEASE, "outcome": "succeeded", "result": {"x": 1}},
                 {"lease_id": LEASE, "outcome": "failed", "error": {"message": "boom", "retryable": False}},
                 {"lease_id": LEASE, "outcome": "cancelled"}],
    "release": [{"lease_id": LEASE}],
    "ping": [{}],
}
KINDS = sorted(TEMPLATES)
FIELDS = sorted({"id", "type"} | {f for ts in TEMPLATES.values() for t in ts for f in t} | {"payload", "message"})


@dataclass(frozen=True)
class Binary:
    data: bytes


@dataclass(frozen=True)
class NotUtf8:
    """A text frame whose bytes are not UTF-8."""

    data: bytes


@dataclass(frozen=True)
class Oversize:
    """A ping padded to `size` bytes with `char`, built when sent."""

    size: int
    char: str

    def text(self) -> str:
        head = '{"id":"big","type":"ping","pad":"'
        room = self.size - len(head) - 2
        width = len(self.char.encode())
        return head + self.char * (room // width) + "x" * (room % width) + '"}'


Frame = str | Binary | NotUtf8 | Oversize

# ---------------------------------------------------------------- values

# Numbers: out of every range, at the edges of 32 and 64 bits and of a double, fractional.
# Integers that a claim would take as a long poll (wait_ms up to 30000) are kept short.
odd_numbers = (
    st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1,
                     10**30, -(10**30), 10**400, 0.5, -0.0, 1.0, 30000.0, 1e308, 5e-324])
    | st.integers(min_value=-(2**70), max_value=2**70).filter(lambda v: not 50 <= v <= 30_000)
    | st.floats()
)
odd_chars = st.sampled_from(["x", "é", "\U0001f600", "\u0000", " ", "\u202e", "\ufeff", "\uffff", "\U0010ffff",
                             "\u0301", "\n", '"', "\\", "\ud800"])
huge_strings = st.builds(lambda c, n: c * n, odd_chars,
                         st.sampled_from([2, 64, 127, 128, 129, 256, 257, 4096, 4097, 70_000, 300_000]))
strings = (st.text(max_size=30) | huge_strings
           | st.sampled_from(["", SOME_ID, QUEUE, LEASE, "succeeded", "failed", "cancelled", "release", "hello",
                              "ping", SOME_ID.upper(), SOME_ID[:-1], "00000000-0000-0000-0000-000000000001"]))
scalars = st.none() | st.booleans() | odd_numbers | strings


def _deep(depth: int, bracket: str) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if bracket == "[" else {"a": value}
    return value


json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(strings | st.sampled_from(FIELDS), inner,
                                                                          max_size=4), max_leaves=10)
deep_values = st.builds(_deep, st.integers(min_value=2, max_value=300), st.sampled_from(["[", "{"]))
odd_values = json_values | deep_values | st.lists(st.sampled_from([QUEUE, SOME_ID, 7, None]), min_size=1001,
                                                  max_size=1001)


# ---------------------------------------------------------------- frames


@st.composite
def mutated(draw) -> dict[str, Any]:
    """A valid frame of some command with one to three mutations."""
    kind = draw(st.sampled_from(KINDS))
    frame: dict[str, Any] = {"id": draw(st.from_regex(MSG_ID, fullmatch=True)), "type": kind,
                             **draw(st.sampled_from(TEMPLATES[kind]))}
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        change = draw(st.sampled_from(["replace", "replace", "drop", "add", "retype", "nest", "error"]))
        name = draw(st.sampled_from(sorted(frame)) if change in ("replace", "drop", "nest") and frame
                    else st.sampled_from(FIELDS) | st.text(max_size=10))
        if change == "drop":
            frame.pop(name, None)
        elif change == "retype":
            frame["type"] = draw(st.sampled_from(KINDS))
        elif change == "nest" and name in frame:
            frame[name] = draw(st.sampled_from([[frame[name]], {"value": frame[name]}]))
        elif change == "error":
            frame["error"] = draw(st.dictionaries(st.sampled_from(["message", "retryable", "code"]) | strings,
                                                  scalars, max_size=3))
        else:
            frame[name] = draw(odd_values)
    return frame


def encode(value: Any, ascii_only: bool) -> str:
    """JSON text as a client would write it; NaN and the infinities come out as the bare words
    Python writes, which are not JSON. A lone surrogate can only travel escaped."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    try:
        text.encode()
    except UnicodeEncodeError:
        text = json.dumps(value)
    return text


@st.composite
def damaged(draw) -> str:
    """The JSON text of a (mutated) frame, damaged."""
    text = encode(draw(mutated()), draw(st.booleans()))
    at = draw(st.integers(min_value=0, max_value=len(text)))
    how = draw(st.sampled_from(["cut", "insert", "append", "prefix", "duplicate_id", "swap_brackets"]))
    if how == "cut":
        return text[:at]
    if how == "insert":
        return text[:at] + draw(st.text(min_size=1, max_size=3)) + text[at:]
    if how == "append":
        return text + draw(st.sampled_from([" ", ",", "}", "\n", "x", "\u0000", "{}"]))
    if how == "prefix":
        return draw(st.sampled_from(["\ufeff", " \n\t", "[", "x"])) + text
    if how == "duplicate_id":
        return text[:-1] + ',"id":' + json.dumps(draw(scalars)) + "}" if text.endswith("}") else text
    return text.replace("{", "[").replace("}", "]")


def _raw_deep(depth: int, where: str) -> str:
    nested = "[" * depth + "]" * depth
    if where == "type":
        return '{"id":"deep","type":' + nested + "}"
    return '{"id":"deep","type":"complete","lease_id":"' + LEASE + '","outcome":"succeeded","result":' + nested + "}"


invalid_utf8 = st.tuples(st.binary(max_size=20), st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82",
                                                                  b"\xf4\x90\x80\x80", b"\x80"]),
                         st.binary(max_size=20)).map(lambda t: b"".join(t))
valid_then_mutated = st.builds(encode, mutated(), st.booleans())
# Most frames have a usable id, so that a session goes on answering them (one_of would pick each
# alternative as often, repeated ones included).
frames: st.SearchStrategy[Frame] = st.sampled_from([valid_then_mutated] * 8 + [

    st.builds(encode, st.fixed_dictionaries({"id": st.from_regex(MSG_ID, fullmatch=True) | json_values,
                                             "type": json_values}), st.booleans()),
    damaged(),
    st.builds(_raw_deep, st.integers(min_value=1, max_value=1100), st.sampled_from(["type", "result"])),
    st.one_of(
        st.builds(encode, st.dictionaries(st.sampled_from(FIELDS) | strings, json_values, max_size=5), st.booleans()),
        st.builds(encode, json_values, st.booleans()),
        st.text(max_size=40),
        st.sampled_from(["", " ", "null", "[]", "{}", '{"id":""}', '{"id":"x"}', '{"id":"x","type":null}']),
    ),
    st.one_of(  # frames that close the socket whatever they hold
        st.binary(max_size=40).map(Binary),
        invalid_utf8.map(NotUtf8),
        st.builds(lambda m, bad: NotUtf8(encode(m, False).encode()[:-2] + bad + b'"}'), mutated(), invalid_utf8),
        st.builds(Oversize, st.sampled_from([MAX_FRAME_BYTES + 1, MAX_FRAME_BYTES + 4, 2 * MAX_FRAME_BYTES]),
                  st.sampled_from(["x", "é", "\U0001f600"])),
    ),
]).flatmap(lambda strategy: strategy)


def expected_close(raw: str | bytes, binary: bool) -> int | None:
    """The close code a frame must get (None: a reply). 1008 for a frame without a usable id:
    binary, not UTF-8, too large, not JSON (as the server's parser reads it: no lone surrogates,
    at most 1024 levels, no NaN), not an object, no valid id; 1009 over the WebSocket limit."""
    size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
    if size > TRANSPORT_LIMIT:
        return 1009
    if binary or isinstance(raw, bytes) or size > MAX_FRAME_BYTES:
        return 1008
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return 1008
    msg_id = value.get("id") if isinstance(value, dict) else None
    return None if isinstance(msg_id, str) and MSG_ID.fullmatch(msg_id) else 1008


def wire(frame: Frame, queue_id: str, lease_id: str) -> tuple[str | bytes, bool, int | None]:
    """What is sent (text as str, or bytes), whether as a binary frame, and the close it must get."""
    if isinstance(frame, Binary):
        return frame.data, True, 1008
    if isinstance(frame, NotUtf8):
        data = frame.data.replace(QUEUE.encode(), queue_id.encode()).replace(LEASE.encode(), lease_id.encode())
        return data, False, 1008
    text = frame.text() if isinstance(frame, Oversize) else frame.replace(QUEUE, queue_id).replace(LEASE, lease_id)
    return text, False, expected_close(text, False)


# ---------------------------------------------------------------- the sessions

STATS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module", autouse=True)
def frame_counts(request):
    """Print, per backend, how many frames were sent and how they were answered."""
    yield
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        for backend, counts in sorted(STATS.items()):
            print(f"\nworker frame fuzz [{backend}]: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))


@dataclass
class Node:
    tenant: Any
    url: str
    hub: Any
    fuzzed_queue: str
    bystander_queue: str
    bystander: Worker
    feeder: Worker
    backend: str

    async def settled(self) -> None:
        """What the node keeps for sessions and long polls is back to the two well-behaved
        sessions' (a socket's session ends just after its close reaches the client)."""
        for _ in range(200):
            if len(self.hub.sessions) == 2 and not self.hub.notifier._polled and not self.hub.notifier._missed:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"left behind: {len(self.hub.sessions)} sessions, polled "
                             f"{list(self.hub.notifier._polled)[:5]}, missed {list(self.hub.notifier._missed)[:5]}")


@pytest.fixture
async def node(tenant, db, db_url):
    """The node under test, a queue to fuzz (a task and a lease on it per example), and a
    well-behaved session on its own queue, which every example must leave working."""
    app = create_app(Settings(database_url=db_url, node_id="t", background_loops=False), db)
    fuzzed = await tenant.create_queue(max_concurrency=100_000, rate_per_second=1_000_000,
                                       max_unfinished_tasks=1_000_000)
    quiet = await tenant.create_queue(max_concurrency=10, rate_per_second=1_000_000)
    async with serve(app) as base, Worker.connect(base, tenant.token) as bystander, \
            Worker.connect(base, tenant.token) as feeder:
        await bystander.hello(quiet["id"], node_id="bystander")
        await feeder.hello(fuzzed["id"], node_id="feeder")
        yield Node(tenant, base.replace("http", "ws", 1) + "/v1/workers/connect", app.state.node.hub, fuzzed["id"],
                   quiet["id"], bystander, feeder, "sqlite" if db_url.startswith("sqlite") else "mariadb")


async def run_a_task(node: Node) -> None:
    """The well-behaved session claims, starts and completes a task of its own."""
    w = node.bystander
    await submit(node.tenant, node.bystander_queue, 1)
    claim = await w.call("claim", queue_id=node.bystander_queue, max_tasks=1, wait_ms=5000)
    assert claim["ok"] and len(claim["tasks"]) == 1, claim
    lease_id = claim["tasks"][0]["lease_id"]
    start = await w.call("start", lease_id=lease_id)
    assert start["ok"], start
    done = await w.call("complete", lease_id=lease_id, outcome="succeeded", result={"attempt": start["attempt"]})
    assert done.get("task_state") == "SUCCEEDED", done


async def a_lease(node: Node) -> str:
    """A lease on a fresh task of the fuzzed queue, held by the same credential."""
    await submit(node.tenant, node.fuzzed_queue, 1)
    claim = await node.feeder.call("claim", queue_id=node.fuzzed_queue, max_tasks=1, lease_ms=600_000)
    assert claim["ok"] and len(claim["tasks"]) == 1, claim
    return claim["tasks"][0]["lease_id"]


def check_reply(reply: dict[str, Any]) -> str:
    """A reply in the protocol's shape; its error code, or OK."""
    assert isinstance(reply.get("ok"), bool), reply
    if reply["ok"]:
        assert "error" not in reply, reply
        return "OK"
    assert set(reply) == {"reply_to", "ok", "error"}, reply
    error = reply["error"]
    assert {"code", "message"} <= set(error) <= {"code", "message", "retry_after_ms"}, reply
    assert error["code"] in CODES and error["code"] != "UNAVAILABLE", reply  # nothing here is an outage
    assert isinstance(error["message"], str) and 0 < len(error["message"]) < 300, reply
    if "retry_after_ms" in error:
        assert isinstance(error["retry_after_ms"], int) and error["retry_after_ms"] >= 0, reply
    return error["code"]


async def next_message(ws) -> dict[str, Any]:
    """The next reply or push; ConnectionClosed once the server closed."""
    return json.loads(await asyncio.wait_for(ws.recv(), 15))


async def fuzz_session(node: Node, hello_first: bool, pipelined: bool, sent: list[Frame]) -> None:
    """Send the frames, on a new socket after each one that closed the last."""
    lease_id = await a_lease(node)
    rest = sent
    while rest:
        rest = await one_socket(node, hello_first, pipelined, rest, lease_id)


async def one_socket(node: Node, hello_first: bool, pipelined: bool, sent: list[Frame], lease_id: str) -> list[Frame]:
    """Send frames up to the first that must close the socket; the frames left to send."""
    stats = STATS[node.backend]
    async with websockets.connect(node.url, additional_headers={"Authorization": f"Bearer {node.tenant.token}"},
                                  max_size=None) as ws:
        waiting: collections.Counter = collections.Counter()
        if hello_first:
            await ws.send(json.dumps({"id": "hello-prop", "type": "hello", "node_id": "n",
                                      "queues": [node.fuzzed_queue]}))
            hello: collections.Counter = collections.Counter()
            waiting["hello-prop"] += 1
            await collect(ws, waiting, hello)
            assert hello["OK"] == 1, hello
        for i, frame in enumerate(sent):
            data, binary, close = wire(frame, node.fuzzed_queue, lease_id)
            stats["frames"] += 1
            await ws.send(data, text=not binary)
            if close is not None:
                # Replies to earlier frames may be lost with the socket; the close itself is not.
                with pytest.raises(websockets.ConnectionClosed):
                    while True:
                        message = await next_message(ws)
                        if "reply_to" in message:
                            assert message["reply_to"] in waiting, message
                            check_reply(message)
                assert ws.close_code == close, (ws.close_code, ws.close_reason)
                stats[f"closed_{close}"] += 1
                return sent[i + 1:]
            waiting[orjson.loads(data)["id"]] += 1
            if not pipelined:
                await collect(ws, waiting, stats)
        await collect(ws, waiting, stats)
        # The session is alive and well after all that.
        await ws.send(json.dumps({"id": "ping-after", "type": "ping"}))
        after: collections.Counter = collections.Counter()
        waiting["ping-after"] += 1
        await collect(ws, waiting, after)
        assert after["OK"] == 1, after
        return []


async def collect(ws, waiting: collections.Counter, stats: collections.Counter) -> None:
    """Read until every frame in `waiting` has its reply."""
    while +waiting:
        message = await next_message(ws)
        if "reply_to" not in message:
            continue  # a push
        assert waiting[message["reply_to"]] > 0, message
        waiting[message["reply_to"]] -= 1
        stats[check_reply(message)] += 1


@PROPERTY
@given(hello_first=st.booleans(), pipelined=st.booleans(), sent=st.lists(frames, min_size=1, max_size=12))
@example(hello_first=True, pipelined=False, sent=['{"id":"x1","type":[]}', '{"id":"x2","type":{}}', '{"id":"x3","type":7}'])
@example(hello_first=False, pipelined=False, sent=['{"id":"x1","type":[]}'])
@example(hello_first=True, pipelined=False, sent=["{}"])
@example(hello_first=True, pipelined=False, sent=[""])
@example(hello_first=True, pipelined=False, sent=[Binary(b"")])
@example(hello_first=True, pipelined=False, sent=[_raw_deep(1000, "type")])
@example(hello_first=True, pipelined=False, sent=[_raw_deep(300, "result")])
@example(hello_first=True, pipelined=False, sent=[_raw_deep(1025, "type")])
@example(hello_first=True, pipelined=False, sent=[Binary(b'{"id":"bin","type":"ping"}')])
@example(hello_first=True, pipelined=False, sent=[NotUtf8(b'{"id":"u","type":"ping","x":"\xff"}')])
@example(hello_first=True, pipelined=True, sent=['{"id":"p1","type":"ping"}', NotUtf8(b"\xed\xa0\x80")])
@example(hello_first=True, pipelined=False, sent=[Oversize(MAX_FRAME_BYTES + 1, "x")])
@example(hello_first=True, pipelined=False, sent=[Oversize(MAX_FRAME_BYTES + 4, "\U0001f600")])  # 1/4 as many characters
@example(hello_first=True, pipelined=False, sent=[Oversize(TRANSPORT_LIMIT + 1, "x")])
@example(hello_first=True, pipelined=True,
         sent=['{"id":"c1","type":"complete","lease_id":"' + LEASE + '","outcome":"succeeded","result":"'
               + "\U0001f600" * 70_000 + '"}', '{"id":"c2","type":"start","lease_id":"' + LEASE + '"}'])
async def test_every_frame_is_answered_or_closes_1008(node, hello_first, pipelined, sent, caplog):
    caplog.clear()
    caplog.set_level(logging.WARNING)
    with structlog.testing.capture_logs() as events:
        # The well-behaved session works while the fuzzed one is at it, and afterwards.
        await asyncio.gather(fuzz_session(node, hello_first, pipelined, sent), run_a_task(node))
        await run_a_task(node)
        await node.settled()
    assert not [e for e in events if e["log_level"] in ("error", "critical")], events
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records
    # Validation refuses every value the database would: none reaches it only to be refused there.
    assert not [e for e in events if e["event"] in ("database_refused_value", "group_commit_failed",
                                                    "batch_failed")], events


def wire_frame(opcode: int, payload: bytes, *, fin: bool = True, rsv: int = 0, mask: bool = True) -> bytes:
    """A WebSocket frame as a client writes it (RFC 6455, 5.2), right or wrong."""
    first = (0x80 if fin else 0) | rsv << 4 | opcode
    masked = 0x80 if mask else 0
    n = len(payload)
    if n < 126:
        head = bytes([first, masked | n])
    elif n < 1 << 16:
        head = bytes([first, masked | 126]) + struct.pack(">H", n)
    else:
        head = bytes([first, masked | 127]) + struct.pack(">Q", n)
    if not mask:
        return head + payload
    key = b"\x01\x02\x03\x04"
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


PING = b'{"id":"p","type":"ping"}'
VIOLATIONS = {
    "reserved opcode": (wire_frame(3, PING), 1002),
    "reserved bits": (wire_frame(1, PING, rsv=2), 1002),
    "unmasked": (wire_frame(1, PING, mask=False), 1002),
    "continuation first": (wire_frame(0, PING), 1002),
    "text inside a fragmented text": (wire_frame(1, PING[:5], fin=False) + wire_frame(1, PING[5:]), 1002),
    "control frame over 125 bytes": (wire_frame(9, b"x" * 126), 1002),
    "fragmented control frame": (wire_frame(9, b"x", fin=False), 1002),
    "close code 999": (wire_frame(8, struct.pack(">H", 999)), 1002),
    "close reason not UTF-8": (wire_frame(8, struct.pack(">H", 1000) + b"\xff"), 1007),
    "length of 2**63 - 1": (bytes([0x81, 0xFF]) + struct.pack(">Q", 2**63 - 1) + b"\0\0\0\0", 1009),
    "fragments not UTF-8 once joined": (wire_frame(1, b'{"id":"p","type":"ping","x":"\xc3', fin=False)
                                        + wire_frame(0, b'("}'), 1008),
}


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
async def test_websocket_protocol_violations_close_quietly(node, case, caplog):
    """Frames that break the WebSocket protocol itself are closed by its layer with the RFC's
    code, before any frame reaches the session: quietly, and the node carries on."""
    data, code = VIOLATIONS[case]
    caplog.set_level(logging.WARNING)
    with structlog.testing.capture_logs() as events:
        async with websockets.connect(node.url, additional_headers={"Authorization": f"Bearer {node.tenant.token}"},
                                      max_size=None) as ws:
            ws.transport.write(data)
            with pytest.raises(websockets.ConnectionClosed):
                await next_message(ws)
        assert ws.close_code == code, (ws.close_code, ws.close_reason)
        await run_a_task(node)
        await node.settled()
    assert not [e for e in events if e["log_level"] in ("error", "critical")], events
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records


async def test_a_result_too_deep_to_store_is_refused_and_spares_the_other_reports(tenant, base):
    """A result the encoder cannot write (nested beyond its 254 levels) is refused when checked:
    it never reaches the group commit, where it would fail the other sessions' reports too."""
    from .test_worker_protocol import task

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
