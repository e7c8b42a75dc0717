"""The shipped deployment files (deploy/) keep the promises of SECURITY.md."""

import re

from tests.support.processes import ROOT

DEPLOY = ROOT / "deploy"


def env_file() -> dict[str, str]:
    lines = (DEPLOY / "tokenstream.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


def test_nginx_sets_the_forwarded_address_instead_of_appending_the_clients_own():
    conf = (DEPLOY / "nginx.conf").read_text()
    settings_of_the_header = re.findall(
        r"^\s*proxy_set_header\s+X-Forwarded-For\s+(\S+);", conf, re.M
    )
    assert settings_of_the_header and set(settings_of_the_header) == {"$remote_addr"}


def test_the_site_trusts_only_the_local_proxy_and_daphne_ignores_proxy_headers():
    assert env_file()["TOKENSTREAM_TRUSTED_PROXIES"] == "127.0.0.1,::1"
    unit = (DEPLOY / "tokenstream-site@.service").read_text()
    assert "--proxy-headers" not in unit.replace("# No --proxy-headers", "")


def test_env_file_values_carry_no_trailing_comments():
    """systemd's EnvironmentFile keeps a trailing `# …` as part of the value."""
    assert not [name for name, value in env_file().items() if "#" in value]


def test_the_site_unit_raises_the_open_file_limit():
    unit = (DEPLOY / "tokenstream-site@.service").read_text()
    limit = re.search(r"^LimitNOFILE=(\d+)$", unit, re.M)
    assert limit and int(limit.group(1)) >= 65536


def test_nginx_limits_open_event_streams_per_client():
    conf = (DEPLOY / "nginx.conf").read_text()
    assert re.search(r"^limit_conn_zone \$binary_remote_addr zone=(\w+):", conf, re.M)
    events = conf[conf.index("location /events/") :]
    assert re.search(r"limit_conn \w+ \d+;", events[: events.index("}")])
