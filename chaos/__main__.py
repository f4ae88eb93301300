"""`python -m chaos`: one chaos run; prints its report and exits 1 if any check failed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from chaos.mariadb import PrivateMariaDB
from chaos.run import Config, run


def main() -> int:
    d = Config()
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    p.add_argument("--seconds", type=float, default=d.seconds, help="load-and-faults phase length")
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--workers", type=int, default=d.workers, help="SDK worker processes")
    p.add_argument("--rate", type=float, default=d.rate, help="tasks offered per second")
    p.add_argument("--every", type=float, default=d.every, help="mean seconds between node/worker faults")
    p.add_argument("--db-restarts", type=int, default=d.db_restarts, help="MariaDB crash-restarts in the run")
    p.add_argument("--lease-ms", type=int, default=d.lease_ms)
    p.add_argument("--seed", type=int, default=None, help="replays a run's fault schedule and load")
    p.add_argument("--workdir", type=Path, default=d.workdir, help="where each run keeps its logs and report")
    a = p.parse_args()
    if not PrivateMariaDB(a.workdir).available():
        print("chaos needs mariadbd and mariadb-install-db on this machine", file=sys.stderr)
        return 2
    cfg = Config(seconds=a.seconds, nodes=a.nodes, workers=a.workers, rate=a.rate, every=a.every,
                 db_restarts=a.db_restarts, lease_ms=a.lease_ms, workdir=a.workdir,
                 **({"seed": a.seed} if a.seed is not None else {}))
    report = run(cfg)
    print(json.dumps(report, indent=2, default=str))
    return 1 if report["problem_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
