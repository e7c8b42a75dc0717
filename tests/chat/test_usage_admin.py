"""The operator's side: /admin/usage/ (figures, CSV, live servers), quota overrides and API
keys in the admin."""

import csv
import datetime
import io

import pytest
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone

from chat import dashboard, keys
from chat.models import ApiKey, TokenQuota
from chat.usage import ReplyUsage, usage_record
from tests.support.factories import create_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff():
    return create_user("operator", is_staff=True, is_superuser=True)


@pytest.fixture
def admin_client(staff):
    client = Client()
    client.force_login(staff)
    return client


def record(
    user,
    *,
    days_ago=0,
    model="m1",
    source="page",
    status="complete",
    prompt=10,
    completion=20,
    ttft=300,
    duration=2300,
):
    usage_record(
        usage=ReplyUsage(
            user_id=user.id,
            source=source,
            model=model,
            status=status,
            prompt_tokens=prompt,
            completion_tokens=completion,
            ttft_ms=ttft,
            duration_ms=duration,
        ),
        day=timezone.localdate() - datetime.timedelta(days=days_ago),
    )


@pytest.fixture
def history():
    alice, bob = create_user("alice"), create_user("bob")
    for days_ago in range(40):  # ten days fall outside the window
        record(alice, days_ago=days_ago)
    record(bob, model="m2", source="api", prompt=500, completion=500, ttft=1800)
    record(bob, model="m2", status="failed", prompt=0, completion=0, ttft=None)
    record(bob, model="m2", status="cancelled", prompt=5, completion=3, ttft=90, duration=400)
    return alice, bob


def test_the_window_sums_days_users_and_models(history):
    window = dashboard.usage_window()
    assert len(window["days"]) == 30 and window["days"][-1].label == str(timezone.localdate())
    today = window["days"][-1]
    assert (today.replies, today.failures, today.cancellations) == (4, 1, 1)
    assert [(u.label, u.total_tokens) for u in window["users"]] == [("bob", 1008), ("alice", 900)]
    assert [m.label for m in window["models"]] == ["m2", "m1"]
    total = window["total"]
    assert (total.replies, total.prompt_tokens) == (33, 300 + 505)
    assert window["active_users"] == 2 and window["sources"]["api"].replies == 1
    # 30 first tokens at 300 ms, one at 90, one at 1800: both percentiles in the 300 bucket,
    # but bob's model alone has its p95 in the 2000 one.
    assert 200 < total.ttft_p50_ms <= total.ttft_p95_ms <= 300
    assert 1500 < window["models"][0].ttft_p95_ms <= 2000
    assert total.tokens_per_second == pytest.approx((30 * 19 + 499 + 2) / (30 * 2 + 0.5 + 0.31))


def test_percentiles_interpolate_within_a_bucket_and_stop_at_the_open_one():
    sums = {"ttft_le_100": 10}
    assert dashboard.ttft_percentile(sums, 0.5) == pytest.approx(75)
    assert dashboard.ttft_percentile({"ttft_slower": 3}, 0.95) == 60000
    assert dashboard.ttft_percentile({}, 0.5) is None


def test_the_dashboard_is_for_staff_only(history):
    user = create_user()
    client = Client()
    client.force_login(user)
    for path in ("/admin/usage/", "/admin/usage/usage.csv", "/admin/usage/servers.json"):
        response = client.get(path)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_the_dashboard_shows_the_figures(admin_client, history, django_assert_max_num_queries):
    with django_assert_max_num_queries(12):
        response = admin_client.get("/admin/usage/")
    assert response.status_code == 200
    html = response.content.decode()
    for expected in (
        'id="chart-tokens"',
        'id="chart-replies"',
        'id="usage-users"',
        'id="usage-models"',
        'id="usage-servers"',
        "alice",
        "bob",
        "m2",
        "Download CSV",
        "1,908",
    ):
        assert expected in html, expected


def test_the_csv_has_the_same_figures(admin_client, history):
    response = admin_client.get("/admin/usage/usage.csv")
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    sections = [row["section"] for row in rows]
    assert sections.count("day") == 30 and sections.count("total") == 1
    total = next(row for row in rows if row["section"] == "total")
    assert (total["replies"], total["total_tokens"], total["failures"]) == ("33", "1908", "1")
    bob = next(row for row in rows if row["name"] == "bob")
    assert (bob["prompt_tokens"], bob["cancellations"]) == ("505", "1")


def test_servers_show_ready_queue_and_running_from_their_metrics(
    admin_client, settings, running_inference
):
    down = "http://127.0.0.1:9"
    settings.INFERENCE_URLS = [running_inference.url, down]
    servers = admin_client.get("/admin/usage/servers.json").json()["servers"]
    up, gone = servers
    assert (up["ready"], up["status"], up["model"]) == (True, "ready", "fake")
    assert (up["queue"], up["running"]) == (0, 0)
    assert (gone["reachable"], gone["ready"], gone["queue"]) == (False, False, None)


def test_quota_overrides_are_edited_on_the_user_and_the_group(admin_client):
    user = create_user("carol")
    page = admin_client.get(f"/admin/auth/user/{user.id}/change/").content.decode()
    assert "token quota override" in page.lower() and "API keys" in page
    group = Group.objects.create(name="team")
    assert (
        "token_quota" in admin_client.get(f"/admin/auth/group/{group.id}/change/").content.decode()
    )
    TokenQuota.objects.create(group=group, daily_tokens=100)
    assert admin_client.get("/admin/chat/tokenquota/").status_code == 200


def test_staff_can_revoke_a_key_but_never_see_its_secret(admin_client):
    key, secret = keys.api_key_create(user=create_user("dave"), name="ci")
    listing = admin_client.get("/admin/chat/apikey/").content.decode()
    assert key.prefix in listing and secret not in listing
    assert (
        key.key_hash
        not in admin_client.get(f"/admin/chat/apikey/{key.id}/change/").content.decode()
    )
    admin_client.post(
        "/admin/chat/apikey/", {"action": "revoke", "_selected_action": [str(key.id)]}
    )
    assert ApiKey.objects.get(pk=key.id).revoked_at is not None


def test_api_conversations_are_marked_in_the_admin_list(admin_client):
    from chat.models import Conversation

    Conversation.objects.create(owner=create_user("erin"), title="from a script", source="api")
    page = admin_client.get("/admin/chat/conversation/?source__exact=api").content.decode()
    assert "from a script" in page
