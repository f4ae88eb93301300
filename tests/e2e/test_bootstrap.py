"""`orbit-admin bootstrap`: idempotent tenancy, a new credential per run, a safe 0600 file."""

from __future__ import annotations

import json
import os
import stat
import uuid

from orbit.server.core.permissions import BOOTSTRAP_PERMISSIONS
from orbit.server.services import tenancy

from .conftest import admin, child_env, cli_many, run_db

FILE_KEYS = {
    "credential_id", "token", "application_id", "namespace_id", "environment", "queue_id", "permissions",
    "queue_scope",
}


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _credential_ids(url: str, app_name: str) -> list[str]:
    async def body(tx):
        app = await tenancy.find_application(tx, app_name)
        return [c["id"] for c in await tenancy.list_credentials(tx, app["id"])]

    return sorted(run_db(url, body))


def _bootstrap_argv(app: str, *extra: str) -> list[str]:
    return ["orbit-admin", "bootstrap", "--application", app, "--namespace", "ns", "--environment", "development",
            "--queue", "jobs", *extra]


def test_bootstrap_is_idempotent_but_issues_a_new_credential(db_url, private_dir):
    app = f"e2e-{uuid.uuid4().hex[:10]}"
    env = child_env(ORBIT_DATABASE_URL=db_url)
    first_path, second_path = private_dir / "first.json", private_dir / "second.json"

    first = admin(*_bootstrap_argv(app, "--output", str(first_path))[1:], env=env)
    assert first.returncode == 0, first
    assert _mode(first_path) == 0o600
    c1 = json.loads(first_path.read_text())
    assert set(c1) == FILE_KEYS
    assert c1["token"].startswith(f"orb_{c1['credential_id']}_")
    assert c1["permissions"] == sorted(BOOTSTRAP_PERMISSIONS) and "worker" not in c1["permissions"]
    assert c1["queue_scope"] == "*" and c1["environment"] == "development"
    assert c1["queue_id"] and len(c1["queue_id"]) == 32
    assert c1["token"] not in first.output and c1["credential_id"] in first.stdout

    second = admin(*_bootstrap_argv(app, "--worker-access", "--permission", "tasks:review",
                                    "--output", str(second_path))[1:], env=env)
    assert second.returncode == 0, second
    assert _mode(second_path) == 0o600
    c2 = json.loads(second_path.read_text())
    for key in ("application_id", "namespace_id", "queue_id", "environment", "queue_scope"):
        assert c2[key] == c1[key], key  # the tenancy is ensured, not duplicated
    assert c2["credential_id"] != c1["credential_id"] and c2["token"] != c1["token"]
    assert c2["permissions"] == sorted([*BOOTSTRAP_PERMISSIONS, "worker", "tasks:review"])
    assert c2["token"] not in second.output
    assert _credential_ids(db_url, app) == sorted([c1["credential_id"], c2["credential_id"]])


def test_refusals_issue_nothing_and_force_overwrites(sqlite_url, private_dir, tmp_path):
    app = f"e2e-{uuid.uuid4().hex[:10]}"
    env = child_env(ORBIT_DATABASE_URL=sqlite_url)
    path = private_dir / "creds.json"
    first = admin(*_bootstrap_argv(app, "--output", str(path))[1:], env=env)
    assert first.returncode == 0, first
    c1 = json.loads(path.read_text())
    before = path.read_bytes()

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    other_env = [*_bootstrap_argv(app)[:6], "--environment", "production", "--queue", "jobs"]
    exists, world_writable, wrong_env = cli_many(
        (_bootstrap_argv(app, "--output", str(path)), env),
        (_bootstrap_argv(app, "--output", str(shared / "c.json")), env),
        ([*other_env, "--output", str(private_dir / "x.json")], env),
    )
    assert exists.returncode != 0 and "--force" in exists.stderr, exists
    assert path.read_bytes() == before
    assert world_writable.returncode != 0 and "writable" in world_writable.stderr, world_writable
    assert list(shared.iterdir()) == []
    assert wrong_env.returncode != 0 and "environment" in wrong_env.stderr, wrong_env
    assert not (private_dir / "x.json").exists()
    for r in (exists, world_writable, wrong_env):
        assert "Traceback" not in r.stderr and c1["token"] not in r.output
    assert _credential_ids(sqlite_url, app) == [c1["credential_id"]]

    forced = admin(*_bootstrap_argv(app, "--output", str(path), "--force")[1:], env=env)
    assert forced.returncode == 0, forced
    assert _mode(path) == 0o600
    c2 = json.loads(path.read_text())
    assert c2["credential_id"] != c1["credential_id"] and c2["queue_id"] == c1["queue_id"]
    assert c2["token"] not in forced.output
    assert _credential_ids(sqlite_url, app) == sorted([c1["credential_id"], c2["credential_id"]])
    assert [p.name for p in private_dir.iterdir()] == ["creds.json"]  # no temporary files left behind
