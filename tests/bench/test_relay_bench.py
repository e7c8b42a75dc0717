"""The load script in its short form: many signed-in users streaming at once through one
site process lose, repeat and reorder nothing, and idle streams cost no threads."""

import pytest

from bench import relay

pytestmark = pytest.mark.live


def test_short_load_run_loses_nothing_and_holds_idle_streams_without_threads():
    args = relay.parse_args(["--streams", "30", "--tokens", "15", "--rate", "40", "--idle", "100"])
    rows, idle = relay.run(args)
    relay.report(args, rows, idle)
    for row in rows:
        assert (row["lost"], row["duplicated"], row["out_of_order"], row["errors"]) == (0, 0, 0, 0), row
        assert row["received"] == row["sent"] == 30 * 15
    assert idle["idle_streams"] == 100
    assert idle["threads"] - idle["threads_before"] < 10, "an OS thread per open stream is back"
