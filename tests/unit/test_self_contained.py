"""The repository names nothing outside itself.

Every tracked text file (`git ls-files`) is read line by line, and a line fails when it points
at something a reader of the repository does not have:

- a path into a sibling checkout (`..` + `/shared`) or a specification folder (`shared` + `/spec`);
- an issue or pull-request number: the word issue (or PR, bug, ticket) followed by a number,
  `fixes`, `closes` or `see` followed by `#` and a number, or `#` and a number in parentheses;
- a Markdown file name that no file of the repository has: a mention of some `name` + `.md` is
  fine only when a tracked file (or a page under docs/ on disk) has that name.

URLs are left out before a line is checked: a link to a third-party project's page is not a
reference to a file of ours. Binary files and the benchmark results (JSON under bench/) are not
read.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
OUTSIDE_PATH = re.compile(r"\.\./shared\b|\bshared/spec\b", re.IGNORECASE)
ISSUE = re.compile(
    r"\bissues? ?#?\d+\b"
    r"|\b(?:PR|pull request|bug|ticket) ?#\d+\b"
    r"|\b(?:see|fix(?:es|ed)?|close[sd]?|resolve[sd]?|refs?)\s+#\d+\b"
    r"|\(#\d+\)"
    r"|\bgh-\d+\b",
    re.IGNORECASE,
)
MD_NAME = re.compile(r"[\w.-]+\.md\b")


@cache
def tracked_files() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = {name for name in out.decode().split("\0") if name}
    files.add(THIS)  # this file checks itself, committed or not
    return tuple(sorted(files))


@cache
def known_md_names() -> frozenset[str]:
    names = {Path(f).name for f in tracked_files() if f.endswith(".md")}
    docs = ROOT / "docs"
    if docs.is_dir():
        names.update(p.name for p in docs.rglob("*.md") if p.is_file())
    return frozenset(names)


def _read_text(path: str) -> str | None:
    """The file's text, or None for what is not read: binary files, benchmark results."""
    if path.startswith("bench/") and path.endswith(".json"):
        return None
    full = ROOT / path
    if not full.is_file():  # deleted in the work tree, or a submodule
        return None
    data = full.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def hits_in(path: str) -> list[str]:
    """`path:line: what` for each reference to something outside the repository."""
    text = _read_text(path)
    if text is None:
        return []
    known = known_md_names()
    found: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = URL.sub(" ", line)
        what = [m.group(0) for m in OUTSIDE_PATH.finditer(line)]
        what += [m.group(0) for m in ISSUE.finditer(line)]
        what += [m.group(0) for m in MD_NAME.finditer(line) if m.group(0) not in known]
        if what:
            found.append(f"{path}:{number}: {', '.join(what)}  |  {line.strip()[:160]}")
    return found


def test_no_reference_outside_the_repository() -> None:
    files = tracked_files()
    assert len(files) > 50, "git ls-files found too few files: is this a checkout?"
    hits = [hit for f in files for hit in hits_in(f)]
    assert not hits, "references to files or issues outside the repository:\n" + "\n".join(hits)


def test_the_checks_catch_what_they_should() -> None:
    """The patterns themselves: what they flag and what they leave alone."""
    # Written in pieces, so that this file does not flag itself.
    flagged = ["see ../" + "shared/x", "in shared" + "/spec", "issue" + " 6", "Issue " + "#12", "PR " + "#3",
               "fixes " + "#9", "(" + "#4)"]
    for text in flagged:
        assert OUTSIDE_PATH.search(text) or ISSUE.search(text), text
    fine = ["color: #000;", "0 0 * * 1#2", "tissue 5", "issues of the queue", "shared/state"]
    for text in fine:
        assert not (OUTSIDE_PATH.search(text) or ISSUE.search(text)), text
    assert [m.group(0) for m in MD_NAME.finditer("see docs/foo" + ".md and hashlib.md5")] == ["foo" + ".md"]
    assert not URL.sub(" ", "https://github.com/other/project/issues/12").strip()
