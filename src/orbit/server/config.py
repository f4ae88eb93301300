"""Server settings, from command-line options and `ORBIT_*` environment variables."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field


# The default limit of HTTP requests in progress, per unit of the pool size (ORBIT_DB_POOL_SIZE;
# the pools open twice as many connections). Their waits for connections and group commits are
# bounded on their own (overload.WAIT_BUDGET_S), so this limit bounds what queues for the event
# loop: single submits share transactions (up to 64 per commit, one per queue at a time), and a
# node kept its submit throughput with 1,000 in progress where 160 let refusals take its CPU.
REQUESTS_IN_PROGRESS_PER_POOL_SIZE = 50
# A batch submit's transaction writes up to 500 tasks: a few at once keep the database as busy as
# many (measured: the same tasks/s with 4 at once as with 40, at a tenth of the latency).
POOL_SIZE_PER_BATCH_SUBMIT = 4


# Every 25 ms: work committed through another node reaches a waiting claim about 20 ms later
# (median), for about twice the idle CPU of a 200 ms poll (docs/operations.md has the figures).
CLAIM_POLL_MS = 25
MIN_CLAIM_POLL_MS, MAX_CLAIM_POLL_MS = 5, 1000


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def _env_flag(name: str) -> bool | None:
    value = os.environ.get(name)
    return None if not value else value.lower() not in ("0", "false", "no", "off")


def parse_address(value: str) -> tuple[str, int]:
    """`host:port` (`[::1]:9100`, or `:9100` for every interface) as (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


@dataclass
class Settings:
    database_url: str
    node_id: str = field(default_factory=lambda: socket.gethostname()[:64] or "node")
    max_body_bytes: int = field(default_factory=lambda: _env_int("ORBIT_MAX_BODY_BYTES", 1024 * 1024))
    max_payload_bytes: int = field(default_factory=lambda: _env_int("ORBIT_MAX_PAYLOAD_BYTES", 256 * 1024))
    idempotency_retention_seconds: int = field(
        default_factory=lambda: _env_int("ORBIT_IDEMPOTENCY_RETENTION_SECONDS", 7 * 24 * 3600)
    )
    # The event feed keeps each namespace's events this long, and at most this many rows of them.
    event_retention_seconds: int = field(
        default_factory=lambda: _env_int("ORBIT_EVENT_RETENTION_SECONDS", 7 * 24 * 3600))
    event_retention_rows: int = field(default_factory=lambda: _env_int("ORBIT_EVENT_RETENTION_ROWS", 10_000_000))
    pool_size: int = field(default_factory=lambda: _env_int("ORBIT_DB_POOL_SIZE", 20))
    # HTTP requests in progress on this node at most (health, readiness, metrics and the static
    # dashboard aside); 0: derived from the pool size (`requests_in_progress_limit`).
    max_requests_in_progress: int = field(default_factory=lambda: _env_int("ORBIT_MAX_REQUESTS_IN_PROGRESS", 0))
    # How long a request beyond that limit waits for a slot before it is refused 503 UNAVAILABLE.
    admission_wait_ms: int = field(default_factory=lambda: _env_int("ORBIT_ADMISSION_WAIT_MS", 1000))
    # Of those, batch submits in progress at most; 0: derived from the pool size (`batch_submits_limit`).
    max_batch_submits_in_progress: int = field(
        default_factory=lambda: _env_int("ORBIT_MAX_BATCH_SUBMITS_IN_PROGRESS", 0))
    dev_mode: bool = False
    background_loops: bool = True
    # `host:port` of a separate listener serving only /metrics; None: no such listener.
    metrics_listen: str | None = field(default_factory=lambda: os.environ.get("ORBIT_METRICS_ADDR") or None)
    # /metrics on the public listener: None means only when there is no separate one.
    metrics_public: bool | None = field(default_factory=lambda: _env_flag("ORBIT_METRICS_PUBLIC"))
    # The per-queue gauges are read from the database at most once per this many seconds per node.
    metrics_ttl_seconds: float = field(default_factory=lambda: _env_float("ORBIT_METRICS_TTL_SECONDS", 5.0))
    # How often the node reads, for all the claims long-polling it, whether work committed through
    # another node would now let them lease: that bounds how late such work reaches them.
    claim_poll_ms: int = field(default_factory=lambda: _env_int("ORBIT_CLAIM_POLL_MS", CLAIM_POLL_MS))

    def claim_poll_seconds(self) -> float:
        if not MIN_CLAIM_POLL_MS <= self.claim_poll_ms <= MAX_CLAIM_POLL_MS:
            raise ValueError(f"ORBIT_CLAIM_POLL_MS must be from {MIN_CLAIM_POLL_MS} to {MAX_CLAIM_POLL_MS}")
        return self.claim_poll_ms / 1000

    def requests_in_progress_limit(self) -> int:
        """The configured limit, or REQUESTS_IN_PROGRESS_PER_POOL_SIZE per unit of the pool size."""
        if self.max_requests_in_progress < 0:
            raise ValueError("ORBIT_MAX_REQUESTS_IN_PROGRESS must be 0 (derived from the pool size) or more")
        return self.max_requests_in_progress or max(1, self.pool_size * REQUESTS_IN_PROGRESS_PER_POOL_SIZE)

    def batch_submits_limit(self) -> int:
        """The configured limit, or one batch submit per POOL_SIZE_PER_BATCH_SUBMIT of the pool size."""
        if self.max_batch_submits_in_progress < 0:
            raise ValueError("ORBIT_MAX_BATCH_SUBMITS_IN_PROGRESS must be 0 (derived from the pool size) or more")
        return self.max_batch_submits_in_progress or max(2, self.pool_size // POOL_SIZE_PER_BATCH_SUBMIT)

    def check(self) -> None:
        """Raise ValueError naming the first setting out of its range, before a node starts."""
        self.requests_in_progress_limit()
        self.batch_submits_limit()
        self.claim_poll_seconds()
        if self.metrics_listen is not None:
            parse_address(self.metrics_listen)

    def metrics_on_public_listener(self) -> bool:
        return self.metrics_listen is None if self.metrics_public is None else self.metrics_public
