"""Server settings, from command-line options and `ORBIT_*` environment variables."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


@dataclass
class Settings:
    database_url: str
    node_id: str = field(default_factory=lambda: socket.gethostname()[:64] or "node")
    max_body_bytes: int = field(default_factory=lambda: _env_int("ORBIT_MAX_BODY_BYTES", 1024 * 1024))
    max_payload_bytes: int = field(default_factory=lambda: _env_int("ORBIT_MAX_PAYLOAD_BYTES", 256 * 1024))
    idempotency_retention_seconds: int = field(
        default_factory=lambda: _env_int("ORBIT_IDEMPOTENCY_RETENTION_SECONDS", 7 * 24 * 3600)
    )
    pool_size: int = field(default_factory=lambda: _env_int("ORBIT_DB_POOL_SIZE", 20))
    dev_mode: bool = False
    background_loops: bool = True
