"""Write docs/reference/http-api.md from the server's own OpenAPI document.

    python tools/http_reference.py           # rewrite the page
    python tools/http_reference.py --check   # exit 1 when the page is not what the document gives

The document gives paths, parameters, bodies, responses and every schema; this file adds
what it does not say: the permission each operation needs, a request example (checked
against the operation's schema by tests/integration/test_http_reference.py) and a note
where one helps. An operation of the document that is not listed here, or one listed here
that the document no longer has, fails that test: the reference cannot drift.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "http-api.md"
TAG_ORDER = ["queues", "tasks", "applications", "resource-keys", "schedules", "events", "audit", "credential", "health"]
TAG_TITLES = {"queues": "Queues", "tasks": "Tasks", "applications": "Applications", "resource-keys": "Resource keys",
              "schedules": "Schedules", "events": "Events", "audit": "Audit", "credential": "Credential",
              "health": "Health and metrics"}
REVISION = "1"


@dataclass(frozen=True)
class Operation:
    """What the OpenAPI document does not say about an operation."""

    permission: str | None
    example: Any = None  # the request body of the example (None: the operation takes none)
    query: str = ""  # query string of the example
    note: str = ""
    path_ids: dict[str, str] = field(default_factory=dict)


QID, TID, AID, KID, SID = "$QUEUE_ID", "$TASK_ID", "$APPLICATION_ID", "$KEY_ID", "$SCHEDULE_ID"

OPERATIONS: dict[str, Operation] = {
    "healthz": Operation(None, note="No credential. 200 while the process runs; for liveness probes."),
    "readyz": Operation(None, note="No credential. 503 while the database does not answer or its schema is not "
                                   "the one this node was built for; for readiness probes and load balancers."),
    "metrics": Operation(None, note="Prometheus text format. Served here unless the node runs a separate metrics "
                                    "listener (`orbit server --metrics-listen`); see [Operations](../operations.md)."),
    "createQueue": Operation("queues:manage", {"name": "emails", "max_concurrency": 10, "rate_per_second": 50,
                                               "max_unfinished_tasks": 100000},
                             note="201 the first time; 200 with `\"deduplicated\": true` and the original queue when "
                                  "the same request is sent again with the same Idempotency-Key; 409 "
                                  "`STATE_CONFLICT` when another queue has the name."),
    "listQueues": Operation("queues:read", query="limit=100&include_retired=false"),
    "getQueue": Operation("queues:read"),
    "getQueueUsage": Operation("queues:read"),
    "getQueueThroughput": Operation("queues:read", query="minutes=15"),
    "configureQueue": Operation("queues:manage", {"expected_revision": "3", "reason": "holiday traffic",
                                                  "paused": False, "max_concurrency": 20, "rate_per_second": 100,
                                                  "max_unfinished_tasks": 100000},
                                note="Replaces every control at once. `expected_revision` is the queue's current "
                                     "`revision`; a stale one is 409 `STATE_CONFLICT`."),
    "retireQueue": Operation("queues:manage", {"expected_revision": "4", "reason": "replaced by emails-v2"},
                             note="Only a queue without unfinished tasks can be retired; retiring is final."),
    "submitTask": Operation("tasks:submit", {"payload": {"to": "ada@example.com"}, "priority": 7, "max_attempts": 5,
                                             "retry": {"initial_backoff_ms": 2000, "max_backoff_ms": 60000},
                                             "on_lease_lost": "retry", "deadline_seconds": 3600},
                            note="The Idempotency-Key is the task's identity in the queue: sending it again returns "
                                 "the same task (200, `deduplicated`). 429 `QUEUE_FULL` or `APPLICATION_FULL` when "
                                 "the backlog limit is reached."),
    "listTasks": Operation("tasks:read", query="state=WAITING&limit=50"),
    "submitTaskBatch": Operation("tasks:submit", {"tasks": [
        {"idempotency_key": "invoice-1001", "payload": {"invoice": 1001}},
        {"idempotency_key": "invoice-1002", "payload": {"invoice": 1002}, "priority": 9}]},
        note="Up to 500 tasks in one transaction; each item has its own idempotency key and its own result, in "
             "order. The batch is admitted in order: once the backlog limit refuses an item, every later item is "
             "refused too."),
    "getTaskBlockers": Operation("tasks:read", note="Every control that keeps a task from running now: pause, "
                                                   "concurrency, rate, resource keys, application quotas, "
                                                   "`available_at`, no worker claiming."),
    "getTask": Operation("tasks:read"),
    "listAttempts": Operation("tasks:read"),
    "cancelTask": Operation("tasks:cancel", {"reason": "customer withdrew the order"},
                            note="A waiting or leased task ends `CANCELLED` at once; a running one gets a cancel "
                                 "request its worker sees on its next renewal or as a push."),
    "reviewTask": Operation("tasks:review", {"resolution": "SUCCEEDED", "reason": "the e-mail was delivered",
                                             "evidence": {"message_id": "<20261202.1@example.com>"}},
                            note="Resolves a task in `NEEDS_REVIEW`: `SUCCEEDED`, `FAILED`, or `RETRY` (back to "
                                 "`WAITING` with a new attempt)."),
    "getApplication": Operation("applications:read"),
    "configureApplication": Operation("applications:manage", {
        "expected_revision": "2", "reason": "new contract", "paused": False, "max_concurrency": 500,
        "rate_per_second": 1000, "max_unfinished_tasks": 1000000},
        note="The application's quotas bind every queue of every namespace of the application together."),
    "createResourceKey": Operation("resource_keys:manage", {"name": "partner-api", "max_concurrency": 2}),
    "listResourceKeys": Operation("resource_keys:read", query="limit=100"),
    "getResourceKey": Operation("resource_keys:read"),
    "configureResourceKey": Operation("resource_keys:manage", {"expected_revision": "1", "reason": "partner raised "
                                                               "our limit", "max_concurrency": 4}),
    "retireResourceKey": Operation("resource_keys:manage", {"expected_revision": "2", "reason": "partner gone"}),
    "createSchedule": Operation("schedules:manage", {
        "name": "nightly-report", "queue_id": "0f6c2f0e8b8e4c1f9a4e6d2b7c3a1e5d", "cron": "0 2 * * *",
        "timezone": "Europe/Paris", "misfire": {"policy": "latest"}, "overlap": "skip",
        "task": {"payload": {"report": "daily"}, "max_attempts": 3, "deadline_seconds": 3600}}),
    "listSchedules": Operation("schedules:read", query="limit=100"),
    "getSchedule": Operation("schedules:read"),
    "listScheduleRuns": Operation("schedules:read", query="limit=100"),
    "configureSchedule": Operation("schedules:manage", {
        "expected_revision": "1", "reason": "run at three", "paused": False, "cron": "0 3 * * *",
        "timezone": "Europe/Paris", "task": {"payload": {"report": "daily"}}}),
    "retireSchedule": Operation("schedules:manage", {"expected_revision": "2", "reason": "report retired"}),
    "listAuditRecords": Operation("audit:read", query="after=0&limit=100"),
    "listEvents": Operation("events:read", query="after=0&limit=100&wait_ms=20000&type=task.*",
                            note="Long-polls up to `wait_ms` when nothing is newer than `after`; keep the "
                                 "`next_after` of each page and pass it as `after` to the next call."),
    "getCredential": Operation(None, note="Any valid token; says what the token may do."),
}


def build_document() -> dict[str, Any]:
    """The OpenAPI document of a node (built without opening its database)."""
    from orbit.server.app import create_app
    from orbit.server.config import Settings

    unused = os.path.join(tempfile.gettempdir(), "orbit-reference-never-opened.db")
    return create_app(Settings(database_url=f"sqlite:///{unused}", background_loops=False)).openapi()


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) of every operation in the document, in its order."""
    return [(m.upper(), p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def _anchor(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "", name.lower().replace(" ", "-"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(schema: dict[str, Any], schemas: dict[str, Any]) -> str:
    """A schema's type in a table cell: `integer`, `string (date-time)`, links to named schemas."""
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        target = schemas.get(name, {})
        if "enum" in target:
            return " \\| ".join(f"`{v}`" for v in target["enum"])
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in schema:
        kinds = [s for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = len(kinds) < len(schema["anyOf"])
        text = " or ".join(_type(s, schemas) for s in kinds) or "null"
        return text + (", nullable" if nullable else "")
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}), schemas)}"
    if kind == "object" or (kind is None and schema.get("additionalProperties")):
        return "object"
    if kind is None:
        return "any JSON" if "not" in schema else "any"
    fmt = schema.get("format")
    return f"{kind} ({fmt})" if fmt and fmt not in ("int32", "int64") else kind


def _number(v: Any) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _limits(schema: dict[str, Any]) -> list[str]:
    out = []
    for s in [schema, *schema.get("anyOf", [])]:
        if "minimum" in s or "maximum" in s:
            lo, hi = s.get("minimum"), s.get("maximum")
            out.append(f"{_number(lo) if lo is not None else '…'}–{_number(hi) if hi is not None else '…'}")
        if "minLength" in s or "maxLength" in s:
            out.append(f"{s.get('minLength', 0)}–{s.get('maxLength', '…')} characters")
        if "maxItems" in s:
            out.append(f"at most {s['maxItems']} items")
        if "pattern" in s and len(s["pattern"]) <= 40 and s.get("type") == "string" and "format" not in s:
            out.append(f"pattern `{s['pattern']}`")
    return out


def _describe(schema: dict[str, Any]) -> str:
    parts = [schema["description"]] if schema.get("description") else []
    parts += _limits(schema)
    if "default" in schema and schema["default"] not in (None, [], {}):
        parts.append(f"default `{json.dumps(schema['default'])}`")
    return "; ".join(parts)


def _fields(schema: dict[str, Any], schemas: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    lines = ["| field | type | required | description |", "| --- | --- | --- | --- |"]
    for name, prop in schema.get("properties", {}).items():
        lines.append(f"| `{name}` | {_cell(_type(prop, schemas))} | {'yes' if name in required else 'no'} | "
                     f"{_cell(_describe(prop))} |")
    return lines


def _example(method: str, path: str, op: dict[str, Any], info: Operation) -> list[str]:
    url = path
    for name, value in {"queue_id": QID, "task_id": TID, "application_id": AID, "resource_key_id": KID,
                        "schedule_id": SID}.items():
        url = url.replace("{" + name + "}", value)
    if info.query:
        url += "?" + info.query
    lines = ["```sh", f"curl -sS{' -X POST' if method == 'POST' else ''} \"$ORBIT_URL{url}\" \\"]
    if info.permission is not None or op.get("security"):
        lines.append('  -H "Authorization: Bearer $TOKEN" \\')
    if any(p["name"] == "Idempotency-Key" for p in op.get("parameters", [])):
        lines.append('  -H "Idempotency-Key: $(uuidgen)" \\')
    if info.example is not None:
        lines.append("  -H 'Content-Type: application/json' \\")
        body = json.dumps(info.example, indent=2, ensure_ascii=False)
        lines.append("  -d '" + body.replace("'", "'\\''") + "'")
    else:
        lines[-1] = lines[-1].removesuffix(" \\")
    lines.append("```")
    return lines


def render(doc: dict[str, Any]) -> str:
    schemas = doc["components"]["schemas"]
    out = ["# HTTP API reference", "",
           ("<!-- Written by tools/http_reference.py from the server's /openapi.json: edit that script, "
            "not this page. -->"), "",
           ("Every operation of the API, grouped as in the OpenAPI document that every node serves at "
           "`/openapi.json` (the `operationId` is what generated clients name their methods by). Requests "
           "and responses are JSON; successful answers are wrapped as `{\"request_id\": …, \"data\": …}` and "
           "errors as `{\"request_id\": …, \"error\": {\"code\", \"message\", \"details\"}}`. "
           "[Conventions](../http-api.md) explains authentication, idempotency, revisions, pagination, "
           "strict validation and every error code."), "",
           "The examples use `$ORBIT_URL` (e.g. `http://127.0.0.1:8080`) and `$TOKEN` (a credential's token).", ""]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for method, path, op in operations(doc):
        by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    used: set[str] = set()
    for tag in sorted(by_tag, key=lambda t: TAG_ORDER.index(t) if t in TAG_ORDER else len(TAG_ORDER)):
        out += [f"## {TAG_TITLES.get(tag, tag.title())}", ""]
        for method, path, op in by_tag[tag]:
            info = OPERATIONS[op["operationId"]]
            out += [f"### {op.get('summary', op['operationId'])}", "",
                    (f"`{method} {path}` · operationId `{op['operationId']}` · permission "
                     f"{'`' + info.permission + '`' if info.permission else 'none'}"), ""]
            if op.get("description"):
                out += [op["description"], ""]
            if info.note:
                out += [info.note, ""]
            params = op.get("parameters", [])
            if params:
                out += ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
                for p in params:
                    desc = _describe({**p.get("schema", {}), **({"description": p["description"]}
                                                                 if p.get("description") else {})})
                    out.append(f"| `{p['name']}` | {p['in']} | {_cell(_type(p.get('schema', {}), schemas))} | "
                               f"{'yes' if p.get('required') else 'no'} | {_cell(desc)} |")
                out.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is not None:
                name = _ref_name(body["$ref"])
                used.add(name)
                out += [f"Body: [{name}](#{_anchor(name)})", ""]
            out += ["Example:", "", *_example(method, path, op, info), ""]
            answers = []
            for status, resp in sorted(op.get("responses", {}).items()):
                schema = resp.get("content", {}).get("application/json", {}).get("schema", {})
                name = _ref_name(schema["$ref"]) if "$ref" in schema else None
                if name and name.startswith("Envelope_"):
                    inner = _ref_name(schemas[name]["properties"]["data"]["$ref"])
                    used.add(inner)
                    answers.append(f"`{status}` [{inner}](#{_anchor(inner)})")
                elif name == "ErrorEnvelope":
                    answers.append(f"`{status}` error")
                else:
                    answers.append(f"`{status}` {resp.get('description', '')}".rstrip())
            out += ["Answers: " + ", ".join(answers) + ".", ""]
    out += ["## Schemas", "", "The bodies and results named above, and the objects they contain.", ""]
    for name in sorted(schemas):
        if name.startswith("Envelope_") or name in ("ErrorEnvelope",):
            continue
        schema = schemas[name]
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [schema["description"], ""]
        if "enum" in schema:
            out += ["One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".", ""]
        elif schema.get("properties"):
            out += [*_fields(schema, schemas), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    args = parser.parse_args()
    text = render(build_document())
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python tools/http_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
