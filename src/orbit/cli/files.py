"""Writing credentials files safely: mode 0600, never into a shared-writable directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import orjson


class FileRefused(Exception):
    pass


def check_writable_target(path: Path, *, force: bool) -> None:
    """Refuse before anything is issued, so a refusal leaves no orphan credential."""
    directory = path.parent.resolve()
    if not directory.is_dir():
        raise FileRefused(f"directory {directory} does not exist; create it with mode 0700 first")
    mode = directory.stat().st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise FileRefused(
            f"refusing to write a credential into {directory}: it is group- or world-writable (chmod go-w)"
        )
    if path.is_dir():
        raise FileRefused(f"{path} is a directory; give a file path")
    if path.exists() and not force:
        raise FileRefused(f"{path} already exists; pass --force to overwrite it")


def write_secret_json(path: Path, content: dict[str, Any], *, force: bool) -> None:
    """Write atomically with mode 0600 from the first byte."""
    check_writable_target(path, force=force)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(orjson.dumps(content, option=orjson.OPT_INDENT_2) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        if not force and path.exists():
            raise FileRefused(f"{path} already exists; pass --force to overwrite it")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
