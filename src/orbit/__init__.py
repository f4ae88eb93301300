"""Orbit: a durable, multi-tenant task execution service — Python SDK.

`import orbit` loads only the SDK (httpx, websockets, pydantic, orjson); the
server lives in `orbit.server` and needs the `server` extra.
"""

from __future__ import annotations

from .models import *  # noqa: F401,F403  (request/response models are part of the SDK surface)
from .models import __all__ as _model_names
from .sdk.client import AsyncClient, Client
from .sdk.errors import APIError, OrbitError, PermanentError, RetryableError, TransportError
from .sdk.retry import aretry_submit, retry_submit
from .sdk.session import WorkerProtocolError, WorkerSession
from .sdk.worker import TaskContext, Worker

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "AsyncClient",
    "Client",
    "OrbitError",
    "PermanentError",
    "RetryableError",
    "TaskContext",
    "TransportError",
    "Worker",
    "WorkerProtocolError",
    "WorkerSession",
    "aretry_submit",
    "retry_submit",
    *_model_names,
]
