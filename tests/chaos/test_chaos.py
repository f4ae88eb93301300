"""The chaos run CI affords: two minutes of load and faults, then every end check.

`python -m chaos --seconds 600 --db-restarts 2` is the long run (see the README)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.mariadb import PrivateMariaDB

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("ORBIT_CHAOS_SECONDS", "120"))

pytestmark = pytest.mark.slow


def test_two_minutes_of_chaos_leave_nothing_lost_duplicated_or_over_a_limit(tmp_path):
    if not PrivateMariaDB(tmp_path).available():
        if os.environ.get("ORBIT_REQUIRE_MARIADB") == "1":
            pytest.fail("the chaos run needs mariadbd and mariadb-install-db")
        pytest.skip("mariadbd is not installed")
    seed = int(os.environ.get("ORBIT_CHAOS_SEED") or random.randrange(1 << 30))
    argv = [sys.executable, "-m", "chaos", "--seconds", str(SECONDS), "--seed", str(seed),
            "--db-restarts", "1", "--workdir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SECONDS + 600)
    out = done.stdout
    report = json.loads(out[out.index("\n{") + 1:]) if "\n{" in out else None
    assert report is not None, f"seed {seed}: no report (exit {done.returncode})\n{out[-4000:]}\n{done.stderr[-4000:]}"
    assert report["problem_count"] == 0 and done.returncode == 0, (
        f"seed {seed} (replay: ORBIT_CHAOS_SEED={seed}): {json.dumps(report['problems'], indent=1)[:6000]}")
    # The faults reached what they aim at: a run that only watched would prove nothing.
    assert report["db_restarts"] == 1, report
    assert report["lease_outcomes"].get("LEASE_LOST", 0) > 0, report
    assert report["tasks"] >= SECONDS * 10, report
