"""The round-trip benchmark in its short form, on SQLite: every figure printed, and the
number of statements a send makes, which on PostgreSQL is most of a send's CPU."""

import re
import subprocess
import sys

from tests.support.processes import ROOT, base_env


def test_short_run_prints_each_cost_and_the_statements_of_a_send():
    result = subprocess.run(
        [sys.executable, "-m", "bench.roundtrips", "--database", "sqlite", "--repeat", "20"],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "SQLite + in-memory sessions" in out
    for what in ("one-row SELECT", "the same in a transaction", "a session read from the cache"):
        assert re.search(rf"{what} +\d+\.\d µs", out), out
    # BEGIN, the conversation under its lock, the admission counts, the usage event, the
    # quota overrides, the tree, both messages, the conversation's update, COMMIT.
    assert re.search(r"a send \(message_send_to\) +\d+\.\d\d ms +\(9 statements", out), out
