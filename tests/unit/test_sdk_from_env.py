"""`Client.from_env` and `Worker.from_env` read one identity the same way: the credentials file
wins over ORBIT_TOKEN, and an unreadable file is a ValueError naming the variable."""

from __future__ import annotations

import json

import pytest

import orbit


@pytest.fixture
def env(monkeypatch, tmp_path):
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps({"token": "orb_from_file", "queue_id": "q" * 32}))
    monkeypatch.setenv("ORBIT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("ORBIT_TOKEN", "orb_from_variable")
    monkeypatch.setenv("ORBIT_CREDENTIALS_FILE", str(path))
    return path


def test_the_file_wins_for_the_client_and_the_worker_alike(env):
    assert orbit.Client.from_env().token == "orb_from_file"
    worker = orbit.Worker.from_env()
    assert worker._token == "orb_from_file"
    assert worker.queues == ["q" * 32]


def test_the_variable_serves_without_a_file(env, monkeypatch):
    monkeypatch.delenv("ORBIT_CREDENTIALS_FILE")
    assert orbit.Client.from_env().token == "orb_from_variable"
    assert orbit.Worker.from_env(queues=["a" * 32])._token == "orb_from_variable"


def test_an_unreadable_file_is_a_value_error_for_both(env):
    env.write_text("not json")
    for build in (orbit.Client.from_env, lambda: orbit.Worker.from_env(queues=["a" * 32])):
        with pytest.raises(ValueError, match="ORBIT_CREDENTIALS_FILE"):
            build()
