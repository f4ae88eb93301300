"""Counter changes of a transaction (store/queries/usage.py), before any SQL runs."""

from orbit.server.store.queries.usage import UsageChanges


def test_changes_add_up_per_row_and_an_application_counts_only_when_named():
    u = UsageChanges()
    u.add("q1", "a", permits_in_use=1, rate_reserved=1)
    u.add("q1", "a", permits_in_use=1, rate_reserved=1)
    u.add("q1", None, rate_reserved=-1)
    u.add("q2", "a", unfinished=-1)
    assert u.queues["q1"].items() == [("permits_in_use", 2), ("rate_reserved", 1)]
    assert u.queues["q2"].items() == [("unfinished", -1)]
    assert u.apps["a"].items() == [("unfinished", -1), ("permits_in_use", 2), ("rate_reserved", 2)]


def test_a_counter_added_by_a_migration_is_counted_by_its_column_name():
    u = UsageChanges()
    u.add("q", None, leased_not_started=2, unfinished=1)
    u.add("q", None, leased_not_started=-1)
    assert u.queues["q"].items() == [("unfinished", 1), ("leased_not_started", 1)]
    assert "q" not in u.apps


def test_merge_adds_another_transactions_plan():
    a, b = UsageChanges(), UsageChanges()
    a.add("q", "app", permits_in_use=1)
    b.add("q", "app", permits_in_use=2, extra=3)
    b.set_window("q", None, 4)
    a.merge(b)
    assert a.queues["q"].items() == [("permits_in_use", 3), ("extra", 3)]
    assert a.apps["app"].items() == [("permits_in_use", 3), ("extra", 3)]
    assert a.windows == {("queue", "q"): (None, 4)}


def test_counters_that_cancel_out_write_nothing():
    u = UsageChanges()
    u.add("q", "a", unfinished=1)
    u.add("q", "a", unfinished=-1)
    assert u.queues["q"].items() == [] and u.apps["a"].items() == []


def test_throughput_counters_count_on_the_queues_row_only():
    u = UsageChanges()
    u.add("q", "a", permits_in_use=-1, unfinished=-1)
    u.count_started("q")
    u.count_ended("q", "SUCCEEDED")
    u.count_ended("q", "FAILED")
    u.count_ended("q", "FAILED")
    u.count_ended("q", "CANCELLED")  # no counter of its own
    u.count_queue("q2", started_total=2)
    assert u.queues["q"].items() == [("unfinished", -1), ("permits_in_use", -1), ("failed_total", 2),
                                     ("started_total", 1), ("succeeded_total", 1)]
    assert u.apps["a"].items() == [("unfinished", -1), ("permits_in_use", -1)]
    assert u.queues["q2"].items() == [("started_total", 2)] and "q2" not in u.apps
    u.count_ended("q3", "CANCELLED")
    assert "q3" not in u.queues  # nothing to write
