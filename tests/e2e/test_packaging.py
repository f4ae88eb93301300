"""Orbit as a user gets it: the wheel installed into a fresh virtual environment runs `orbit dev`
(migrations, dashboard files and all) and works a task with the SDK; a client generated from
`/openapi.json` by openapi-python-client works against a running node."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import httpx
import pytest

import orbit

from .conftest import child_env

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 600


def _run(argv: list[str], *, cwd: Path | None = None, timeout: float = INSTALL_TIMEOUT, env=None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _dev_token(data_dir: Path) -> str:
    return json.loads((data_dir / "credentials.json").read_text())["token"]


WORK_ONE_TASK = textwrap.dedent("""
    import sys
    import threading
    import time

    import orbit

    url, token, queue_id, task_id = sys.argv[1:5]
    client = orbit.Client(url, token=token)
    worker = orbit.Worker(client, queues=[queue_id], concurrency=2, claim_wait_ms=200)

    @worker.handler
    async def handle(task):
        return {"doubled": task.payload["n"] * 2}

    runner = threading.Thread(target=worker.run)
    runner.start()
    deadline = time.monotonic() + 30
    while client.get_task(task_id).state != "SUCCEEDED" and time.monotonic() < deadline:
        time.sleep(0.1)
    worker.stop()
    runner.join(30)
    print(client.get_task(task_id).state.value)
""")


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_runs_orbit_dev(tmp_path, spawn):
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)])
    (wheel,) = dist.glob("orbit_tasks-*.whl")
    assert wheel.name.startswith(f"orbit_tasks-{orbit.__version__}-")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python, pip = venv / "bin" / "python", venv / "bin" / "pip"
    _run([str(pip), "install", "-q", f"{wheel}[server]"])
    # The SDK alone imports nothing of the server.
    no_server = "import sys, orbit; assert 'fastapi' not in sys.modules and 'sqlalchemy' not in sys.modules"
    _run([str(python), "-c", no_server], cwd=tmp_path)
    assert _run([str(venv / "bin" / "orbit"), "--version"], cwd=tmp_path).strip() == \
        f"orbit, version {orbit.__version__}"

    data = tmp_path / "orbit-data"
    env = child_env()
    env.pop("PYTHONPATH", None)
    dev = spawn(str(venv / "bin" / "orbit"), "dev", "--data-dir", str(data), env=env)
    dev.wait_ready()
    token = _dev_token(data)
    ui = dev.get("/ui/")
    assert ui.status_code == 200 and "<html" in ui.text.lower()
    assert dev.get("/ui/app.js").status_code == 200
    queue = dev.post("/v1/queues", {"name": "wheel", "max_concurrency": 2, "rate_per_second": 10}, token)
    assert queue.status_code == 201, queue.text
    qid = queue.json()["data"]["queue"]["id"]
    task = dev.post(f"/v1/queues/{qid}/tasks", {"payload": {"n": 21}}, token)
    assert task.status_code == 201, task.text
    tid = task.json()["data"]["task"]["id"]
    worker = tmp_path / "work_one.py"
    worker.write_text(WORK_ONE_TASK)
    out = _run([str(python), str(worker), dev.base, token, qid, tid], cwd=tmp_path, timeout=60, env=env)
    assert out.strip().endswith("SUCCEEDED"), out
    got = dev.get(f"/v1/tasks/{tid}", token).json()["data"]
    assert got["state"] == "SUCCEEDED" and got["result"] == {"doubled": 42}
    assert dev.terminate() == 0, dev.stderr


def test_a_client_generated_from_the_openapi_document_works(tmp_path, spawn):
    pytest.importorskip("openapi_python_client")
    data = tmp_path / "orbit-data"
    dev = spawn("orbit", "dev", "--data-dir", str(data))
    dev.wait_ready()
    token = _dev_token(data)
    (tmp_path / "openapi.json").write_text(httpx.get(f"{dev.base}/openapi.json", timeout=10).text)
    (tmp_path / "config.yaml").write_text("post_hooks: []\npackage_name_override: orbit_generated\n")
    _run(["openapi-python-client", "generate", "--path", "openapi.json", "--config", "config.yaml", "--meta",
          "none", "--output-path", "orbit_generated"], cwd=tmp_path, timeout=120)
    sys.path.insert(0, str(tmp_path))
    try:
        from orbit_generated import AuthenticatedClient
        from orbit_generated.api.queues import create_queue, get_queue, list_queues
        from orbit_generated.api.tasks import get_task, submit_task
        from orbit_generated.models import CreateQueueRequest, SubmitTaskRequest

        client = AuthenticatedClient(base_url=dev.base, token=token)
        created = create_queue.sync_detailed(
            client=client, idempotency_key=uuid.uuid4().hex,
            body=CreateQueueRequest(name="generated", max_concurrency=3, rate_per_second=7))
        assert created.status_code == 201, created.content
        queue = created.parsed.data.queue
        assert get_queue.sync(queue.id, client=client).data.max_concurrency == 3
        assert "generated" in [q.name for q in list_queues.sync(client=client).data.items]
        body = SubmitTaskRequest.from_dict({"payload": {"hello": "world"}, "priority": 8})
        submitted = submit_task.sync_detailed(queue.id, client=client, body=body, idempotency_key="first")
        assert submitted.status_code == 201, submitted.content
        task_id = submitted.parsed.data.task.id
        task = get_task.sync(task_id, client=client).data
        assert task.state == "WAITING" and task.priority == 8
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "orbit_generated" or m.startswith("orbit_generated.")]:
            del sys.modules[name]
