"""The examples as real programs against a real `orbit dev`, exactly as the README runs them."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import child_env, free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN_TIMEOUT = 120

RESOURCES_LINES = [
    re.compile(r"backpressure=QUEUE_FULL http=429"),
    re.compile(r"duplicate=true rejected_request_retried=true"),
    re.compile(r"task=(?P<id>[0-9a-f]{32}) state=SUCCEEDED attempts=1"),
    re.compile(r"task=(?P<id>[0-9a-f]{32}) state=SUCCEEDED attempts=1"),
    re.compile(r"unfinished=0 rate_per_second=1 worker_drained=true"),
]


@pytest.fixture
def dev(tmp_path, spawn):
    data = tmp_path / "orbit-data"
    server = spawn("orbit", "dev", "--data-dir", str(data), port=free_port())
    server.wait_ready()
    creds = data.resolve() / "credentials.json"
    env = child_env(ORBIT_URL=server.base, ORBIT_CREDENTIALS_FILE=str(creds))
    token = json.loads(creds.read_text())["token"]
    yield server, env, token
    assert server.terminate(timeout=15) == 0, server.stderr


def run_example(name: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, str(EXAMPLES / name), *args], env=env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{name} did not finish within {RUN_TIMEOUT}s:\n{exc.stdout}\n{exc.stderr}")


def test_resources_example_twice_in_a_row(dev):
    server, env, token = dev
    seen_ids: set[str] = set()
    for run in range(2):
        p = run_example("resources.py", env)
        assert p.returncode == 0, f"run {run}: exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
        lines = p.stdout.splitlines()
        assert len(lines) == 5, p.stdout
        ids = []
        for line, pattern in zip(lines, RESOURCES_LINES):
            m = pattern.fullmatch(line)
            assert m, f"run {run}: {line!r} does not match {pattern.pattern!r}"
            if "id" in pattern.groupindex:
                ids.append(m["id"])
        assert len(set(ids)) == 2
        assert not seen_ids & set(ids)  # every run creates fresh tasks
        seen_ids |= set(ids)
        for task_id in ids:
            r = server.get(f"/v1/tasks/{task_id}", token)
            assert r.status_code == 200 and r.json()["data"]["state"] == "SUCCEEDED"
            assert r.json()["data"]["result"] in ({"echo": {"echo": "second"}}, {"echo": {"echo": "third"}})
        assert token not in p.stdout + p.stderr


def test_quickstart_and_worker_examples(dev):
    _, env, token = dev
    p = run_example("quickstart.py", env)
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert p.stdout.count(" SUCCEEDED attempts=1 ") == 5 and "worker drained: True" in p.stdout

    p = run_example("worker.py", env, "--submit", "3", "--seconds", "6")
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert "drained=true" in p.stderr
    assert p.stderr.count("outcome=succeeded") == 6
    assert token not in p.stdout + p.stderr


WORKER_SCRIPT = """
import os, time
import orbit

worker = orbit.Worker.from_env(queues=[os.environ["EXAMPLE_QUEUE_ID"]], concurrency=2, claim_wait_ms=300)

@worker.handler
def handle(task):
    time.sleep(1.5)
    return {"slept": True, "cancel_requested": task.cancel_requested.is_set()}

worker.run()
print(f"drained={worker.drained}", flush=True)
"""


def test_worker_run_drains_on_sigterm(dev):
    server, env, token = dev
    r = server.post("/v1/queues", {"name": "sigterm", "max_concurrency": 2, "rate_per_second": 10}, token)
    assert r.status_code == 201, r.text
    queue_id = r.json()["data"]["queue"]["id"]
    task_ids = []
    for i in range(3):
        r = server.post(f"/v1/queues/{queue_id}/tasks", {"payload": {"i": i}}, token)
        assert r.status_code == 201, r.text
        task_ids.append(r.json()["data"]["task"]["id"])
    proc = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT], env={**env, "EXAMPLE_QUEUE_ID": queue_id},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            states = [server.get(f"/v1/tasks/{t}", token).json()["data"]["state"] for t in task_ids]
            if states.count("RUNNING") == 2:
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"no two running tasks: {states}"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0, err
    assert out.strip() == "drained=True", (out, err)
    tasks = [server.get(f"/v1/tasks/{t}", token).json()["data"] for t in task_ids]
    assert sorted(t["state"] for t in tasks) == ["SUCCEEDED", "SUCCEEDED", "WAITING"]
    for t in tasks:
        if t["state"] == "SUCCEEDED":
            assert t["attempts"] == 1 and t["result"] == {"slept": True, "cancel_requested": False}
        else:
            assert t["attempts"] == 0
    assert token not in out + err


SCHEDULES_LINES = [
    re.compile(r"schedule=[0-9a-f]{32} every=2s catch_up_window=10s"),
    re.compile(r"before_pause submitted=(?P<n>[2-4]) succeeded=(?P=n)"),
    re.compile(r"paused 16s: handled_while_paused=0"),
    re.compile(r"after_resume caught_up=(?P<k>[4-8]) skipped_misfire=(?P<m>[2-5])"),
    re.compile(r"runs consecutive=true each_once=true retired=true"),
]


def test_schedules_example(dev):
    _, env, token = dev
    p = run_example("schedules.py", env)
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    lines = p.stdout.splitlines()
    assert len(lines) == 5, p.stdout
    for line, pattern in zip(lines, SCHEDULES_LINES):
        assert pattern.fullmatch(line), f"{line!r} does not match {pattern.pattern!r}"
    assert token not in p.stdout + p.stderr
