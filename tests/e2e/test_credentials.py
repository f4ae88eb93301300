"""`orbit-admin credentials create/list/revoke` against a running `orbit server`."""

from __future__ import annotations

import json
import os
import stat
import uuid

from orbit.server.services import tenancy

from .conftest import admin, child_env, cli_many, run_db


def _tenancy(url: str, app_name: str):
    async def body(tx):
        app = await tenancy.ensure_application(tx, app_name)
        ns = await tenancy.ensure_namespace(tx, app["id"], "ns", "staging")
        q1 = await tenancy.ensure_queue(tx, ns["id"], "one")
        q2 = await tenancy.ensure_queue(tx, ns["id"], "two")
        return app, ns, q1, q2

    return run_db(url, body)


def test_create_list_revoke(db_url, private_dir, spawn):
    server = spawn("orbit", "server", "--database-url", db_url, "--node-id", "e2e-creds")  # starts meanwhile
    app_name = f"e2e-{uuid.uuid4().hex[:10]}"
    app, ns, q1, q2 = _tenancy(db_url, app_name)
    env = child_env(ORBIT_DATABASE_URL=db_url)
    by_name, by_id = private_dir / "by-name.json", private_dir / "by-id.json"

    named, ided = cli_many(
        (["orbit-admin", "credentials", "create", "--application", app_name, "--namespace", "ns",
          "--permission", "queues:read", "--queue-scope", q1["id"], "--output", str(by_name)], env),
        (["orbit-admin", "credentials", "create", "--application", app["id"], "--namespace", ns["id"],
          "--permission", "queues:read", "--permission", "queues:manage", "--output", str(by_id)], env),
    )
    assert named.returncode == 0, named
    assert ided.returncode == 0, ided
    c1, c2 = json.loads(by_name.read_text()), json.loads(by_id.read_text())
    for path in (by_name, by_id):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert c1["permissions"] == ["queues:read"] and c1["queue_scope"] == [q1["id"]]
    assert c2["permissions"] == ["queues:manage", "queues:read"] and c2["queue_scope"] == "*"
    for c in (c1, c2):
        assert c["application_id"] == app["id"] and c["namespace_id"] == ns["id"] and c["environment"] == "staging"
    assert c1["token"] not in named.output and c2["token"] not in ided.output

    listed = admin("credentials", "list", "--application", app_name, env=env)
    assert listed.returncode == 0, listed
    lines = listed.stdout.splitlines()
    assert len(lines) == 2
    for c in (c1, c2):
        assert any(line.startswith(c["credential_id"]) and "active" in line for line in lines)
        assert c["token"].split("_", 2)[2] not in listed.output
    assert "orb_" not in listed.output

    server.wait_ready()
    assert server.get(f"/v1/queues/{q1['id']}", c1["token"]).status_code == 200
    assert server.get(f"/v1/queues/{q2['id']}", c1["token"]).status_code == 404  # outside its scope
    assert server.get("/v1/queues", c1["token"]).status_code == 403  # listing needs scope "*"
    assert server.get("/v1/queues", c2["token"]).status_code == 200

    revoked = admin("credentials", "revoke", c1["credential_id"], "--reason", "rotated in e2e", env=env)
    assert revoked.returncode == 0, revoked
    assert revoked.stdout.strip() == f"credential {c1['credential_id']} revoked"
    r = server.get(f"/v1/queues/{q1['id']}", c1["token"])
    assert r.status_code == 401 and r.json()["error"]["code"] == "UNAUTHENTICATED"
    assert server.get(f"/v1/queues/{q1['id']}", c2["token"]).status_code == 200  # others unaffected

    again, after = cli_many(
        (["orbit-admin", "credentials", "revoke", c1["credential_id"], "--reason", "again"], env),
        (["orbit-admin", "credentials", "list", "--application", app["id"], "--json"], env),
    )
    assert again.returncode == 0 and "already revoked" in again.stdout, again
    assert after.returncode == 0, after
    rows = {row["id"]: row for row in map(json.loads, after.stdout.splitlines())}
    assert set(rows) == {c1["credential_id"], c2["credential_id"]}
    assert rows[c1["credential_id"]]["status"] == "revoked"
    assert rows[c1["credential_id"]]["revoke_reason"] == "rotated in e2e"  # the first reason stays
    assert rows[c1["credential_id"]]["queue_scope"] == [q1["id"]]
    assert rows[c2["credential_id"]]["status"] == "active"
    assert all("token" not in row and "secret_hash" not in row for row in rows.values())
    assert "orb_" not in after.output

    assert server.terminate() == 0
    assert c1["token"] not in server.stderr and c2["token"] not in server.stderr  # never logged


def test_create_refusals(sqlite_url, private_dir):
    app_name = f"e2e-{uuid.uuid4().hex[:10]}"
    _tenancy(sqlite_url, app_name)
    env = child_env(ORBIT_DATABASE_URL=sqlite_url)
    bad_scope, no_app = cli_many(
        (["orbit-admin", "credentials", "create", "--application", app_name, "--namespace", "ns",
          "--permission", "queues:read", "--queue-scope", "one", "--output", str(private_dir / "a.json")], env),
        (["orbit-admin", "credentials", "create", "--application", f"{app_name}-missing", "--namespace", "ns",
          "--permission", "queues:read", "--output", str(private_dir / "b.json")], env),
    )
    assert bad_scope.returncode != 0 and "queue id" in bad_scope.stderr, bad_scope
    assert no_app.returncode != 0 and "no application" in no_app.stderr, no_app
    assert list(private_dir.iterdir()) == []
