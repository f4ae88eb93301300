"""OpenAPI wiring: request bodies are parsed by hand (for the digest and the strict
envelope), so their schemas are registered here from the same pydantic models."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from ..._rules import ID_PATTERN

_REQUEST_MODELS: dict[str, type[BaseModel]] = {}

D = TypeVar("D")


class ErrorBody(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorEnvelope(BaseModel):
    request_id: str
    error: ErrorBody


class Envelope(BaseModel, Generic[D]):
    request_id: str
    data: D


IDEMPOTENCY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": True,
    "description": "1-128 visible ASCII characters naming this operation",
    "schema": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[\\x21-\\x7e]+$"},
}


def body_spec(model: type[BaseModel], *, idempotent: bool = True) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model`."""
    _REQUEST_MODELS[model.__name__] = model
    extra: dict[str, Any] = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }
    if idempotent:
        extra["parameters"] = [IDEMPOTENCY_HEADER]
    return extra


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorEnvelope, "description": "error envelope"} for s in statuses}


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter is optional by `required: false`; its value is text, never null, so the
    `anyOf [..., null]` of an optional Python parameter would describe nothing a client can send."""
    branches = [b for b in schema.get("anyOf", []) if b != {"type": "null"}]
    if "anyOf" not in schema or len(branches) != 1:
        return schema
    rest = {k: v for k, v in schema.items() if k not in ("anyOf", "default") or (k == "default" and v is not None)}
    return {**branches[0], **rest}


# A resource's id in a path. Any other text is not refused as malformed: it names no resource, 404
# like an unknown id (never reveal existence), or 405 where it reads as an action path.
_PATH_ID = {"type": "string", "pattern": ID_PATTERN,
            "description": "32 lowercase hex; anything else names no resource (404)"}
DESCRIPTION = (
    "Durable, multi-tenant task execution with exact cluster-wide queue limits. Validation is strict: an "
    "integer is a JSON integer (8, not 8.0 or \"8\"; OpenAPI 3.1's integer, a JSON number without a "
    "fraction or exponent part), an optional field given as null is the same as omitting it, and a body or "
    "parameter this document does not admit is 400 INVALID_ARGUMENT. Some rules depend on the request's "
    "time or the namespace's state and are checked by the server only: timestamps within their windows, "
    "resource keys that exist, a cron expression that matches some time, an IANA time zone, exactly one of "
    "cron and interval_seconds, start_at before end_at, max_backoff_ms at least initial_backoff_ms, "
    "deadline_at or deadline_seconds (not both), the payload's size."
)


def install_openapi(app: FastAPI) -> None:
    def custom_openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title="Orbit", version="1", openapi_version="3.1.0", routes=app.routes,
            description=DESCRIPTION,
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, model in _REQUEST_MODELS.items():
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for def_name, def_schema in js.pop("$defs", {}).items():
                components.setdefault(def_name, def_schema)
            components[name] = js
        # FastAPI's own 422 schemas are never produced: validation answers 400 envelopes.
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        for path in schema.get("paths", {}).values():
            for op in path.values():
                if isinstance(op, dict):
                    op.get("responses", {}).pop("422", None)
                    for param in op.get("parameters", []):
                        if param.get("in") == "query" and "schema" in param:
                            param["schema"] = _not_null(param["schema"])
                        if param.get("in") == "path" and param.get("name", "").endswith("_id"):
                            param["schema"] = {**param.get("schema", {}), **_PATH_ID}
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "orb_<credential id>_<secret>"}
        }
        schema["security"] = [{"bearer": []}]
        for public in ("/healthz", "/readyz", "/metrics"):
            for op in schema.get("paths", {}).get(public, {}).values():
                if isinstance(op, dict):
                    op["security"] = []
        app.openapi_schema = schema
        return schema

    app.openapi = custom_openapi  # type: ignore[method-assign]
