"""bench/mariadb_perf.py: `perf script` stacks read back whole and put in the right phase."""

from __future__ import annotations

from bench.mariadb_perf import classify, samples

SCRIPT = """mariadbd 
\t          f14797 [unknown]
\t          ab02a4 Item_func_case_simple::find_item
\t          7cc376 fill_record_n_invoke_before_triggers
\t          90f060 mysql_update
\t          8372bc mysql_execute_command
\t          8395b6 mysql_parse
\t          83bcb5 dispatch_command
\t          83d61f do_command

mariadbd 
\t          a099d5 MYSQLparse
\t          833765 parse_sql
\t          8395b6 mysql_parse+0x1a
\t          83bcb5 dispatch_command

mariadbd 
\t           891f5 start_thread
"""


def test_samples_are_read_leaf_first_with_offsets_dropped() -> None:
    stacks = list(samples(SCRIPT))
    assert len(stacks) == 3
    assert stacks[0][0] == "[unknown]" and stacks[0][-1] == "do_command"
    assert stacks[1][2] == "mysql_parse"


def test_each_sample_gets_the_phase_of_the_statement_it_was_in() -> None:
    first, parse, background = samples(SCRIPT)
    assert classify(first) == "UPDATE: SET values"
    assert classify(parse) == "parse"
    assert classify(background) == "background threads and other"
    # A SELECT runs in a function without a symbol: whatever else mysql_execute_command runs.
    assert classify(["[unknown]", "[unknown]", "mysql_execute_command", "do_command"]) == "SELECT"
    assert classify(["x", "ha_commit_trans", "trans_commit", "mysql_execute_command"]) == "COMMIT"
    assert classify(["row_upd_step", "handler::ha_update_row", "mysql_update", "mysql_execute_command"]) == \
        "UPDATE: row work (InnoDB)"
    assert classify(["my_net_read_packet", "do_command"]) == "protocol and dispatch (network, statement set-up)"
