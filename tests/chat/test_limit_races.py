"""Per-user limits under simultaneous requests, on real PostgreSQL (where each request's
transaction really runs beside the others; SQLite serialises every write anyway).
Skipped, with the reason, where PostgreSQL is not running."""

import json
import subprocess

import pytest

from tests.support.processes import PYTHON, ROOT, base_env

ROUNDS = 4
ATTEMPTS = 8


@pytest.fixture(scope="module")
def race_env(postgres_url, tmp_path_factory):
    env = base_env(
        DATABASE_URL=postgres_url,
        TOKENSTREAM_VAR_DIR=tmp_path_factory.mktemp("race"),
        DATABASE_POOL_SIZE=ATTEMPTS + 2,
    )
    migrate = subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert migrate.returncode == 0, migrate.stderr
    return env


def race(env: dict, action: str, **limits) -> dict:
    env = {**env, **{name: str(value) for name, value in limits.items()}}
    result = subprocess.run(
        [PYTHON, "-m", "tests.support.limit_race", action, str(ATTEMPTS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["errors"] == []
    return outcome


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_simultaneous_sends_never_exceed_the_streaming_limit(race_env, round_):
    outcome = race(race_env, "send", CHAT_MAX_STREAMING_PER_USER=3, CHAT_MESSAGES_PER_MINUTE=1000)
    assert (outcome["accepted"], outcome["refused"]) == (3, ATTEMPTS - 3)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_simultaneous_sends_never_exceed_the_per_minute_limit(race_env, round_):
    outcome = race(race_env, "send", CHAT_MAX_STREAMING_PER_USER=1000, CHAT_MESSAGES_PER_MINUTE=3)
    assert (outcome["accepted"], outcome["refused"]) == (3, ATTEMPTS - 3)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_simultaneous_regenerates_never_exceed_the_per_minute_limit(race_env, round_):
    outcome = race(
        race_env, "regenerate", CHAT_MAX_STREAMING_PER_USER=1000, CHAT_MESSAGES_PER_MINUTE=3
    )
    assert (outcome["accepted"], outcome["refused"]) == (3, ATTEMPTS - 3)


@pytest.mark.parametrize("round_", range(2))
def test_simultaneous_conversation_creations_never_exceed_the_per_minute_limit(race_env, round_):
    outcome = race(race_env, "create", CHAT_CONVERSATIONS_PER_MINUTE=3)
    assert (outcome["accepted"], outcome["refused"]) == (3, ATTEMPTS - 3)
