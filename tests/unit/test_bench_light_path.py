"""bench/light_path.py: a submit's trace is followed to its task's Start, step by step."""

from __future__ import annotations

import pytest
from bench._light_trace import shape
from bench.light_path import steps

_MS = 0.001


def _rt(tx: int, start_ms: float, end_ms: float, cpu_ms: float, shapes: str) -> list:
    return ["rt", tx, start_ms * _MS, end_ms * _MS, 0.0, cpu_ms * _MS, shapes]


def test_a_submit_is_followed_to_its_start():
    submit, start, other = 1, 2, 3
    records = [
        _rt(submit, 0.0, 1.0, 0.3, "| SELECT:queues SELECT:idempotency_records SELECT:credentials"),
        _rt(submit, 1.5, 2.5, 0.1, "INSERT:tasks INSERT:leases | SELECT:queue_usage"),
        ["answer", submit, 2.6 * _MS],
        _rt(submit, 2.7, 3.4, 0.2, "| COMMIT:?"),
        _rt(other, 2.8, 2.9, 0.1, "| SELECT:queues SELECT:queue_usage SELECT:queue_nodes"),  # a poll
        ["start", 3.1 * _MS],
        _rt(start, 3.3, 4.0, 0.4, "| SELECT:tasks SELECT:leases SELECT:queues"),
        _rt(start, 4.2, 4.9, 0.2, "UPDATE:tasks INSERT:event_batches | COMMIT:?"),
    ]
    found = {name: values[0] for name, values in steps(records).items()}
    assert found["submit: reads"] == pytest.approx((1.0, 0.3))
    assert found["submit: planning"][0] == pytest.approx(0.5)
    assert found["submit: writes"] == pytest.approx((1.0, 0.1))
    assert found["answer -> Start frame"][0] == pytest.approx(0.5)
    assert found["Start frame -> its reads"][0] == pytest.approx(0.2)
    assert found["Start: locks"] == pytest.approx((0.7, 0.4))
    assert found["Start: planning"][0] == pytest.approx(0.2)
    assert found["Start: COMMIT"] == pytest.approx((0.7, 0.2))
    assert found["(submit: COMMIT)"][0] == pytest.approx(0.7)
    assert found["submit reads sent -> Start COMMIT answered"][0] == pytest.approx(4.9)


def test_a_submit_whose_start_was_not_traced_is_left_out():
    records = [
        _rt(1, 0.0, 1.0, 0.3, "| SELECT:queues"),
        _rt(1, 1.5, 2.5, 0.1, "INSERT:tasks |"),
        ["answer", 1, 2.6 * _MS],
        _rt(1, 2.7, 3.4, 0.2, "| COMMIT:?"),
    ]
    assert steps(records) == {}


def test_a_statement_is_named_by_its_verb_and_first_table():
    assert shape("SELECT *, NOW(6) AS db_now FROM queues WHERE id = 'q'") == "SELECT:queues"
    assert shape("INSERT INTO tasks (id) VALUES ('t')") == "INSERT:tasks"
    assert shape("UPDATE leases SET expires_at = NOW(6)") == "UPDATE:leases"
    assert shape("COMMIT") == "COMMIT:?"
