"""Retry backoff of the frozen policy: min(max, initial x multiplier^(n-1)) +/- jitter."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any


def backoff_ms(policy: Mapping[str, Any], failed_attempt: int, rand: random.Random | None = None) -> int:
    """Delay before the attempt after `failed_attempt` (1-based), jitter applied symmetrically."""
    initial = float(policy["initial_backoff_ms"])
    base = min(float(policy["max_backoff_ms"]), initial * float(policy["multiplier"]) ** max(0, failed_attempt - 1))
    jitter = float(policy["jitter"])
    r = (rand or random).uniform(-1.0, 1.0)
    return max(0, int(round(base * (1.0 + jitter * r))))
