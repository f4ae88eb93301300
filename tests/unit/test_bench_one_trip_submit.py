"""bench/one_trip_submit.py: the submit it captures from a trace, and how it replays it."""

from __future__ import annotations

from datetime import datetime

import pytest
from bench.one_trip_submit import captured_submit, clock_of, fresh, fresh_ids, replayed

_NOW = "2026-12-05 17:04:40.930336"
_READS = "SELECT *, NOW(6) AS db_now FROM queues WHERE id = 'q1' LOCK IN SHARE MODE;\nSELECT id FROM credentials"
_WRITES = (
    f"INSERT INTO tasks (id, queue_id, available_at) VALUES ('t1aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','q1','{_NOW}');\n"
    f"INSERT INTO leases (id, task_id, leased_at) VALUES ('l1bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb',"
    f"'t1aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','{_NOW}');\n"
    "INSERT INTO idempotency_records (namespace_id, operation, idem_key, digest) VALUES "
    "('n1','tasks.submit','p-30-fd69b3','d');\n"
    f"INSERT INTO event_batches (batch_id, namespace_id, events) VALUES ('e1cccccccccccccccccccccccccccccc', 'n1', "
    f"'[[\"task.submitted\",\"{_NOW.replace(' ', 'T')}Z\"]]');\n"
    f"INSERT INTO worker_claims (credential_id, msg_id, created_at) VALUES ('c1','m17-57345','{_NOW}');\n"
    "UPDATE queue_usage SET unfinished = unfinished + 1 WHERE queue_id = 'q1'"
)


def _rt(tx: int, start: float, end: float, text: str) -> list:
    return ["rt", tx, start, end, 0.0, 0.0, "shapes", text]


def test_the_last_submit_answered_in_three_round_trips_is_captured_with_its_planning():
    records = [
        _rt(1, 0.0, 1.0, "old reads"), _rt(1, 1.4, 2.0, "old writes"), ["answer", 1, 2.1, 0.0],
        _rt(1, 2.2, 2.9, "COMMIT"),
        _rt(2, 3.0, 3.5, "a claim's own"),  # no answer: not a submit that served a claim
        _rt(3, 4.0, 5.0, _READS), _rt(3, 5.2, 6.0, _WRITES), ["answer", 3, 6.1, 0.0], _rt(3, 6.2, 7.0, "COMMIT"),
        _rt(4, 8.0, 9.0, "reads"), ["answer", 4, 9.1, 0.0], _rt(4, 9.2, 9.5, "COMMIT"),  # two round trips
    ]
    reads, writes, planning = captured_submit(records)
    assert (reads, writes) == (_READS, _WRITES)
    assert planning == pytest.approx((400 + 200) / 2)


def test_without_such_a_submit_nothing_is_captured():
    assert captured_submit([_rt(1, 0.0, 1.0, "reads"), ["answer", 1, 1.1, 0.0], _rt(1, 1.2, 2.0, "COMMIT")]) is None


def test_a_replay_gets_fresh_ids_and_a_later_clock():
    ids = fresh_ids(_WRITES)
    assert ids == ["t1aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "l1bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
                   "e1cccccccccccccccccccccccccccccc", "p-30-fd69b3", "m17-57345"]
    assert clock_of(_WRITES) == _NOW
    later = datetime(2026, 12, 6, 17, 4, 41, 930336)
    renamed = fresh(ids)
    text = replayed(_WRITES, renamed, _NOW, later)
    assert not any(i in text for i in ids)
    assert _NOW not in text and "2026-12-06 17:04:41.930336" in text
    assert '"2026-12-06T17:04:41.930336Z"' in text
    reads = replayed("SELECT digest FROM idempotency_records WHERE idem_key IN ('p-30-fd69b3')", renamed, _NOW, later)
    assert f"'{renamed['p-30-fd69b3']}'" in reads and f"'{renamed['p-30-fd69b3']}'" in text  # one round, one key
    again = replayed(_WRITES, fresh(ids), _NOW, later)
    assert again != text  # every replay its own rows
    assert len(again) == len(text)
