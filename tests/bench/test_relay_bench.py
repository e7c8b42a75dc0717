"""The load script in its short form: many signed-in users streaming at once through one
site process lose, repeat and reorder nothing, idle streams cost no threads, and streams
dropped mid-reply resume exactly where they were."""

import pytest

from bench import relay

pytestmark = pytest.mark.live


def test_short_load_run_loses_nothing_and_holds_idle_streams_without_threads():
    args = relay.parse_args(
        [
            "--streams",
            "30",
            "--tokens",
            "15",
            "--rate",
            "40",
            "--idle",
            "100",
            "--sends",
            "20",
            "--reconnect",
            "40",
        ]
    )
    out = relay.run(args)
    relay.report(args, out)
    for row in out["rows"]:
        assert (row["lost"], row["duplicated"], row["out_of_order"], row["errors"]) == (
            0,
            0,
            0,
            0,
        ), row
        assert row["received"] == row["sent"] == 30 * 15
    assert out["sends"]["accepted"] == 20
    storm = out["reconnect"]
    assert storm["resumed"] == 40
    assert (storm["lost"], storm["duplicated"], storm["out_of_order"], storm["errors"]) == (
        0,
        0,
        0,
        0,
    )
    idle = out["idle"]
    assert idle["idle_streams"] == 100
    assert idle["threads"] - idle["threads_before"] < 10, "an OS thread per open stream is back"
