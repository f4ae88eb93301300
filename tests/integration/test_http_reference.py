"""The HTTP reference page (docs/reference/http-api.md) is written from the server's own OpenAPI
document by tools/http_reference.py: every operation is documented there, every example body is
one the document admits, and the page in the tree is what the script writes today."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("http_reference", ROOT / "tools" / "http_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["http_reference"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tool():
    return _tool()


@pytest.fixture(scope="module")
def document(tool):
    return tool.build_document()


def test_every_operation_has_a_clean_name_a_summary_and_a_tag(tool, document):
    ids = [op["operationId"] for _, _, op in tool.operations(document)]
    assert len(ids) == len(set(ids))
    for method, path, op in tool.operations(document):
        assert re.fullmatch(r"[a-z]+(?:[A-Z][a-z]+)*", op["operationId"]), (method, path, op["operationId"])
        assert op.get("summary") and op.get("tags"), (method, path)


def test_every_operation_is_documented_and_nothing_else(tool, document):
    ids = {op["operationId"] for _, _, op in tool.operations(document)}
    assert ids - tool.OPERATIONS.keys() == set(), "operations missing from tools/http_reference.py"
    assert tool.OPERATIONS.keys() - ids == set(), "documented operations the API no longer has"


def test_every_example_is_a_body_the_document_admits(tool, document):
    for method, path, op in tool.operations(document):
        info = tool.OPERATIONS[op["operationId"]]
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        assert (body is None) == (info.example is None), (method, path)
        if body is not None:
            schema = {**body, "components": document["components"]}
            jsonschema.validate(info.example, schema, cls=jsonschema.Draft202012Validator)


def test_the_page_is_current(tool, document):
    page = tool.PAGE.read_text()
    assert page == tool.render(document), "run: python tools/http_reference.py"
