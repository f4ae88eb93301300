"""The logs of a real `orbit dev` run at DEBUG: one JSON line per request and per worker frame,
and never the token or the application's data."""

from __future__ import annotations

import json
import uuid

from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect


def _call(ws, type_: str, **fields) -> dict:
    msg_id = f"{type_}-{uuid.uuid4().hex[:8]}"
    ws.send(json.dumps({"type": type_, "id": msg_id, **fields}))
    while True:
        reply = json.loads(ws.recv(timeout=10))
        if reply.get("reply_to") == msg_id:
            return reply


def test_a_debug_dev_run_logs_no_token_or_data(tmp_path, spawn):
    data = tmp_path / "orbit-data"
    dev = spawn("orbit", "dev", "--data-dir", str(data), "--log-level", "debug")
    dev.wait_ready()
    token = json.loads((data / "credentials.json").read_text())["token"]
    marks = {k: f"MARK{k.upper()}{uuid.uuid4().hex}" for k in ("payload", "result", "error")}
    queue = dev.get("/v1/queues", token).json()["data"]["items"][0]["id"]
    for k in ("result", "error"):
        r = dev.post(f"/v1/queues/{queue}/tasks", {"payload": {"note": marks["payload"], "do": k}}, token)
        assert r.status_code == 201, r.text
    with connect(dev.base.replace("http", "ws", 1) + "/v1/workers/connect",
                 additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        assert _call(ws, "hello", node_id="e2e", queues=[queue])["ok"]
        tasks = _call(ws, "claim", queue_id=queue, max_tasks=2)["tasks"]
        assert len(tasks) == 2
        for t in tasks:
            assert _call(ws, "start", lease_id=t["lease_id"])["ok"]
            if t["payload"]["do"] == "result":
                done = _call(ws, "complete", lease_id=t["lease_id"], outcome="succeeded",
                             result={"answer": marks["result"]})
            else:
                done = _call(ws, "complete", lease_id=t["lease_id"], outcome="failed",
                             error={"message": marks["error"], "retryable": False})
            assert done["ok"], done
    scraped = dev.get("/metrics")
    assert scraped.status_code == 200
    samples = {s.name: s.value for f in text_string_to_metric_families(scraped.text) for s in f.samples
               if not s.labels}
    assert samples["orbit_tasks_succeeded_total"] == 1 and samples["orbit_tasks_failed_total"] == 1
    assert dev.terminate(timeout=15) == 0, dev.stderr

    logs = dev.stdout + dev.stderr
    secret = token[len("orb_") + 33:]  # the secret may itself contain "_"
    assert token not in logs and secret not in logs
    assert not [m for m in marks.values() if m in logs]
    events = [json.loads(line) for line in dev.stderr.splitlines() if line.startswith("{")]
    submits = [e for e in events if e.get("event") == "request" and e["route"] == "/v1/queues/{queue_id}/tasks"]
    assert len(submits) == 2 and all(e["status"] == 201 and e["credential_id"] for e in submits)
    assert {e["type"] for e in events if e.get("event") == "frame"} >= {"hello", "claim", "start", "complete"}


def test_a_full_queue_is_an_answer_not_a_warning(tmp_path, spawn):
    """QUEUE_FULL refuses a submit in its group transaction: the refusal is the answer, and the
    log has nothing to warn about."""
    data = tmp_path / "orbit-data"
    dev = spawn("orbit", "dev", "--data-dir", str(data))
    dev.wait_ready()
    token = json.loads((data / "credentials.json").read_text())["token"]
    created = dev.post("/v1/queues", {"name": "full", "max_concurrency": 1, "rate_per_second": 1,
                                      "max_unfinished_tasks": 1}, token)
    queue = created.json()["data"]["queue"]["id"]
    codes = [dev.post(f"/v1/queues/{queue}/tasks", {"payload": i}, token).status_code for i in range(3)]
    assert codes == [201, 429, 429]
    assert dev.terminate() == 0
    warnings = [line for line in (dev.stdout + dev.stderr).splitlines()
                if line.startswith("{") and json.loads(line).get("level") in ("warning", "error", "critical")]
    assert warnings == []
