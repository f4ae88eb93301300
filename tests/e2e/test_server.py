"""`orbit server`: refuses a stale schema, serves a migrated one, shuts down on SIGTERM."""

from __future__ import annotations

import asyncio
import time

from orbit.server.store import migrate

from .conftest import child_env, cli, cli_many, pending


def test_refuses_unmigrated_database(empty_db_url):
    refused = cli("orbit", "server", "--database-url", empty_db_url, "--port", "9")
    assert refused.returncode == 2, refused
    assert "migration" in refused.stderr and "orbit-admin migrate" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert pending(empty_db_url)[0] == "000001"  # the server applied nothing itself


def test_an_unreachable_database_is_reported_without_its_password():
    url = "mysql://orbit:hunter2-secret@127.0.0.1:9/orbit"  # nothing listens on port 9
    refused = cli("orbit", "server", "--database-url", url, "--port", "9", "--database-wait", "1")
    assert refused.returncode == 2, refused
    assert "the database does not answer; waiting up to 1s" in refused.stderr  # said once, then waited
    assert "cannot read the schema version" in refused.stderr
    assert "hunter2-secret" not in refused.output and "Traceback" not in refused.stderr


def test_a_setting_out_of_range_is_refused_before_the_node_starts(tmp_path):
    url = f"sqlite:///{tmp_path / 'node.db'}"
    asyncio.run(migrate.upgrade(url))
    for env, said in (({"ORBIT_CLAIM_POLL_MS": "0"}, "ORBIT_CLAIM_POLL_MS must be from 5 to 1000"),
                      ({"ORBIT_METRICS_ADDR": "nowhere"}, "not a host:port address: 'nowhere'")):
        refused = cli("orbit", "server", "--database-url", url, "--port", "9", env=child_env(**env))
        assert refused.returncode == 2, refused
        assert said in refused.stderr and "Traceback" not in refused.stderr, refused


def test_refused_credentials_fail_at_once_without_waiting(empty_db_url):
    """A wrong password is a configuration error: said at once, not waited out as an outage."""
    if not empty_db_url.startswith("mysql"):
        return
    url = empty_db_url.replace("mysql://root@", "mysql://root:wrong-password-x9@", 1)
    started = time.monotonic()
    refused = cli("orbit", "server", "--database-url", url, "--port", "9", "--database-wait", "60")
    assert time.monotonic() - started < 20, refused
    assert refused.returncode == 2, refused
    assert "Access denied" in refused.stderr and "waiting up to" not in refused.stderr
    assert "wrong-password-x9" not in refused.output and "Traceback" not in refused.stderr


def test_sqlite_node_lifecycle(tmp_path, spawn):
    url = f"sqlite:///{tmp_path / 'node.db'}"
    asyncio.run(migrate.upgrade(url))
    first = spawn("orbit", "server", env=child_env(ORBIT_DATABASE_URL=url))  # the URL from the environment
    ready = first.wait_ready()
    assert ready.json()["data"]["status"] == "ready"
    assert first.get("/healthz").status_code == 200

    second = spawn("orbit", "server", "--database-url", url)
    assert second.proc.wait(25) == 2, second.stderr
    assert "single node" in second.stderr or "already serving" in second.stderr
    assert first.get("/readyz").status_code == 200  # the first node is unaffected

    started = time.monotonic()
    assert first.terminate(timeout=15) == 0, first.stderr
    assert time.monotonic() - started < 15


def test_node_id_is_checked_and_reported_whole(tmp_path, spawn):
    url = f"sqlite:///{tmp_path / 'node.db'}"
    asyncio.run(migrate.upgrade(url))
    node_id = "s" * 127 + "Z"
    node = spawn("orbit", "server", "--database-url", url, "--node-id", node_id)  # starts meanwhile
    for refused in cli_many(*[(["orbit", "server", "--database-url", url, "--node-id", bad, "--port", "9"], None)
                              for bad in ("x" * 129, "wörker", "trailing ")]):
        assert refused.returncode == 2, refused
        assert "--node-id must be 1-128 printable ASCII characters" in refused.stderr, refused
    assert node.wait_ready().json()["data"]["node_id"] == node_id
    assert node.terminate() == 0, node.stderr
