"""The dashboard benchmark in its short form: it fills a throwaway SQLite database the way
the relay does and times the dashboard, its CSV and the quota check."""

import subprocess
import sys

from tests.support.processes import ROOT, base_env


def test_short_run_prints_every_timing():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.usage_dashboard",
            "--database",
            "sqlite",
            "--users",
            "5",
            "--days",
            "20",
            "--repeat",
            "2",
        ],
        cwd=ROOT,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "SQLite: 5 users" in out and "UsageDay rows standing for" in out
    for what in (
        "figures (usage_window)",
        "page /admin/usage/",
        "CSV /admin/usage/usage.csv",
        "quota check at send",
    ):
        assert what in out, out
