"""The layers of the server, read from the import graph and the source (ARCHITECTURE.md).

protocol (`http/`, `ws/`) -> `services/` -> `store/` and `core/`; nothing imports upward, and
`http/` and `ws/` never import each other. SQL text and dialect switches live in `store/` only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
SERVER = SRC / "orbit" / "server"

# What each part of the server may import from `orbit.server` (besides itself). Imports under
# `if TYPE_CHECKING:` are annotations, not dependencies, and are not counted.
ALLOWED = {
    "core": set(),
    "store": {"core", "errors", "overload"},
    "services": {"store", "core", "errors"},
    "http": {"services", "core", "errors", "envelope", "node", "overload"},
    "ws": {"services", "core", "errors", "envelope", "wakeups", "batching", "loops"},
    "errors": set(),
    "envelope": {"errors"},
    "wakeups": set(),
    "loops": {"core", "errors"},
    "batching": {"loops", "errors", "overload"},
    "config": set(),
    "overload": set(),
}
ROOTS = {"app", "node", "migrations"}  # the composition root wires everything together


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(path: Path) -> set[str]:
    """Absolute module names this file imports at run time."""
    tree = ast.parse(path.read_text())
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skip = _type_checking_lines(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import tasks` names a module
    return found


def _part(module: str) -> str | None:
    """`orbit.server.http.tasks` -> `http`; None outside the server."""
    if not module.startswith("orbit.server."):
        return None
    return module.split(".")[2]


def _server_files() -> list[Path]:
    return sorted(p for p in SERVER.rglob("*.py"))


@pytest.mark.parametrize("path", _server_files(), ids=lambda p: str(p.relative_to(SERVER)))
def test_imports_point_one_way(path: Path):
    part = _part(_module(path))
    if part is None or part in ROOTS:
        return
    allowed = ALLOWED[part] | {part}
    modules = {m for m in imports_of(path) if (SERVER.parent / Path(*m.split(".")[1:])).with_suffix(".py").exists()
               or (SERVER.parent / Path(*m.split(".")[1:]) / "__init__.py").exists()}
    wrong = sorted(m for m in modules if _part(m) is not None and _part(m) not in allowed)
    assert not wrong, f"{path.relative_to(SRC)} ({part}) must not import {wrong}"


def test_the_sdk_never_imports_the_server():
    sdk = [SRC / "orbit" / "__init__.py", SRC / "orbit" / "models.py", SRC / "orbit" / "_rules.py",
           *sorted((SRC / "orbit" / "sdk").rglob("*.py"))]
    for path in sdk:
        wrong = sorted(m for m in imports_of(path) if m.startswith(("orbit.server", "orbit.cli")))
        assert not wrong, f"{path.relative_to(SRC)} imports {wrong}"


SQL = re.compile(r"\b(SELECT\s[\s\S]*\sFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|FOR\s+UPDATE|"
                 r"SKIP\s+LOCKED|LOCK\s+IN\s+SHARE|NOW\(6\))\b")
DIALECT_SWITCH = re.compile(r"\b(is_mysql|is_sqlite|dialect\s*==|for_update)\b|\.dialect\b(?!\s+import)")


def _outside_store() -> list[Path]:
    return [p for p in _server_files() if _part(_module(p)) not in ("store", "migrations")]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals (f-strings' constant parts joined), docstrings left out: prose may name SQL."""
    out = []
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if id(node) in docs:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            out.append((node.lineno, "".join(v.value for v in node.values if isinstance(v, ast.Constant))))
    return out


def test_no_sql_outside_the_store():
    found = []
    for path in _outside_store():
        for line, text in _strings(ast.parse(path.read_text())):
            if SQL.search(text):
                found.append(f"{path.relative_to(SRC)}:{line}: {text[:60]!r}")
    assert not found, "SQL text outside store/:\n" + "\n".join(found)


def test_no_dialect_switch_outside_the_store():
    found = []
    for path in _outside_store():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if DIALECT_SWITCH.search(code):
                found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not found, "dialect switches outside store/:\n" + "\n".join(found)


def test_the_checks_see_what_they_look_for():
    """The patterns above catch the forms the code used to have."""
    assert SQL.search("SELECT id FROM tasks WHERE id = ?") and SQL.search("UPDATE leases SET state = ?")
    assert SQL.search(" FOR UPDATE SKIP LOCKED") and not SQL.search("select a queue from the list")
    assert DIALECT_SWITCH.search("if tx.is_mysql and tx.deferring:") and DIALECT_SWITCH.search("tx.for_update")
    assert DIALECT_SWITCH.search('if db.dialect == "mysql":')
    assert not DIALECT_SWITCH.search("from ..store.dialect import PlanNoLongerHolds")
