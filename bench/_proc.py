"""Child processes and scratch databases of a benchmark run, all undone at the end even on failure.

Every child is started in its own session (process group), so ending it also
ends whatever it forked (Celery's prefork pool, uvicorn workers). Cleanup
callbacks (drop a database, delete Redis keys) run in reverse order.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

_lock = threading.Lock()
_children: list[subprocess.Popen] = []
_cleanups: list[tuple[str, Callable[[], None]]] = []


def spawn(args: list[str], *, env: dict[str, str] | None = None, log_path: str | None = None,
          stdout=None, cwd: str | None = None) -> subprocess.Popen:
    """Start a child in its own process group and remember it for `stop_all`."""
    out = stdout
    opened = None
    if out is None and log_path:
        out = opened = open(log_path, "ab")
    elif out is None:
        out = subprocess.DEVNULL
    try:
        p = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT if log_path else subprocess.DEVNULL,
                             stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd)
    finally:
        if opened is not None:
            opened.close()  # the child keeps its own descriptor
    with _lock:
        _children.append(p)
    return p


def stop(p: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the child's process group, then SIGKILL it after `grace` seconds."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    # The leader may have exited while its group lives on (forked pool children).
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        pass
    with _lock:
        if p in _children:
            _children.remove(p)


def stop_many(procs: list[subprocess.Popen], grace: float = 10.0) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        stop(p, grace=0)


def on_cleanup(name: str, fn: Callable[[], None]) -> Callable[[], None]:
    """Register `fn` to run at the end; returns a callable that runs it now (once) instead."""
    entry = (name, fn)
    with _lock:
        _cleanups.append(entry)

    def run_now() -> None:
        with _lock:
            if entry not in _cleanups:
                return
            _cleanups.remove(entry)
        _safe(name, fn)

    return run_now


def _safe(name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # cleanup must go on
        print(f"[bench] cleanup {name!r} failed: {exc}", file=sys.stderr)


def stop_all() -> None:
    with _lock:
        procs = list(_children)
    if procs:
        stop_many(procs, grace=5.0)
    while True:
        with _lock:
            if not _cleanups:
                break
            name, fn = _cleanups.pop()
        _safe(name, fn)


def install_handlers() -> None:
    """End children and drop databases on normal exit, SIGTERM and SIGINT."""
    atexit.register(stop_all)

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)
