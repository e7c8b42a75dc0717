"""The round-trip benchmark in its short form, on SQLite: every figure printed, and the
number of statements a send makes, which on PostgreSQL is most of a send's CPU."""

import re

from tests.support.processes import run_bench


def test_short_run_prints_each_cost_and_the_statements_of_a_send():
    out = run_bench("roundtrips", "--database", "sqlite", "--repeat", "20").stdout
    assert "SQLite + in-memory sessions" in out
    for what in ("one-row SELECT", "the same in a transaction", "a session read from the cache"):
        assert re.search(rf"{what} +\d+\.\d µs", out), out
    # BEGIN, the conversation under its lock, the admission counts, the usage event, the
    # quota overrides, the tree, both messages, the conversation's update, COMMIT.
    assert re.search(r"a send \(message_send_to\) +\d+\.\d\d ms +\(9 statements", out), out
