"""Token accounting (UsageDay rows written as replies end) and quotas (checked at send time),
in this process: the relay with the fake inference client, the API through Django's test
client."""

import asyncio
import datetime
import json

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone

from chat import services, usage
from chat.inference_client import Finish
from chat.inference_client.fake import FakeInferenceClient
from chat.models import Message, TokenQuota, UsageDay
from chat.relay import saving
from chat.relay.manager import relay_manager
from chat.usage import ReplyUsage, usage_record
from tests.support.factories import create_conversation, create_message, create_user


class NoUsageClient(FakeInferenceClient):
    """A server that reports no usage (like some other engines): the site counts."""

    async def stream_chat(self, request, on_delta=None):
        async for item in super().stream_chat(request):
            yield Finish(item.reason, {}) if isinstance(item, Finish) else item


def rows(user) -> list[dict]:
    return list(UsageDay.objects.filter(user=user).values())


async def relay_reply(conversation, content: str, *, stop_after: int | None = None) -> Message:
    """Send as the API does and wait for the reply's relay to end (Stop after some tokens)."""
    relay_manager.ensure_started()
    try:
        sent = await sync_to_async(services.message_send)(
            conversation=conversation, content=content
        )
        reply = sent.assistant_message
        while reply.id not in relay_manager.relays:
            await asyncio.sleep(0.01)
        if stop_after is not None:
            queue = relay_manager.tap(reply.id)
            tokens = 0
            while tokens < stop_after:
                kind, _ = await queue.get()
                tokens += kind == "token"
            await sync_to_async(services.reply_stop)(reply=reply)
        await asyncio.wait_for(relay_manager.relays[reply.id], 10)
        return await Message.objects.aget(pk=reply.id)
    finally:
        await relay_manager.aclose()


@pytest.mark.django_db(transaction=True)
class TestAccounting:
    @pytest.fixture(autouse=True)
    def fake_client(self, settings, fresh_inference_client):
        settings.INFERENCE_CLIENT = "chat.inference_client.fake.FakeInferenceClient"
        settings.FAKE_TOKENS_PER_SECOND = 0
        settings.RELAY_FLUSH_INTERVAL = 0.05

    def test_a_complete_reply_adds_its_tokens_to_the_users_day(self):
        conversation = create_conversation()
        reply = asyncio.run(relay_reply(conversation, "one two three four"))
        [row] = rows(conversation.owner)
        assert (row["day"], row["model"], row["source"]) == (
            timezone.localdate(),
            "fake-echo",
            "page",
        )
        assert (row["prompt_tokens"], row["completion_tokens"]) == (reply.prompt_tokens, 4)
        assert (row["replies"], row["failures"], row["cancellations"]) == (1, 0, 0)
        assert row["ttft_count"] == 1 and sum(row[f] for f in usage.TTFT_BUCKET_FIELDS) == 1

    def test_replies_of_one_day_and_model_add_up_in_one_row(self):
        conversation = create_conversation()
        asyncio.run(relay_reply(conversation, "one two"))
        asyncio.run(relay_reply(conversation, "three four five"))
        [row] = rows(conversation.owner)
        assert (row["replies"], row["completion_tokens"]) == (2, 5)

    def test_a_cancelled_reply_counts_what_it_used(self, settings):
        settings.FAKE_TOKENS_PER_SECOND = 50
        conversation = create_conversation()
        reply = asyncio.run(relay_reply(conversation, " ".join("w" * 40), stop_after=2))
        [row] = rows(conversation.owner)
        assert reply.status == "cancelled"
        assert row["cancellations"] == 1 and row["replies"] == 1
        assert 2 <= row["completion_tokens"] == reply.completion_tokens < 40
        # Stopped before the server's usage chunk: the prompt is the site's estimate.
        assert row["prompt_tokens"] == reply.prompt_tokens > 0

    def test_a_reply_that_failed_before_any_text_counts_as_a_failure_without_tokens(self, settings):
        settings.INFERENCE_CLIENT = "chat.inference_client.http.HttpInferenceClient"
        settings.INFERENCE_URLS = ["http://127.0.0.1:9"]
        settings.INFERENCE_BUSY_RETRY_SECONDS = 0
        conversation = create_conversation()
        reply = asyncio.run(relay_reply(conversation, "hello"))
        [row] = rows(conversation.owner)
        assert reply.status == "failed"
        assert (
            row["replies"],
            row["failures"],
            row["prompt_tokens"],
            row["completion_tokens"],
        ) == (1, 1, 0, 0)
        assert row["ttft_count"] == 0

    def test_without_the_servers_usage_tokens_are_counted_by_the_site(self, settings):
        settings.INFERENCE_CLIENT = "tests.chat.test_usage.NoUsageClient"
        conversation = create_conversation(system_prompt="Be brief and kind, always.")
        reply = asyncio.run(relay_reply(conversation, "one two three"))
        [row] = rows(conversation.owner)
        assert row["completion_tokens"] == 3  # one per text delta
        assert row["prompt_tokens"] == reply.prompt_tokens > 3  # estimated: system + question

    def test_usage_survives_a_restart_because_it_is_in_the_database(self):
        conversation = create_conversation()
        asyncio.run(relay_reply(conversation, "one two"))
        asyncio.run(relay_manager.aclose())
        assert usage.user_usage(user=conversation.owner)["today"]["completion_tokens"] == 2


@pytest.mark.django_db
class TestRecording:
    def test_a_retried_final_save_counts_the_reply_once(self):
        reply = create_message(role="assistant", content="", status="streaming")
        user = reply.conversation.owner
        fields = {"status": "complete", "content": "hi", "completion_tokens": 1, "prompt_tokens": 5}
        entry = ReplyUsage(
            user_id=user.id,
            source="page",
            model="m",
            status="complete",
            prompt_tokens=5,
            completion_tokens=1,
        )
        saving.reply_finish(message_id=reply.id, fields=fields, usage=entry)
        saving.reply_finish(message_id=reply.id, fields=fields, usage=entry)
        assert [(r["replies"], r["prompt_tokens"]) for r in rows(user)] == [(1, 5)]

    def test_a_reply_whose_conversation_was_deleted_still_counts(self):
        user = create_user()
        entry = ReplyUsage(
            user_id=user.id, source="api", model="m", status="cancelled", completion_tokens=7
        )
        saving.reply_finish(
            message_id="00000000-0000-0000-0000-000000000000", fields={}, usage=entry
        )
        assert [(r["source"], r["cancellations"], r["completion_tokens"]) for r in rows(user)] == [
            ("api", 1, 7)
        ]

    def test_the_sweeper_counts_an_interrupted_reply_from_its_saved_text(self):
        conversation = create_conversation()
        question = create_message(conversation, content="tell me a story please")
        reply = create_message(
            conversation,
            content="x" * 30,
            role="assistant",
            status="streaming",
            reply_to=question,
            model="m",
        )
        Message.objects.filter(pk=reply.pk).update(
            updated_at=timezone.now() - datetime.timedelta(minutes=5)
        )
        saving.replies_interrupt_orphans(stale_after=15, exclude=set())
        [row] = rows(conversation.owner)
        assert (row["failures"], row["completion_tokens"]) == (1, 10)
        assert row["prompt_tokens"] > 0

    def test_ttft_and_decode_speed_are_kept_as_sums_and_a_histogram(self):
        user = create_user()
        for ttft in (40, 120, 120, 900):
            usage_record(
                usage=ReplyUsage(
                    user_id=user.id,
                    source="page",
                    model="m",
                    status="complete",
                    completion_tokens=11,
                    ttft_ms=ttft,
                    duration_ms=ttft + 1000,
                )
            )
        [row] = rows(user)
        assert (row["ttft_count"], row["ttft_ms_total"]) == (4, 1180)
        assert (row["ttft_le_50"], row["ttft_le_200"], row["ttft_le_1000"]) == (1, 2, 1)
        assert (row["decode_tokens"], row["decode_ms"]) == (40, 4000)  # 10 tokens/s


# --- quotas --------------------------------------------------------------------------


@pytest.fixture
def user(db):
    return create_user()


@pytest.fixture
def api(user):
    client = Client()
    client.force_login(user)
    return client


def used(user, tokens: int, *, days_ago: int = 0) -> None:
    day = timezone.localdate() - datetime.timedelta(days=days_ago)
    usage_record(
        usage=ReplyUsage(
            user_id=user.id,
            source="page",
            model="m",
            status="complete",
            prompt_tokens=tokens // 2,
            completion_tokens=tokens - tokens // 2,
        ),
        day=day,
    )


def send(api, user):
    conversation = create_conversation(owner=user)
    return api.post(
        f"/api/conversations/{conversation.id}/messages/",
        data=json.dumps({"content": "hello"}),
        content_type="application/json",
    )


@pytest.mark.django_db
class TestQuotas:
    def test_without_quotas_nothing_is_refused(self, api, user):
        used(user, 10**9)
        assert send(api, user).status_code == 202

    def test_past_the_daily_quota_a_send_is_429_saying_when_it_resets(self, api, user, settings):
        settings.CHAT_DAILY_TOKEN_QUOTA = 100
        used(user, 99)
        assert send(api, user).status_code == 202
        used(user, 1)
        response = send(api, user)
        tomorrow = timezone.localdate() + datetime.timedelta(days=1)
        assert response.status_code == 429
        message = response.json()["error"]["message"]
        assert "daily quota of 100 tokens" in message
        assert f"resets at {tomorrow:%Y-%m-%d} 00:00 UTC" in message
        assert 0 < int(response["Retry-After"]) <= 86400

    def test_the_monthly_quota_counts_earlier_days_of_the_month(self, api, user, settings):
        settings.CHAT_MONTHLY_TOKEN_QUOTA = 100
        settings.CHAT_DAILY_TOKEN_QUOTA = 1000
        today = timezone.localdate()
        used(user, 100, days_ago=1 if today.day > 1 else 0)
        response = send(api, user)
        assert response.status_code == 429
        assert "monthly quota of 100 tokens" in response.json()["error"]["message"]

    def test_last_months_usage_does_not_count(self, api, user, settings):
        settings.CHAT_MONTHLY_TOKEN_QUOTA = 100
        used(user, 500, days_ago=timezone.localdate().day)  # the last day of last month
        assert send(api, user).status_code == 202

    def test_regenerate_is_refused_past_a_quota_too(self, api, user, settings):
        settings.CHAT_DAILY_TOKEN_QUOTA = 10
        conversation = create_conversation(owner=user)
        question = create_message(conversation, content="hi")
        reply = create_message(conversation, content="yo", role="assistant", reply_to=question)
        used(user, 10)
        response = api.post(f"/api/messages/{reply.id}/regenerate/")
        assert response.status_code == 429 and "daily quota" in response.json()["error"]["message"]

    def test_a_users_own_quota_overrides_the_site_and_0_means_none(self, api, user, settings):
        settings.CHAT_DAILY_TOKEN_QUOTA = 10
        used(user, 50)
        TokenQuota.objects.create(user=user, daily_tokens=0)
        assert send(api, user).status_code == 202
        TokenQuota.objects.filter(user=user).update(daily_tokens=40)
        assert send(api, user).status_code == 429

    def test_the_most_generous_group_applies_unless_the_user_has_their_own(self, user, settings):
        settings.CHAT_DAILY_TOKEN_QUOTA = 10
        for name, tokens in (("interns", 100), ("research", 5000)):
            group = Group.objects.create(name=name)
            group.user_set.add(user)
            TokenQuota.objects.create(group=group, daily_tokens=tokens)
        daily, monthly = usage.user_limits(user=user)
        assert (daily.tokens, daily.set_by) == (5000, "group")
        assert (monthly.tokens, monthly.set_by) == (None, "site")
        TokenQuota.objects.create(user=user, daily_tokens=20)
        assert usage.user_limits(user=user)[0] == usage.Limit("daily", 20, "user")


@pytest.mark.django_db
class TestUsageEndpoint:
    def test_shows_today_the_month_and_the_quotas_with_their_resets(self, api, user, settings):
        settings.CHAT_DAILY_TOKEN_QUOTA = 1000
        used(user, 30)
        used(user, 70)
        if timezone.localdate().day > 1:
            used(user, 400, days_ago=1)
        data = api.get("/api/usage/").json()
        assert data["today"] == {
            "prompt_tokens": 50,
            "completion_tokens": 50,
            "total_tokens": 100,
            "replies": 2,
        }
        month_total = 500 if timezone.localdate().day > 1 else 100
        assert data["month"]["total_tokens"] == month_total
        daily = data["quota"]["daily"]
        tomorrow = timezone.localdate() + datetime.timedelta(days=1)
        assert (daily["limit"], daily["used"], daily["remaining"], daily["set_by"]) == (
            1000,
            100,
            900,
            "site",
        )
        assert daily["resets_at"] == f"{tomorrow:%Y-%m-%d}T00:00:00+00:00"
        monthly = data["quota"]["monthly"]
        assert (monthly["limit"], monthly["remaining"]) == (None, None)
        assert monthly["resets_at"].endswith("-01T00:00:00+00:00")

    def test_shows_only_the_users_own_usage(self, api, user):
        used(create_user(), 1000)
        assert api.get("/api/usage/").json()["today"]["total_tokens"] == 0

    def test_needs_sign_in(self, db):
        assert Client().get("/api/usage/").status_code == 401


def test_resets_at_the_turn_of_a_year():
    now = datetime.datetime(2026, 12, 31, 22, 0, tzinfo=datetime.UTC)
    assert usage.resets_at("monthly", now) == datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC)
    assert usage.resets_at("daily", now) == datetime.datetime(2027, 1, 1, tzinfo=datetime.UTC)
