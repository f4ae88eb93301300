"""`orbit dev`: the embedded single-node mode with a ready development credential."""

from __future__ import annotations

import json
import os
import stat

from orbit.server.core.permissions import ALL_PERMISSIONS

from .conftest import cli_many, free_port


def _queue_names(server, token: str) -> set[str]:
    r = server.get("/v1/queues", token)
    assert r.status_code == 200, r.text
    return {q["name"] for q in r.json()["data"]["items"]}


def test_first_start_restart_keeps_data(tmp_path, spawn):
    data = tmp_path / "orbit-data"
    port = free_port()
    dev = spawn("orbit", "dev", "--data-dir", str(data), port=port)
    dev.wait_ready()
    creds_path = data.resolve() / "credentials.json"
    assert (data / "orbit.db").is_file()
    assert stat.S_IMODE(os.stat(creds_path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(data).st_mode) & 0o077 == 0
    creds = json.loads(creds_path.read_text())
    assert sorted(creds["permissions"]) == sorted(ALL_PERMISSIONS) and len(creds["permissions"]) == 15
    assert creds["queue_scope"] == "*" and creds["environment"] == "development"
    token = creds["token"]
    assert token.startswith("orb_")

    out = dev.stdout
    assert f"http://127.0.0.1:{port}" in out
    assert f"http://127.0.0.1:{port}/ui/" in out
    assert str(creds_path) in out
    assert token not in out and token not in dev.stderr

    before = creds_path.read_bytes()
    assert _queue_names(dev, token) == {"default"}
    created = dev.post("/v1/queues", {"name": "kept", "max_concurrency": 2, "rate_per_second": 5}, token)
    assert created.status_code == 201, created.text

    assert dev.terminate(timeout=15) == 0, dev.stderr

    again = spawn("orbit", "dev", "--data-dir", str(data), port=free_port())
    again.wait_ready()
    assert creds_path.read_bytes() == before  # not reissued
    assert _queue_names(again, token) == {"default", "kept"}
    assert token not in again.stdout and token not in again.stderr
    assert again.terminate(timeout=15) == 0, again.stderr


def test_refuses_a_data_dir_others_can_write_to_and_leaves_it_as_it_was(tmp_path):
    """A shared directory (a temporary one, a team's) is never chmod-ed into a private one."""
    shared, group = tmp_path / "shared", tmp_path / "group"
    for d, mode in ((shared, 0o777), (group, 0o770)):
        d.mkdir()
        os.chmod(d, mode)
    runs = cli_many(*[(["orbit", "dev", "--data-dir", str(d), "--port", str(free_port())], None)
                      for d in (shared, group)])
    for d, mode, run in zip((shared, group), (0o777, 0o770), runs):
        assert run.returncode == 2, run
        assert "group- or world-writable" in run.stderr and str(d) in run.stderr, run
        assert "Traceback" not in run.stderr
        assert stat.S_IMODE(os.stat(d).st_mode) == mode
        assert list(d.iterdir()) == []  # no database, no credential


def test_a_new_data_dir_is_created_private(tmp_path, spawn):
    data = tmp_path / "new" / "orbit-data"
    dev = spawn("orbit", "dev", "--data-dir", str(data), port=free_port())
    dev.wait_ready()
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    assert (data / "credentials.json").is_file()
    assert dev.terminate(timeout=15) == 0, dev.stderr
