"""`orbit-admin` writes the audit trail: bootstrap, `credentials create` and `credentials revoke`
each leave a record in their own transaction, read back through `GET /v1/audit-records` of a
running `orbit server`."""

from __future__ import annotations

import json
import uuid

from .conftest import admin, child_env


def _records(server, token: str, **params: str) -> list[dict]:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    r = server.get(f"/v1/audit-records?limit=1000&{query}", token)
    assert r.status_code == 200, r.text
    return r.json()["data"]["items"]


def test_credential_issue_and_revoke_are_audited(db_url, private_dir, spawn):
    server = spawn("orbit", "server", "--database-url", db_url, "--node-id", "e2e-audit")  # starts meanwhile
    app = f"e2e-{uuid.uuid4().hex[:10]}"
    env = child_env(ORBIT_DATABASE_URL=db_url)
    boot_path, extra_path = private_dir / "boot.json", private_dir / "extra.json"

    boot = admin("bootstrap", "--application", app, "--namespace", "ns", "--environment", "staging",
                 "--queue", "jobs", "--output", str(boot_path), env=env)
    assert boot.returncode == 0, boot
    c1 = json.loads(boot_path.read_text())
    made = admin("credentials", "create", "--application", app, "--namespace", "ns", "--permission", "queues:read",
                 "--queue-scope", c1["queue_id"], "--label", "reader", "--output", str(extra_path), env=env)
    assert made.returncode == 0, made
    c2 = json.loads(extra_path.read_text())
    for reason in ("rotated after the incident", "again"):
        revoked = admin("credentials", "revoke", c2["credential_id"], "--reason", reason, env=env)
        assert revoked.returncode == 0, revoked

    server.wait_ready()
    everything = _records(server, c1["token"])
    assert [(r["action"], r["resource_id"]) for r in everything] == [
        ("namespace.create", c1["namespace_id"]),
        ("queue.create", c1["queue_id"]),
        ("credential.issue", c1["credential_id"]),
        ("credential.issue", c2["credential_id"]),
        ("credential.revoke", c2["credential_id"]),  # the second revoke changed nothing: no record
    ]
    for r in everything:
        assert (r["actor"], r["actor_credential_id"], r["request_id"], r["idempotency_key"]) == \
            ("orbit-admin", None, None, None)
    text = json.dumps(everything)
    for c in (c1, c2):
        assert c["token"] not in text and c["token"].split("_", 2)[2] not in text
    assert "secret" not in text and "hash" not in text

    issued, revoked = _records(server, c1["token"], resource_id=c2["credential_id"])
    assert (issued["resource_type"], issued["before"], issued["reason"]) == ("credential", None, None)
    assert issued["after"]["permissions"] == ["queues:read"] and issued["after"]["queue_scope"] == [c1["queue_id"]]
    assert (issued["after"]["label"], issued["after"]["revoked_at"]) == ("reader", None)
    assert revoked["reason"] == "rotated after the incident"
    assert revoked["before"] == issued["after"]
    assert revoked["after"]["revoke_reason"] == "rotated after the incident" and revoked["after"]["revoked_at"]
    boot_issue = _records(server, c1["token"], action="credential.issue")[0]
    assert boot_issue["after"]["permissions"] == c1["permissions"] and boot_issue["after"]["queue_scope"] == "*"

    assert server.terminate() == 0
    assert c1["token"] not in server.stderr and c2["token"] not in server.stderr
