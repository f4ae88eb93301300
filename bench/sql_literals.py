"""CPU to build one 500-row `INSERT INTO tasks … VALUES …` statement, as a batch submit does:
every value escaped, repeated values' literals remembered, and column by column (what
`Tx.defer_rows` does: constant columns escaped once). No database needed.

    python bench/sql_literals.py
"""

from __future__ import annotations

import sys
import timeit
from datetime import datetime
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from orbit.server.core.ids import new_id  # noqa: E402
from orbit.server.store.literals import Literals  # noqa: E402


def main() -> None:
    lits = Literals()
    now = datetime(2026, 1, 1, 12, 0, 0, 123456)
    retry = {"initial_backoff_ms": 1000, "max_backoff_ms": 60000, "multiplier": 2.0}
    rows = [
        [new_id(), "a" * 32, "b" * 32, "c" * 32, None, None, "WAITING",
         orjson.dumps({"i": i, "name": f"job-{i}"}).decode(), 0, orjson.dumps([]).decode(), 3, 0,
         orjson.dumps(retry).decode(), "RETRY", now, None, None, False, None, None, None, None, now, now, None]
        for i in range(500)
    ]

    def build(lit) -> str:
        return ",".join("(" + ",".join(map(lit, r)) + ")" for r in rows)

    assert build(lits.literal) == build(lits.memo_literal()) == lits.values_list(rows)
    n = 100
    plain = timeit.timeit(lambda: build(lits.literal), number=n) / n
    memo = timeit.timeit(lambda: build(lits.memo_literal()), number=n) / n
    columns = timeit.timeit(lambda: lits.values_list(rows), number=n) / n
    print(f"500-row VALUES list: each value escaped {plain * 1e3:.2f} ms; repeated values remembered "
          f"{memo * 1e3:.2f} ms ({memo / plain:.0%}); column by column {columns * 1e3:.2f} ms ({columns / plain:.0%})")


if __name__ == "__main__":
    main()
