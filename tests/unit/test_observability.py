"""The pieces of metrics and logs that need no database: the loop histogram's buckets, and
tracebacks with database errors' messages withheld."""

from __future__ import annotations

import sqlite3

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orbit.cli.logs import safe_traceback
from orbit.server.services.metrics import LoopHistogram


def test_loop_histogram_buckets_are_cumulative_and_inclusive():
    registry = CollectorRegistry()
    h = LoopHistogram("t_seconds", "test", (0.1, 1, 10), ["kind"], registry=registry)
    series = h.child("a")
    for v in (0.05, 0.1, 0.5, 1, 20):
        h.observe(series, v)
    (family,) = text_string_to_metric_families(generate_latest(registry).decode())
    got = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert family.type == "histogram"
    assert [got[("t_seconds_bucket", le)] for le in ("0.1", "1.0", "10.0", "+Inf")] == [2, 4, 4, 5]
    assert got[("t_seconds_count", None)] == 5 and abs(got[("t_seconds_sum", None)] - 21.65) < 1e-9


def _raise_chained(marker: str) -> BaseException:
    try:
        try:
            sqlite3.connect(":memory:").execute(f"SELECT * FROM WHERE x = '{marker}'")
        except sqlite3.Error as exc:
            raise RuntimeError(f"wrapping, not data: {marker[:4]}") from exc
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


def test_tracebacks_withhold_database_messages_only():
    exc = _raise_chained("MARKER-xyz")
    text = safe_traceback(exc)
    assert "MARKER-xyz" not in text
    assert "sqlite3.OperationalError: [message withheld" in text and "code=1" in text
    assert "RuntimeError: wrapping, not data: MARK" in text
    assert "The above exception was the direct cause" in text
    assert text.index("sqlite3.OperationalError") < text.index("RuntimeError")  # oldest first, as Python prints
