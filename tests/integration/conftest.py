"""In-process fixtures: the ASGI app on a real database, and fresh tenants."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from orbit.server.app import create_app
from orbit.server.config import Settings
from orbit.server.core.permissions import ALL_PERMISSIONS, ALL_QUEUES
from orbit.server.services import dispatch, tenancy
from orbit.server.store.db import Database


@pytest.fixture
async def db(db_url):
    database = Database(db_url, pool_size=5)
    yield database
    await database.close()


@pytest.fixture
async def app(db, db_url):
    settings = Settings(database_url=db_url, node_id="test", background_loops=False)
    return create_app(settings, db)


@contextlib.asynccontextmanager
async def _loopback_node(db, db_url, node_id: str):
    """A node on the same database, served by uvicorn on a loopback port (WebSockets): its base URL."""
    from .worker_client import serve

    async with serve(create_app(Settings(database_url=db_url, node_id=node_id, background_loops=False), db)) as url:
        yield url


@pytest.fixture
async def base(db, db_url):
    """A second node on the same database (beside `app`): its base URL."""
    async with _loopback_node(db, db_url, "t") as url:
        yield url


@pytest.fixture
async def other_base(db, db_url):
    """A third node, with wake-ups of its own: its base URL."""
    async with _loopback_node(db, db_url, "t2") as url:
        yield url


@pytest.fixture
async def http(app):
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://orbit.test") as client:
        yield client


@dataclass
class Tenant:
    """A fresh application + namespace with an all-permissions token, isolating each test."""

    db: Database
    http: httpx.AsyncClient
    application: dict[str, Any]
    namespace: dict[str, Any]
    token: str
    credential_id: str
    _n: list[int] = field(default_factory=lambda: [0])

    @property
    def namespace_id(self) -> str:
        return self.namespace["id"]

    def headers(self, token: str | None = None, key: str | None = None, **extra: str) -> dict[str, str]:
        h = {"Authorization": f"Bearer {token or self.token}"}
        if key is not None:
            h["Idempotency-Key"] = key
        h.update(extra)
        return h

    def key(self) -> str:
        self._n[0] += 1
        return f"k-{uuid.uuid4().hex[:12]}-{self._n[0]}"

    async def credential(self, permissions, queue_scope=ALL_QUEUES) -> str:
        async def body(tx):
            return await tenancy.issue_credential(
                tx, application=self.application, namespace=self.namespace,
                permissions=list(permissions), queue_scope=queue_scope,
            )

        return (await self.db.transaction(body)).token

    async def post(self, path: str, body: Any, *, key: str | None = None, token: str | None = None):
        return await self.http.post(
            path, json=body, headers=self.headers(token, key if key is not None else self.key())
        )

    async def get(self, path: str, *, token: str | None = None, params=None):
        return await self.http.get(path, headers=self.headers(token), params=params)

    async def create_queue(self, name: str | None = None, **fields: Any) -> dict[str, Any]:
        body = {"name": name or f"q-{uuid.uuid4().hex[:10]}", "max_concurrency": 8, "rate_per_second": 100}
        body.update(fields)
        r = await self.post("/v1/queues", body)
        assert r.status_code == 201, r.text
        return r.json()["data"]["queue"]


async def make_tenant(db: Database, http: httpx.AsyncClient, permissions=ALL_PERMISSIONS) -> Tenant:
    suffix = uuid.uuid4().hex[:12]

    async def body(tx):
        app = await tenancy.ensure_application(tx, f"app-{suffix}")
        ns = await tenancy.ensure_namespace(tx, app["id"], "default", "development")
        issued = await tenancy.issue_credential(
            tx, application=app, namespace=ns, permissions=list(permissions), queue_scope=ALL_QUEUES
        )
        return app, ns, issued

    app, ns, issued = await db.transaction(body)
    return Tenant(db, http, app, ns, issued.token, issued.credential_id)


@pytest.fixture
async def tenant(db, http) -> Tenant:
    return await make_tenant(db, http)


@pytest.fixture
def no_polling(monkeypatch):
    """Waiting claims re-read only when this node's own work wakes them (not its poll): what
    wakes them is then what the test sees."""

    async def nothing_found(db, waiting):
        return dispatch.PollResult()

    monkeypatch.setattr(dispatch, "poll_waiting", nothing_found)


@pytest.fixture
def claim_transactions(monkeypatch):
    """The claim transactions run from now on: how many claims each served."""
    calls: list[int] = []
    original = dispatch.claim_many

    async def counted(db, commands):
        calls.append(len(commands))
        return await original(db, commands)

    monkeypatch.setattr(dispatch, "claim_many", counted)
    return calls
