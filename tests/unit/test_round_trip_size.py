"""A transaction's deferred writes never make a round trip larger than the server may take
(MariaDB drops the connection past max_allowed_packet, which can reach the client as a lost
connection, not as a refusal): large values are cut into several statements and round trips."""

from __future__ import annotations

import anyio
import pytest

from orbit.server.store.queries.bulk import update_many
from orbit.server.store.tx import ROUND_TRIP_BYTES, Stmt, Tx

MIB = 1024 * 1024


class _Cursor:
    def __init__(self, sent: list[str]) -> None:
        self._sent = sent
        self.description = None
        self.rowcount = 1
        self._result = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def execute(self, text: str) -> None:
        self._sent.append(text)

    async def nextset(self) -> bool:
        return False


class _Driver:
    """A multi-statement connection that records what each round trip carried."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.server_status = 0

    def cursor(self) -> _Cursor:
        return _Cursor(self.sent)


def _tx() -> tuple[Tx, _Driver]:
    d = _Driver()
    return Tx("mysql", driver=d, multi=True), d


def test_results_too_large_for_one_round_trip_go_in_several():
    async def run():
        tx, d = _tx()
        rows = {f"l{i:02}": {"result": f"[{i}, \"{'r' * (MIB - 1000)}\"]", "state": "ENDED"} for i in range(20)}
        await update_many(tx, "leases", rows)
        await tx.defer(Stmt("UPDATE queue_usage SET permits_in_use = permits_in_use - 20 WHERE id = ?", ["q"]))
        assert await tx.commit_deferred()
        return d.sent

    sent = anyio.run(run)
    assert len(sent) > 1
    assert all(len(text) <= ROUND_TRIP_BYTES + 64 * 1024 for text in sent)
    carried = "".join(sent)
    assert all(f"[{i}, " in carried for i in range(20))
    assert sent[-1].endswith("COMMIT")


def test_many_small_writes_still_travel_together():
    async def run():
        tx, d = _tx()
        for i in range(50):
            await tx.defer(Stmt("UPDATE tasks SET state = ? WHERE id = ?", ["RUNNING", f"t{i}"]))
        await tx.commit_deferred()
        return d.sent

    assert len(anyio.run(run)) == 1


def _insert_rows(bodies: list[str]) -> list[str]:
    async def run():
        tx, d = _tx()
        await tx.defer_rows(Stmt("INSERT INTO events (id, body) VALUES (?, ?)"),
                            [[i, body] for i, body in enumerate(bodies)])
        await tx.commit_deferred()
        return d.sent

    return anyio.run(run)


def test_a_multi_row_insert_is_cut_by_size():
    sent = _insert_rows([f"{i:02}" + "e" * MIB for i in range(10)])
    assert len(sent) >= 3
    assert all(len(text) <= ROUND_TRIP_BYTES + 64 * 1024 for text in sent)
    assert sum(text.count(f"'{i:02}" + "e" * 16) for text in sent for i in range(10)) == 10


def test_a_large_value_shared_by_every_row_travels_once():
    """It is set once in a session variable, which every row reads."""
    sent = _insert_rows(["e" * MIB] * 10)
    assert len(sent) == 1
    assert sent[0].count("'" + "e" * 16) == 1
    assert sent[0].startswith("SET @orbit_v0 = '")
    assert ";\nINSERT INTO events (id, body) VALUES (0,@orbit_v0),(1,@orbit_v0)," in sent[0]


@pytest.mark.parametrize("value,at_most", [("abc", 3), ("é", 4), ("aé", 8)])
def test_text_bytes_bounds_what_a_statement_takes(value, at_most):
    from orbit.server.store.tx import text_bytes
    assert text_bytes(value) == at_most
