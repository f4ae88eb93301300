"""The fault schedule of a chaos run: a pure function of the run's length and its seed.

A schedule is a list of `Fault`s; the runner carries each out at its time if its target is
up then (a target already down is skipped, and the skip is reported). The same seed gives
the same schedule, so a failing run can be replayed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KILL_NODE = "kill_node"        # SIGKILL a server node, start it again after `hold` seconds
STOP_NODE = "stop_node"        # SIGSTOP a server node (a hung host) for `hold` seconds
KILL_WORKER = "kill_worker"    # SIGKILL a worker process mid-handler, start a new one after `hold`
STOP_WORKER = "stop_worker"    # SIGSTOP a worker past its lease, then let it resume (late reports)
RESTART_DB = "restart_db"      # SIGKILL MariaDB, start it again after `hold` (crash recovery)

KINDS = (KILL_NODE, STOP_NODE, KILL_WORKER, STOP_WORKER, RESTART_DB)


@dataclass(frozen=True)
class Fault:
    at: float       # seconds after the run's start
    kind: str
    target: int     # node or worker index (0 for the database)
    hold: float     # seconds the target stays down or stopped


def plan(seconds: float, *, seed: int, nodes: int, workers: int, every: float, db_restarts: int,
         lease_ms: int) -> list[Fault]:
    """Faults spread over the middle of the run: none in the first 10 % (the run warms up)
    nor in the last 15 % (everything must be back before the run drains).

    Database restarts are evenly spaced; the other faults come at random intervals of mean
    `every` seconds, node and worker faults alike."""
    rng = random.Random(seed)
    begin, end = seconds * 0.10, seconds * 0.85
    lease_s = lease_ms / 1000
    faults = [Fault(round(begin + (end - begin) * (i + 1) / (db_restarts + 1), 2), RESTART_DB, 0,
                    round(rng.uniform(1.0, 3.0), 2)) for i in range(db_restarts)]
    t = begin + rng.expovariate(1 / every)
    weights = {KILL_NODE: 3, STOP_NODE: 1, KILL_WORKER: 3, STOP_WORKER: 2}
    while t < end:
        kind = rng.choices(list(weights), weights=list(weights.values()))[0]
        if kind == KILL_NODE:
            f = Fault(t, kind, rng.randrange(nodes), rng.uniform(0.5, 3.0))
        elif kind == STOP_NODE:
            f = Fault(t, kind, rng.randrange(nodes), rng.uniform(1.0, 4.0))
        elif kind == KILL_WORKER:
            f = Fault(t, kind, rng.randrange(workers), rng.uniform(0.5, 2.0))
        else:
            f = Fault(t, kind, rng.randrange(workers), lease_s * rng.uniform(1.5, 2.5) + 1.5)
        faults.append(Fault(round(f.at, 2), f.kind, f.target, round(f.hold, 2)))
        t += rng.expovariate(1 / every)
    return sorted(faults, key=lambda f: f.at)
