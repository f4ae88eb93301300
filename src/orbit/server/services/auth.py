"""Bearer credentials: issue, authenticate, authorize.

Tokens are `orb_<credential id>_<secret>`. Only SHA-256(secret) is stored: the
secret has 256 bits of entropy, so a slow hash would add latency and no safety.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass

import orjson

from ..core.ids import is_id, new_id
from ..core.permissions import ALL_QUEUES
from ..errors import not_found, permission_denied, unauthenticated
from ..store.db import Database
from ..store.queries import credentials as cred_q
from ..store.tx import Tx

TOKEN_PREFIX = "orb_"


@dataclass(frozen=True)
class Principal:
    credential_id: str
    application_id: str
    namespace_id: str
    permissions: frozenset[str]
    queue_scope: str | tuple[str, ...]

    def require(self, permission: str, *, all_queues: bool = False) -> None:
        if permission not in self.permissions:
            raise permission_denied(f"the credential lacks the {permission!r} permission")
        if all_queues and self.queue_scope != ALL_QUEUES:
            raise permission_denied("this action needs a credential scoped to all queues (\"*\")")

    def can_see_queue(self, queue_id: str) -> bool:
        return self.queue_scope == ALL_QUEUES or queue_id in self.queue_scope

    def require_queue(self, queue_id: str) -> None:
        """A queue outside a single-resource scope looks exactly like a missing one."""
        if not is_id(queue_id) or not self.can_see_queue(queue_id):
            raise not_found("queue")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token(credential_id: str) -> tuple[str, str]:
    """Return (token, secret hash)."""
    secret = secrets.token_urlsafe(32)
    return f"{TOKEN_PREFIX}{credential_id}_{secret}", hash_secret(secret)


def parse_token(token: str) -> tuple[str, str] | None:
    if not token.startswith(TOKEN_PREFIX) or len(token) < len(TOKEN_PREFIX) + 34:
        return None
    cred_id = token[4:36]
    if token[36] != "_" or not is_id(cred_id):
        return None
    secret = token[37:]
    if not secret or len(secret) > 256:
        return None
    return cred_id, secret


def parse_authorization(header: str | None) -> tuple[str, str]:
    if not header:
        raise unauthenticated("missing Authorization: Bearer token")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthenticated("the Authorization header must be 'Bearer <token>'")
    parsed = parse_token(token.strip())
    if parsed is None:
        raise unauthenticated("malformed bearer token")
    return parsed


def principal_from_row(row) -> Principal:
    scope = orjson.loads(row["queue_scope"])
    return Principal(
        credential_id=row["id"],
        application_id=row["application_id"],
        namespace_id=row["namespace_id"],
        permissions=frozenset(orjson.loads(row["permissions"])),
        queue_scope=ALL_QUEUES if scope == ALL_QUEUES else tuple(scope),
    )


async def authenticate(db: Database, header: str | None) -> Principal:
    """Look the credential up on every request so that revocation applies at once."""
    cred_id, secret = parse_authorization(header)

    row = await db.read(lambda tx: tx.one(cred_q.by_id(cred_id)))
    # Compare even when the row is missing so timing does not reveal which ids exist.
    expected = row["secret_hash"] if row is not None else "0" * 64
    ok = hmac.compare_digest(expected, hash_secret(secret))
    if row is None or not ok or row["revoked_at"] is not None:
        raise unauthenticated()
    return principal_from_row(row)


class TokenCache:
    """Principals of tokens that authenticated on this node, for writes that re-check the
    credential's revocation inside their own transaction (see `authenticate_for_write`).

    Keyed by the SHA-256 of the whole token, so that only the exact token that passed the
    secret check finds its entry. A credential's permissions and scope never change after
    issue; its revocation is the one thing a cached principal can miss, hence the re-check.
    """

    def __init__(self, size: int = 10_000) -> None:
        self._size = size
        self._principals: OrderedDict[str, Principal] = OrderedDict()

    @staticmethod
    def key(header: str | None) -> str | None:
        if not header:
            return None
        return hashlib.sha256(header.encode()).hexdigest()

    def get(self, key: str | None) -> Principal | None:
        return self._principals.get(key) if key is not None else None

    def put(self, key: str | None, who: Principal) -> None:
        if key is None:
            return
        self._principals[key] = who
        while len(self._principals) > self._size:
            self._principals.popitem(last=False)

    def forget(self, key: str | None) -> None:
        if key is not None:
            self._principals.pop(key, None)


async def authenticate_for_write(db: Database, cache: TokenCache, header: str | None) -> tuple[Principal, bool]:
    """(principal, verified). A token seen before is not looked up again: the write must then
    confirm in its transaction that the credential is still unrevoked (`verified` is False),
    which saves the separate lookup round trip on the hot write paths."""
    key = TokenCache.key(header)
    cached = cache.get(key)
    if cached is not None:
        return cached, False
    who = await authenticate(db, header)
    cache.put(key, who)
    return who, True


async def insert_credential(
    tx: Tx,
    *,
    application_id: str,
    namespace_id: str,
    permissions: list[str],
    queue_scope: str | list[str],
    label: str | None = None,
) -> tuple[str, str]:
    """Issue a credential; return (credential id, token). The token is shown once."""
    cred_id = new_id()
    token, digest = new_token(cred_id)
    await tx.defer(cred_q.insert({
        "id": cred_id,
        "application_id": application_id,
        "namespace_id": namespace_id,
        "secret_hash": digest,
        "permissions": orjson.dumps(sorted(set(permissions))).decode(),
        "queue_scope": orjson.dumps(queue_scope).decode(),
        "label": label,
        "created_at": await tx.now(),
    }))
    return cred_id, token
