"""Orbit builds the SQL literals of its write-behind statements itself (store/literals.py): MariaDB must
read every string back exactly as it was, quotes, backslashes and control characters included."""

import random

import pytest

from orbit.server.store.literals import Literals

pytestmark = pytest.mark.anyio

TRICKY = ['"', "'", "\\", '\\"', "\\'", "''", '""', "\0", "\n", "\r", "\032", "%", "%s", "\\%", "\\_",
          '{"a": "b\\"c", "d": [1, "\'"]}', "é ü 𝄞 😀", "\t\x08\x0c", "\\\\'\\\\\"", "a\\0b", ""]


def _corpus() -> list[str]:
    rng = random.Random(6)
    alphabet = "\"'\\\0\n\r\032%_ ab{}:,éü😀\t"
    return TRICKY + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(300)]


async def test_every_string_literal_reads_back_as_it_was(db):
    if db.dialect != "mysql":
        pytest.skip("SQLite statements take parameters, not literals")
    corpus = _corpus()
    lits = Literals()

    async def read_back(tx):
        got = []
        for start in range(0, len(corpus), 50):
            values = corpus[start:start + 50]
            text = "SELECT " + ", ".join(f"{lits.literal(v)} AS c{i}" for i, v in enumerate(values))
            ((_, rows),) = await tx._run_mysql([text])
            got += [rows[0][f"c{i}"] for i in range(len(values))]
        return got

    assert await db.transaction(read_back) == corpus
