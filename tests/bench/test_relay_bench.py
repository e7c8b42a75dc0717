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


def test_a_site_that_fails_to_start_leaves_no_inference_server_running(monkeypatch):
    from bench.relay import runner

    started = []

    class Recorded(runner.InferenceServer):
        def start(self, *args, **kwargs):
            started.append(self)
            return super().start(*args, **kwargs)

    def failing_start(self, migrate=True):
        raise RuntimeError("manage.py migrate --noinput failed")

    monkeypatch.setattr(runner, "InferenceServer", Recorded)
    monkeypatch.setattr(runner.SiteServer, "start", failing_start)
    args = relay.parse_args(["--streams", "1", "--tokens", "1", "--sends", "0", "--idle", "0"])
    with pytest.raises(RuntimeError, match="migrate"):
        relay.run(args)
    (inference,) = started
    assert inference.process.popen.poll() is not None
