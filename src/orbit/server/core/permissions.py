"""The permission vocabulary and the all-queues scope."""

from __future__ import annotations

ALL_PERMISSIONS: tuple[str, ...] = (
    "queues:read",
    "queues:manage",
    "tasks:submit",
    "tasks:read",
    "tasks:cancel",
    "tasks:review",
    "schedules:read",
    "schedules:manage",
    "resource_keys:read",
    "resource_keys:manage",
    "applications:read",
    "applications:manage",
    "events:read",
    "audit:read",
    "worker",
)

# What `orbit-admin bootstrap` grants; `worker` only with --worker-access.
BOOTSTRAP_PERMISSIONS: tuple[str, ...] = (
    "queues:read",
    "queues:manage",
    "tasks:submit",
    "tasks:read",
    "tasks:cancel",
    "schedules:read",
    "schedules:manage",
    "resource_keys:read",
    "resource_keys:manage",
    "events:read",
    "audit:read",
    "applications:read",
)

ALL_QUEUES = "*"
