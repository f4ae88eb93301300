"""The Celery peer: Redis broker, late acknowledgement, no result backend, a no-op task.

Workers are started by bench/peers/celery_runner.py as
`celery -A bench.peers.celery_app worker -Q <queue> ...` with the broker URL and
queue name in BENCH_REDIS_URL and BENCH_CELERY_QUEUE.
"""

from __future__ import annotations

import os
import time

from celery import Celery

BROKER = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")
QUEUE = os.environ.get("BENCH_CELERY_QUEUE", "bench")
LATENCY_KEY = f"bench:latency:{QUEUE}"

app = Celery("bench", broker=BROKER)
app.conf.update(
    task_acks_late=True,                       # acknowledged after the task ran: at-least-once, like Orbit
    worker_prefetch_multiplier=int(os.environ.get("BENCH_CELERY_PREFETCH", "4")),
    task_ignore_result=True,
    task_default_queue=QUEUE,
    task_serializer="json",
    accept_content=["json"],
    worker_send_task_events=False,
    task_send_sent_event=False,
    worker_enable_remote_control=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": 3600},
)

_redis = None


@app.task(name="bench.noop")
def noop() -> None:
    return None


@app.task(name="bench.stamp")
def stamp(sent: float) -> None:
    """Records submit->start latency (ms) in a Redis list: the time the task body began minus the send time."""
    started = time.time()
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(BROKER)
    _redis.rpush(LATENCY_KEY, (started - sent) * 1000.0)
