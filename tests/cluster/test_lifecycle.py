"""Process lifecycle of `orbit server`: clean SIGTERM/SIGINT shutdown and refusing a stale schema."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid

import httpx
import pytest

from .burst import QueueBurst, check_queue_state
from .nodes import (
    ORBIT_CMD,
    async_client,
    create_database,
    drop_database,
    free_port,
    port_is_open,
    run_admin,
    warm_up,
)

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_shuts_an_idle_node_down_cleanly(cluster, tenant, sig):
    (node,) = cluster.start_nodes(1)
    with httpx.Client(timeout=5) as c:
        r = c.post(
            f"{node.base_url}/v1/queues",
            json={
                "name": f"idle-{uuid.uuid4().hex[:8]}",
                "max_concurrency": 1,
                "rate_per_second": 1,
            },
            headers={
                "Authorization": f"Bearer {tenant['token']}",
                "Idempotency-Key": uuid.uuid4().hex,
            },
        )
        assert r.status_code == 201, r.text
    started = time.monotonic()
    rc = node.terminate(timeout=15, sig=sig)
    took = time.monotonic() - started
    assert rc == 0, f"exit status {rc} after {signal.Signals(sig).name}\n{node.describe()}"
    assert took < 15
    assert not port_is_open(node.port), "the port is still accepting connections"
    assert "Traceback" not in node.output(tail=None), node.describe()
    # The same port serves again after a restart.
    node.restart()
    assert node.terminate() == 0


def test_sigterm_under_load_drains_and_loses_nothing(cluster, tenant, mariadb_url):
    """SIGTERM while 12 clients write: exit 0 in bounded time, every answered write is stored."""
    a, b = cluster.start_nodes(2)
    burst = QueueBurst([a, b], tenant["token"], clients=12, duplicate_ratio=0.1)
    timing: dict[str, float] = {}

    async def scenario():
        stop = asyncio.Event()
        async with async_client() as client:
            await warm_up(client, [a, b], connections=6)
            runner = asyncio.create_task(burst.run(client, stop))
            try:
                await burst.wait_completed(50)
                inflight = burst.inflight[b.name]
                b.send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                # Wait for the exit without blocking the event loop (the burst keeps going).
                while b.alive and time.monotonic() - t0 < 15:
                    await asyncio.sleep(0.05)
                timing["exit_s"] = time.monotonic() - t0
                timing["inflight"] = inflight
                await burst.wait_completed(burst.completed + 30)
            finally:
                stop.set()
                await asyncio.wait_for(runner, timeout=30)

    asyncio.run(scenario())
    assert not b.alive, f"node did not exit within 15s of SIGTERM\n{b.describe()}"
    assert b.returncode == 0, f"exit status {b.returncode}\n{b.describe()}"
    assert timing["exit_s"] < 15, timing
    assert "Traceback" not in b.output(tail=None), b.describe()
    print(timing, burst.summary())
    burst.check_answers()
    asyncio.run(check_queue_state(mariadb_url, tenant["namespace_id"], burst.ops))
    assert a.terminate() == 0, a.describe()


def _run_server(database_url: str, timeout: float = 30, *extra: str) -> tuple[subprocess.CompletedProcess, int]:
    port = free_port()
    r = subprocess.run(
        [
            *ORBIT_CMD,
            "server",
            "--database-url",
            database_url,
            "--port",
            str(port),
            "--node-id",
            "stale",
            *extra,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    return r, port


def test_server_refuses_a_database_with_pending_migrations(mariadb_url):
    url = create_database(migrate=False)  # an empty database: every migration is pending
    try:
        r, port = _run_server(url)
        assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
        assert (
            "orbit:" in r.stderr and "pending" in r.stderr and "orbit-admin migrate" in r.stderr
        ), r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert "listening" not in r.stdout
        assert not port_is_open(port)
    finally:
        drop_database(url)


def test_server_refuses_an_unreachable_database():
    url = f"mysql://root@127.0.0.1:{free_port()}/nowhere"  # nothing listens there
    r, _ = _run_server(url, 30, "--database-wait", "2")  # waited for a while, then refused
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "orbit:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "waiting up to 2s" in r.stderr and "cannot read the schema version" in r.stderr, r.stderr


def test_server_starts_once_the_database_is_migrated(cluster_factory, mariadb_url):
    url = create_database(migrate=False)
    try:
        r, _ = _run_server(url)
        assert r.returncode == 2, r.stderr
        m = run_admin(url, "migrate")
        assert m.returncode == 0, m.stderr
        c = cluster_factory(url)
        (node,) = c.start_nodes(1)
        assert node.terminate() == 0, node.describe()
    finally:
        drop_database(url)
