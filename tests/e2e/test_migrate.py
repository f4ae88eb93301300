"""`orbit-admin migrate`: --check, --status, applying, and where the URL may come from."""

from __future__ import annotations

from orbit.server.store import migrate

from .conftest import admin, child_env, cli_many, pending


def test_check_status_apply_on_empty_database(empty_db_url, tmp_path):
    url = empty_db_url
    head = migrate.head_revision()
    via_env = child_env(ORBIT_DATABASE_URL=url)
    # Where --database-url is given, a wrong ORBIT_DATABASE_URL proves that the option wins.
    wrong = child_env(ORBIT_DATABASE_URL=f"sqlite:///{tmp_path}/missing-dir/none.db")
    check, status = cli_many(
        (["orbit-admin", "migrate", "--check"], via_env),
        (["orbit-admin", "--database-url", url, "migrate", "--status"], wrong),  # before the subcommand
    )
    assert check.returncode == 1 and "Traceback" not in check.stderr, check
    assert status.returncode == 0, status
    assert "pending: 000001" in status.stdout
    assert f"head:    {head}" in status.stdout
    assert "(empty database)" in status.stdout
    assert pending(url)[0] == "000001"  # --check and --status changed nothing

    applied = admin("migrate", "--database-url", url, env=wrong)  # after the subcommand
    assert applied.returncode == 0, applied
    assert "applied: 000001" in applied.stdout and f"applied: {head}" in applied.stdout
    assert pending(url) == []

    again = admin("migrate", "--check", env=via_env)
    assert again.returncode == 0, again


def test_missing_or_unusable_database_is_exit_2():
    """Exit 1 of `--check` must mean "pending" only, never "could not even look"."""
    no_url, unusable, server_no_url = cli_many(
        (["orbit-admin", "migrate", "--check"], None),
        (["orbit-admin", "migrate", "--check", "--database-url", "sqlite:////nonexistent-dir/orbit.db"], None),
        (["orbit", "server", "--port", "9"], None),
    )
    assert no_url.returncode == 2 and "ORBIT_DATABASE_URL" in no_url.stderr, no_url
    assert unusable.returncode == 2 and "database" in unusable.stderr, unusable
    assert server_no_url.returncode == 2 and "ORBIT_DATABASE_URL" in server_no_url.stderr, server_no_url
    for r in (no_url, unusable, server_no_url):
        assert "Traceback" not in r.stderr, r
