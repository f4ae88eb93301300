"""A private MariaDB server for one chaos run: its own data directory and loopback port.

The run kills and restarts it; owning it means no other database user (a test suite on
the machine's shared server) is disturbed, and a crash restart exercises InnoDB recovery.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import asyncmy

MARIADBD = os.environ.get("ORBIT_CHAOS_MARIADBD", "/usr/sbin/mariadbd")
INSTALL_DB = os.environ.get("ORBIT_CHAOS_INSTALL_DB", "mariadb-install-db")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateMariaDB:
    """`start()` initialises the data directory once; `kill()`/`restart()` keep it.

    Grant tables are skipped (loopback only, a throwaway directory): every client is root.
    Durability settings are the server's defaults (a commit is on disk when acknowledged),
    which is what the crash restart checks.
    """

    def __init__(self, workdir: Path, *, port: int | None = None) -> None:
        self.dir = Path(workdir).resolve()
        self.datadir = self.dir / "data"
        self.port = port or _free_port()
        self.log_path = self.dir / "mariadbd.log"
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        # A Unix socket path must stay under 108 bytes, wherever the run's directory is.
        self.sockdir = Path(tempfile.mkdtemp(prefix="orbit-chaos-db-"))

    @property
    def base_url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}"

    def available(self) -> bool:
        return Path(MARIADBD).exists() and shutil.which(INSTALL_DB) is not None

    def _argv(self) -> list[str]:
        return [MARIADBD, "--no-defaults", f"--datadir={self.datadir}", f"--port={self.port}",
                "--bind-address=127.0.0.1", f"--socket={self.sockdir / 'sock'}",
                f"--pid-file={self.dir / 'mariadbd.pid'}", "--skip-grant-tables", "--skip-name-resolve",
                "--user=root", "--innodb-buffer-pool-size=128M", "--max-connections=600",
                "--innodb-lock-wait-timeout=10", f"--log-error={self.log_path}"]

    def start(self, timeout: float = 60.0) -> None:
        if not self.datadir.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            subprocess.run([INSTALL_DB, "--no-defaults", f"--datadir={self.datadir}", "--user=root",
                            "--auth-root-authentication-method=normal", "--skip-test-db"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proc = subprocess.Popen(self._argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited ({self.proc.returncode}); see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"mariadbd not listening on {self.port} within {timeout}s; see {self.log_path}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the server abruptly (SIGKILL: committed work must survive crash recovery)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        self.proc.wait(60)

    def restart(self, sig: int = signal.SIGKILL) -> None:
        self.kill(sig)
        self.restarts += 1
        self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.sockdir, ignore_errors=True)


async def create_database(base_url: str, name: str) -> str:
    host_port = base_url.rsplit("@", 1)[1]
    host, port = host_port.split(":")
    conn = await asyncmy.connect(host=host, port=int(port), user="root", password="")
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    return f"{base_url}/{name}"
