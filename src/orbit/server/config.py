"""Server settings, from command-line options and `ORBIT_*` environment variables."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field


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
    dev_mode: bool = False
    background_loops: bool = True
    # `host:port` of a separate listener serving only /metrics; None: no such listener.
    metrics_listen: str | None = field(default_factory=lambda: os.environ.get("ORBIT_METRICS_ADDR") or None)
    # /metrics on the public listener: None means only when there is no separate one.
    metrics_public: bool | None = field(default_factory=lambda: _env_flag("ORBIT_METRICS_PUBLIC"))
    # The per-queue gauges are read from the database at most once per this many seconds per node.
    metrics_ttl_seconds: float = field(default_factory=lambda: _env_float("ORBIT_METRICS_TTL_SECONDS", 5.0))

    def metrics_on_public_listener(self) -> bool:
        return self.metrics_listen is None if self.metrics_public is None else self.metrics_public
