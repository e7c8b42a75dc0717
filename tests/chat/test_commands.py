"""The operator commands: warmup, checkstack, prune."""

import datetime
import io
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from chat.models import Conversation, Message
from tests.support.processes import PYTHON, ROOT, base_env, free_port


def run_command(name: str, *args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(name, *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def failing_command(name: str, *args) -> tuple[str, CommandError]:
    out = io.StringIO()
    with pytest.raises(CommandError) as failure:
        call_command(name, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue(), failure.value


@pytest.fixture
def loading_server(settings, fresh_inference_client):
    """An inference server that is up but answers /ready with 503, as while loading."""
    state = {"status": "loading", "error": None}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health"
            body = json.dumps({"status": "ok"} if ok else {**state, "model": "smol"}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.INFERENCE_URLS = [f"http://127.0.0.1:{server.server_port}"]
    yield state
    server.shutdown()
    server.server_close()


# --- warmup ---


def test_warmup_against_a_stopped_inference_server_exits_non_zero_with_a_sentence(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    env = base_env(INFERENCE_URLS=url, TOKENSTREAM_VAR_DIR=tmp_path)

    result = subprocess.run(
        [PYTHON, "manage.py", "warmup", "--timeout", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode != 0
    assert (
        f"The inference server at {url} is not reachable: is `python -m inference` running?"
        in result.stderr
    )


@pytest.mark.live
def test_warmup_against_a_live_server_prints_model_load_state_ttft_and_tokens_per_second(
    live_inference_url,
):
    out, _ = run_command("warmup", "--timeout", "30")

    assert f"{live_inference_url}: ready, model fake" in out
    [figures] = [line for line in out.splitlines() if line.startswith("warm-up reply:")]
    assert "TTFT " in figures and " ms" in figures and "tokens/s" in figures
    assert "tokens/s n/a" not in figures


def test_warmup_gives_up_on_a_server_still_loading_after_the_timeout(loading_server):
    out, error = failing_command("warmup", "--timeout", "0.5")
    assert "is still loading after" in str(error)
    assert out.startswith("waiting for http://127.0.0.1:")


def test_warmup_stops_at_once_when_the_server_failed_to_load(loading_server):
    loading_server.update(status="failed", error="MODEL file not found: /nope.gguf")
    _, error = failing_command("warmup", "--timeout", "60")
    assert "failed to load its model: MODEL file not found: /nope.gguf" in str(error)


def test_warmup_local_prepares_the_model_with_a_progress_bar(monkeypatch, capsys):
    from inference import model_store

    def prepare_model(settings, progress):
        for message in ("loading /models/smol", "loaded in 0.1s"):
            progress(message)
        return model_store.LoadedModel(model=None, tokenizer=None, folder="/models/smol")

    monkeypatch.setenv("ENGINE", "transformers")
    monkeypatch.setenv("MODEL", "/models/smol")
    monkeypatch.setattr(model_store, "prepare_model", prepare_model)

    call_command("warmup", "--local")

    captured = capsys.readouterr()
    assert "model ready in" in captured.out and "/models/smol" in captured.out
    assert "2/2" in captured.err and "loaded in 0.1s" in captured.err


def test_warmup_local_reports_a_missing_model_file(monkeypatch, tmp_path):
    monkeypatch.setenv("ENGINE", "transformers")
    monkeypatch.setenv("MODEL", str(tmp_path / "missing.gguf"))
    _, error = failing_command("warmup", "--local")
    assert "The model could not be prepared: MODEL file not found" in str(error)


# --- checkstack ---


@pytest.mark.django_db
def test_checkstack_reports_a_stopped_inference_server_and_exits_1(stopped_inference_url):
    out, error = failing_command("checkstack")

    lines = out.splitlines()
    assert lines[0].startswith("ok database sqlite ")
    assert lines[1].startswith("ok channel layer InMemoryChannelLayer: send/receive round trip")
    assert lines[2] == f"FAIL inference {stopped_inference_url}: connection refused"
    assert error.returncode == 1
    assert "1 of 3 parts failed" in str(error)


@pytest.mark.django_db
def test_checkstack_reports_a_server_that_is_not_ready(loading_server):
    out, error = failing_command("checkstack")
    assert "healthy but not ready (loading)" in out.splitlines()[-1]
    assert error.returncode == 1


@pytest.mark.django_db
@pytest.mark.live
def test_checkstack_prints_one_ok_line_per_part_when_the_stack_is_up(live_inference_url):
    out, _ = run_command("checkstack")

    lines = out.splitlines()
    assert len(lines) == 3 and all(line.startswith("ok ") for line in lines)
    assert lines[2] == f"ok inference {live_inference_url}: healthy, ready, model fake"


# --- prune ---


def _aged(queryset, days: float) -> None:
    queryset.update(updated_at=timezone.now() - datetime.timedelta(days=days))


@pytest.fixture
def old_and_new_conversations(make_conversation, make_message):
    stale = make_conversation(title="stale")
    make_message(stale, "old question")
    revived = make_conversation(title="old row, recent reply")
    recent_reply = make_message(revived, "new text", role="assistant")
    streaming = make_conversation(title="streaming")
    make_message(streaming, "writing", role="assistant", status="streaming")
    fresh = make_conversation(title="fresh")
    _aged(Message.objects.exclude(pk=recent_reply.pk), days=100)
    _aged(Conversation.objects.exclude(pk=fresh.pk), days=100)
    return stale


def test_prune_dry_run_prints_counts_and_deletes_nothing(old_and_new_conversations):
    before = (Conversation.objects.count(), Message.objects.count())
    out, _ = run_command("prune", "--dry-run", "--conversations-older-than", "30")

    assert "would delete 1 conversations (1 messages) inactive for 30 days" in out
    assert (Conversation.objects.count(), Message.objects.count()) == before


def test_prune_deletes_only_conversations_inactive_for_the_given_days(old_and_new_conversations):
    out, _ = run_command("prune", "--conversations-older-than", "30")

    assert "deleted 1 conversations (1 messages) inactive for 30 days" in out
    assert not Conversation.objects.filter(pk=old_and_new_conversations.pk).exists()
    assert set(Conversation.objects.values_list("title", flat=True)) == {
        "old row, recent reply",
        "streaming",
        "fresh",
    }


def test_prune_refuses_a_conversation_age_under_one_day(db):
    _, error = failing_command("prune", "--conversations-older-than", "0")
    assert "at least 1 day" in str(error)
