import random

from orbit.server.core.backoff import backoff_ms

POLICY = {"initial_backoff_ms": 1000, "max_backoff_ms": 60000, "multiplier": 2.0, "jitter": 0.0}


def test_exponential_then_capped():
    assert [backoff_ms(POLICY, n) for n in (1, 2, 3, 7, 8)] == [1000, 2000, 4000, 60000, 60000]


def test_jitter_stays_within_bounds():
    policy = {**POLICY, "jitter": 0.2}
    rnd = random.Random(7)
    values = [backoff_ms(policy, 2, rnd) for _ in range(500)]
    assert min(values) >= 1600 and max(values) <= 2400 and len(set(values)) > 50
