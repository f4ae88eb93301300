"""Fixtures for multi-process cluster tests: real nodes on one MariaDB database.

* ``cluster_factory(database_url=None)`` → a `Cluster`; every process it started is
  SIGKILLed at teardown, whatever the test's outcome.
* ``two_nodes`` → a module-wide `Cluster` of two nodes on the session's database.
* ``tenant_factory(database_url=None)`` → bootstrap credentials for a fresh application.
* every cluster test runs under a hard per-test deadline (``ORBIT_CLUSTER_TEST_TIMEOUT``,
  default 60 s) that raises in the test, so teardown still runs.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .nodes import Cluster, bootstrap_credentials, private_dir

TEST_TIMEOUT = float(os.environ.get("ORBIT_CLUSTER_TEST_TIMEOUT", "60"))


class ClusterTestTimeout(Exception):
    pass


@pytest.fixture(autouse=True)
def _cluster_deadline(request):
    """Fail (not hang) a test that runs past the deadline; fixture teardown still kills the nodes."""

    def expired(signum, frame):
        raise ClusterTestTimeout(f"{request.node.nodeid} exceeded {TEST_TIMEOUT:.0f}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.cluster)


def _dump_on_failure(request, clusters: list[Cluster]) -> None:
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for c in clusters:
            print(c.describe())


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


@pytest.fixture
def cluster_factory(mariadb_url, tmp_path) -> Iterator[Callable[..., Cluster]]:
    clusters: list[Cluster] = []

    def make(database_url: str | None = None, name: str = "cluster") -> Cluster:
        c = Cluster(database_url or mariadb_url, tmp_path / f"{name}-{len(clusters)}")
        clusters.append(c)
        return c

    try:
        yield make
    finally:
        for c in clusters:
            c.close()


@pytest.fixture
def cluster(cluster_factory, request) -> Iterator[Cluster]:
    c = cluster_factory()
    yield c
    _dump_on_failure(request, [c])


@pytest.fixture(scope="module")
def two_nodes(mariadb_url, tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(mariadb_url, tmp_path_factory.mktemp("two-nodes"))
    try:
        c.start_nodes(2)
        yield c
    finally:
        c.close()


@pytest.fixture
def creds_dir(tmp_path) -> Path:
    return private_dir(tmp_path)


@pytest.fixture
def tenant_factory(mariadb_url, creds_dir) -> Callable[..., dict]:
    def make(database_url: str | None = None, **kwargs) -> dict:
        return bootstrap_credentials(database_url or mariadb_url, creds_dir, **kwargs)

    return make


@pytest.fixture
def tenant(tenant_factory) -> dict:
    """Credentials (``token``, ``namespace_id``, …) for a fresh application on the session database."""
    return tenant_factory()
