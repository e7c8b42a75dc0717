"""The dashboard benchmark in its short form: it fills a throwaway SQLite database the way
the relay does and times the dashboard, its CSV and the quota check."""

from tests.support.processes import run_bench


def test_short_run_prints_every_timing():
    argv = ("--database", "sqlite", "--users", "5", "--days", "20", "--repeat", "2")
    out = run_bench("usage_dashboard", *argv).stdout
    assert "SQLite: 5 users" in out and "UsageDay rows standing for" in out
    for what in (
        "figures (usage_window)",
        "page /admin/usage/",
        "CSV /admin/usage/usage.csv",
        "quota check at send",
    ):
        assert what in out, out
