"""`orbit`, traced for `bench/light_path.py`: runs the CLI given after the first argument with
every MariaDB round trip, Start frame and hand-off answer timestamped in the server.

    python bench/_light_trace.py orbit server ...   # trace written to $ORBIT_BENCH_TRACE on exit

Each record is one JSON line: a round trip (`rt`: its transaction, wall start and end from
`time.perf_counter`, the thread's CPU over it, and the shapes of its statements, the deferred
writes before `|`; with ORBIT_BENCH_TRACE_SQL set, also the text sent), a Start frame's arrival
(`start`), or a submit's answer to a waiting claim as its COMMIT goes out (`answer`). The first
word of the command line is `orbit`, so the harness finds the process as it finds the server.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import sys
import time

import orjson

from orbit.server.services import dispatch
from orbit.server.store import tx as tx_module
from orbit.server.ws import session as ws_session

_records: list[tuple] = []
_ids = itertools.count(1)
_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+(\w+)")


def shape(statement: str) -> str:
    """A statement's verb and first table: enough to tell a transaction's round trips apart."""
    m = _TABLE.search(statement)
    return f"{statement.split(None, 1)[0]}:{m.group(1) if m else '?'}"


def _tx_id(tx: tx_module.Tx) -> int:
    """A transaction's own number (an object's `id` is reused once it is freed)."""
    if "_trace_id" not in tx.__dict__:
        tx.__dict__["_trace_id"] = next(_ids)
    return tx.__dict__["_trace_id"]


def _install() -> None:
    run_mysql = tx_module.Tx._run_mysql

    with_sql = bool(os.environ.get("ORBIT_BENCH_TRACE_SQL"))

    async def traced_run(self, statements):
        shapes = [*map(shape, self._deferred), "|", *map(shape, statements)]
        # What Tx._run_mysql sends: the deferred writes, the statements, the reads riding with them.
        riding = self._ahead if not statements or statements[-1] != "COMMIT" else []
        text = ";\n".join([*self._deferred, *statements, *(t for a in riding for t in a.texts)]) if with_sql else None
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return await run_mysql(self, statements)
        finally:
            record = ("rt", _tx_id(self), t0, time.perf_counter(), c0, time.thread_time(), " ".join(shapes))
            _records.append(record if text is None else (*record, text))

    tx_module.Tx._run_mysql = traced_run

    command = ws_session.WorkerSession._command

    def traced_command(self, frame, msg_id, kind):
        if kind == "start":
            _records.append(("start", time.perf_counter()))
        return command(self, frame, msg_id, kind)

    ws_session.WorkerSession._command = traced_command

    answer_as_commit_goes = dispatch.Handoff.answer_as_commit_goes

    def traced_answer(self, tx, served):
        answer = self._answer
        if served is not None and answer is not None:
            tx_id = _tx_id(tx)

            def timed(replies):
                _records.append(("answer", tx_id, time.perf_counter()))
                answer(replies)
            self._answer = timed
        return answer_as_commit_goes(self, tx, served)

    dispatch.Handoff.answer_as_commit_goes = traced_answer


def _dump() -> None:
    path = os.environ.get("ORBIT_BENCH_TRACE")
    if path and _records:
        with open(path, "wb") as f:
            f.writelines(orjson.dumps(r) + b"\n" for r in _records)


def main() -> None:
    _install()
    atexit.register(_dump)  # the server ends on SIGTERM by draining, then exits normally
    sys.argv = sys.argv[1:]
    from orbit.cli.orbit import main as orbit_main

    orbit_main()


if __name__ == "__main__":
    main()
