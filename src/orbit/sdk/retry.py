"""Explicit, bounded resending of one submit: `retry_submit` and `aretry_submit`.

The clients never resend a business write on their own. These helpers do, on
request, and only in the two situations where resending is both safe and
useful: the server refused the task for now (`QUEUE_FULL`, `APPLICATION_FULL`,
`UNAVAILABLE`: nothing was accepted, the key was not consumed), or the answer
never arrived (`TransportError`: the first attempt may have landed, and
resending the *same* key and content returns its original receipt with
`deduplicated=True` instead of creating a second task).

Waits are `max(retry_after, backoff)` where backoff uses full jitter,
`uniform(0, min(max_delay, base_delay * 2 ** (n - 1)))`. The helper stops after
`attempts` sends, or as soon as the next wait would end past `deadline`
seconds from the start, and re-raises the last error. Every other error is
raised at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..models import SubmitTaskRequest, SubmitTaskResult
from .errors import APIError, OrbitError, TransportError

if TYPE_CHECKING:
    from .client import AsyncClient, Client

__all__ = ["RETRYABLE_CODES", "aretry_submit", "retry_submit"]

RETRYABLE_CODES = frozenset({"QUEUE_FULL", "APPLICATION_FULL", "UNAVAILABLE"})

# Indirections so tests can observe waits without waiting (never used for anything else).
_sleep = time.sleep
_asleep = asyncio.sleep
_clock = time.monotonic
_random = random.random


def _check_bounds(attempts: int, deadline: float, base_delay: float, max_delay: float) -> None:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError("attempts must be an integer >= 1")
    if not deadline > 0:
        raise ValueError("deadline must be a positive number of seconds")
    if not base_delay >= 0 or not max_delay >= 0:
        raise ValueError("base_delay and max_delay must be >= 0")


def _retryable(exc: OrbitError) -> bool:
    return isinstance(exc, TransportError) or (isinstance(exc, APIError) and exc.code in RETRYABLE_CODES)


def _next_wait(
    exc: OrbitError, sent: int, started: float, *, attempts: int, deadline: float, base_delay: float, max_delay: float
) -> float | None:
    """Seconds to wait before the next send, or None to give up."""
    if not _retryable(exc) or sent >= attempts:
        return None
    backoff = _random() * min(max_delay, base_delay * 2.0 ** min(sent - 1, 60))
    wait = max(exc.retry_after if isinstance(exc, APIError) else 0.0, backoff)
    if _clock() - started + wait >= deadline:
        return None
    return wait


def retry_submit(
    client: Client,
    queue_id: str,
    key: str,
    request: SubmitTaskRequest | Mapping[str, Any],
    *,
    attempts: int = 5,
    deadline: float = 30.0,
    base_delay: float = 0.5,
    max_delay: float = 10.0,
) -> SubmitTaskResult:
    """Submit with the same key and content until accepted, within `attempts` sends and `deadline` seconds.

    Resends on QUEUE_FULL / APPLICATION_FULL / UNAVAILABLE and on `TransportError`;
    any other error, or the last retryable one once the bounds are reached, is raised.
    """
    _check_bounds(attempts, deadline, base_delay, max_delay)
    started = _clock()
    sent = 0
    while True:
        sent += 1
        try:
            return client.submit_task(queue_id, key, request)
        except (APIError, TransportError) as exc:
            wait = _next_wait(exc, sent, started, attempts=attempts, deadline=deadline,
                              base_delay=base_delay, max_delay=max_delay)
            if wait is None:
                raise
        _sleep(wait)


async def aretry_submit(
    client: AsyncClient,
    queue_id: str,
    key: str,
    request: SubmitTaskRequest | Mapping[str, Any],
    *,
    attempts: int = 5,
    deadline: float = 30.0,
    base_delay: float = 0.5,
    max_delay: float = 10.0,
) -> SubmitTaskResult:
    """The asyncio twin of `retry_submit` (same rules, waits with `asyncio.sleep`)."""
    _check_bounds(attempts, deadline, base_delay, max_delay)
    started = _clock()
    sent = 0
    while True:
        sent += 1
        try:
            return await client.submit_task(queue_id, key, request)
        except (APIError, TransportError) as exc:
            wait = _next_wait(exc, sent, started, attempts=attempts, deadline=deadline,
                              base_delay=base_delay, max_delay=max_delay)
            if wait is None:
                raise
        await _asleep(wait)
