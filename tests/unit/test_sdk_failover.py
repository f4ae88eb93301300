"""The SDK worker's choice of the next server URL and of the wait before connecting to it."""

from __future__ import annotations

import pytest

import orbit
from orbit.sdk.failover import LASTING_SESSION_S, Failover

A, B, C = "http://a:8080", "http://b:8080", "http://c:8080"


def failover(*urls: str, initial: float = 0.2, maximum: float = 10.0) -> Failover:
    return Failover(urls, initial, maximum, jitter=lambda: 1.0)


def test_a_dead_url_is_skipped_at_once():
    f = failover(A, B)
    assert f.current == A
    assert f.failed() == 0.0
    assert f.current == B


def test_backs_off_only_after_a_whole_round_and_doubles_to_the_maximum():
    f = failover(A, B, C, initial=0.2, maximum=1.0)
    waits = [(f.current, f.failed()) for _ in range(12)]
    assert waits == [(A, 0.0), (B, 0.0), (C, 0.2),
                     (A, 0.0), (B, 0.0), (C, 0.4),
                     (A, 0.0), (B, 0.0), (C, 0.8),
                     (A, 0.0), (B, 0.0), (C, 1.0)]
    assert f.current == A


def test_one_url_backs_off_after_every_failure_as_a_single_url_worker_always_did():
    f = failover(A, initial=0.2, maximum=0.5)
    assert [f.failed() for _ in range(4)] == [0.2, 0.4, 0.5, 0.5]
    assert f.current == A


def test_a_lost_session_goes_on_through_the_next_url_at_once():
    f = failover(A, B)
    f.connected(100.0)
    assert f.lost(160.0) == 0.0 and f.current == B  # node A killed or drained: B, no wait
    f.connected(160.1)
    assert f.lost(200.0) == 0.0 and f.current == A  # and back, round the list


def test_the_lost_node_counts_as_tried_in_the_round():
    f = failover(A, B, initial=0.3)
    f.connected(0.0)
    assert f.lost(60.0) == 0.0 and f.current == B
    assert f.failed() == 0.3 and f.current == A  # A was just lost, B refused: the round is over


def test_a_lasting_session_starts_the_backoff_over():
    f = failover(A, initial=0.2, maximum=10.0)
    assert [f.failed() for _ in range(3)] == [0.2, 0.4, 0.8]
    f.connected(10.0)
    assert f.lost(10.0 + LASTING_SESSION_S) == 0.2
    assert f.failed() == 0.4


def test_sessions_that_drop_at_once_are_failures_of_the_round():
    f = failover(A, B, initial=0.5)
    f.connected(0.0)
    assert f.lost(0.1) == 0.0 and f.current == B
    f.connected(0.2)
    assert f.lost(0.3) == 0.5 and f.current == A  # both nodes drop every session: back off
    f.connected(1.0)
    assert f.lost(1.1) == 0.0
    f.connected(1.2)
    assert f.lost(1.3) == 1.0


def test_the_largest_retry_after_of_the_round_bounds_the_wait_from_below():
    f = failover(A, B, initial=0.2)
    assert f.failed(retry_after=3.0) == 0.0  # another node may serve at once
    assert f.failed(retry_after=1.0) == 3.0
    assert f.failed() == 0.0 and f.failed() == 0.4  # the hint was for its round only


def test_jitter_scales_the_backoff():
    f = Failover([A, B], 1.0, 10.0, jitter=lambda: 1.5)
    assert f.failed() == 0.0
    assert f.failed() == 1.5


def test_needs_a_url():
    with pytest.raises(ValueError):
        Failover([], 0.2, 10.0)


# ---------------------------------------------------------------- orbit.Worker(urls=...)

QUEUE = "0" * 32


def test_a_worker_takes_several_urls_and_a_client_for_its_token():
    w = orbit.Worker(urls=[A, B, A], token="orb_x_y", queues=[QUEUE])
    assert w.urls == [A, B] and w.url == A  # a node listed twice is one node
    assert "urls=" in repr(w) and "orb_x_y" not in repr(w)
    with orbit.Client("http://elsewhere:8080", token="orb_c_t") as client:
        w = orbit.Worker(client, urls=[B, C], queues=[QUEUE])
    assert (w.urls, w._token) == ([B, C], "orb_c_t")


def test_one_url_stays_as_it_was():
    assert orbit.Worker(A, token="t", queues=[QUEUE]).urls == [A]
    w = orbit.Worker(url=A, token="t", queues=[QUEUE])
    assert (w.urls, w.url, repr(w).startswith(f"Worker(url={A!r}")) == ([A], A, True)
    with orbit.Client(B, token="t") as client:
        assert orbit.Worker(client, queues=[QUEUE]).url == B


@pytest.mark.parametrize("kwargs", [
    {"url": A, "urls": [B]},
    {"urls": A},
    {"urls": []},
    {"urls": [A, ""]},
])
def test_urls_that_are_not_a_list_of_urls_are_refused(kwargs):
    with pytest.raises(ValueError):
        orbit.Worker(token="t", queues=[QUEUE], **kwargs)


def test_from_env_takes_urls_instead_of_orbit_url(monkeypatch):
    monkeypatch.delenv("ORBIT_URL", raising=False)
    monkeypatch.delenv("ORBIT_CREDENTIALS_FILE", raising=False)
    monkeypatch.setenv("ORBIT_TOKEN", "orb_e_t")
    assert orbit.Worker.from_env(queues=[QUEUE], urls=[A, B]).urls == [A, B]
    monkeypatch.setenv("ORBIT_URL", C)
    assert orbit.Worker.from_env(queues=[QUEUE]).urls == [C]
