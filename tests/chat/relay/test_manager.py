"""The relay in this process, with the fake inference client: what a reply publishes and
saves, without starting daphne or an inference server."""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from chat import services
from chat.models import Message
from chat.relay.manager import relay_manager
from chat.streaming import memory_log
from chat.streaming.channels import channel_for
from tests.support.factories import create_conversation
from tests.support.redis_server import require_redis

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fake_client(settings, fresh_inference_client):
    settings.INFERENCE_CLIENT = "chat.inference_client.fake.FakeInferenceClient"
    settings.FAKE_TOKENS_PER_SECOND = 0
    settings.RELAY_FLUSH_INTERVAL = 0.05
    memory_log.forget_all_channels()


def published(conversation_id) -> list[tuple[str, dict]]:
    events = memory_log.kept_events(channel_for(conversation_id))
    return [(event.type, json.loads(event.data)) for event in events]


async def relayed(reply_id) -> Message:
    """The reply as saved once the relay that a service started for it has ended."""
    for _ in range(200):  # the relay starts on the next loop iteration
        if reply_id in relay_manager.relays:
            break
        await asyncio.sleep(0.01)
    await asyncio.wait_for(relay_manager.relays[reply_id], 10)
    return await Message.objects.aget(pk=reply_id)


async def send_and_relay(conversation, content: str) -> Message:
    """POST a message as the API does, then wait for the relay the service started."""
    relay_manager.ensure_started()
    try:
        sent = await sync_to_async(services.message_send)(
            conversation=conversation, content=content
        )
        return await relayed(sent.assistant_message.id)
    finally:
        await relay_manager.aclose()


def test_a_reply_is_published_token_by_token_and_saved_whole():
    conversation = create_conversation()
    reply = asyncio.run(send_and_relay(conversation, "one two three four"))

    events = published(conversation.id)
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "message.start" and kinds[-1] == "message.end"
    tokens = [data for kind, data in events if kind == "token"]
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    assert "".join(t["text"] for t in tokens) == reply.content == "one two three four"
    assert (reply.status, reply.finish_reason, reply.next_seq) == ("complete", "stop", len(tokens))
    assert events[-1][1]["usage"]["completion_tokens"] == 4


def test_a_reply_cut_by_max_tokens_ends_with_length():
    conversation = create_conversation(max_tokens=2)
    reply = asyncio.run(send_and_relay(conversation, "one two three four"))

    assert (reply.content, reply.finish_reason) == ("one two", "length")
    assert published(conversation.id)[-1][1]["finish_reason"] == "length"


def test_an_unreachable_server_fails_the_reply_with_a_retryable_error(settings):
    settings.INFERENCE_CLIENT = "chat.inference_client.http.HttpInferenceClient"
    settings.INFERENCE_URLS = ["http://127.0.0.1:9"]
    settings.INFERENCE_BUSY_RETRY_SECONDS = 0
    conversation = create_conversation()
    reply = asyncio.run(send_and_relay(conversation, "hello"))

    kind, data = published(conversation.id)[-1]
    assert (reply.status, reply.retryable) == ("failed", True)
    assert kind == "message.error" and data["retryable"] is True and data["error"] == reply.error


def test_stop_ends_the_reply_as_cancelled_keeping_its_text(settings):
    settings.FAKE_TOKENS_PER_SECOND = 50
    conversation = create_conversation()

    async def stop_after_two_tokens():
        relay_manager.ensure_started()
        try:
            sent = await sync_to_async(services.message_send)(
                conversation=conversation, content="a b c d e f g h i j k l m n o p"
            )
            reply = sent.assistant_message
            while len([e for e in published(conversation.id) if e[0] == "token"]) < 2:
                await asyncio.sleep(0.01)
            await sync_to_async(services.reply_stop)(reply=reply)
            await asyncio.wait_for(relay_manager.relays[reply.id], 10)
            return await Message.objects.aget(pk=reply.id)
        finally:
            await relay_manager.aclose()

    reply = asyncio.run(stop_after_two_tokens())
    tokens = [data for kind, data in published(conversation.id) if kind == "token"]
    assert (reply.status, reply.finish_reason) == ("cancelled", "cancelled")
    assert 2 <= len(tokens) < 16
    assert reply.content == "".join(t["text"] for t in tokens)


@pytest.mark.parametrize("how", ["send", "regenerate"])
def test_a_stop_pressed_before_the_relay_listened_still_cancels_the_reply(
    settings, monkeypatch, how
):
    # The relay reads the row's flag once it listens: with the history when a send handed
    # it the reply, with the reply's row otherwise (a regenerate).
    conversation = create_conversation()
    if how == "regenerate":
        first = asyncio.run(send_and_relay(conversation, "one two"))
    settings.FAKE_TOKENS_PER_SECOND = 50
    real_launch = relay_manager.launch

    def launch_after_a_stop(message_id, *known):
        Message.objects.filter(pk=message_id).update(stop_requested=True)
        return real_launch(message_id, *known)

    monkeypatch.setattr(relay_manager, "launch", launch_after_a_stop)

    async def start_and_wait():
        relay_manager.ensure_started()
        try:
            if how == "send":
                sent = await sync_to_async(services.message_send)(
                    conversation=conversation, content="a b c d e f g h"
                )
                reply_id = sent.assistant_message.id
            else:
                old = await Message.objects.select_related("conversation").aget(pk=first.id)
                reply_id = (await sync_to_async(services.reply_regenerate)(reply=old)).id
            return await relayed(reply_id)
        finally:
            await relay_manager.aclose()

    reply = asyncio.run(start_and_wait())
    assert (reply.status, reply.finish_reason) == ("cancelled", "cancelled")
    assert relay_manager.stops.waiting == {}


def test_an_api_reply_that_ended_before_its_reader_tapped_it_still_gives_its_end(settings):
    # The /v1 view taps the reply only once the service returns; a server that refuses at
    # once can end the relay before that. The end's kind (what the API's status comes from)
    # is not in the database.
    settings.INFERENCE_CLIENT = "chat.inference_client.http.HttpInferenceClient"
    settings.INFERENCE_URLS = ["http://127.0.0.1:9"]
    settings.INFERENCE_BUSY_RETRY_SECONDS = 0
    user = create_conversation().owner

    async def end_then_tap():
        relay_manager.ensure_started()
        try:
            sent = await sync_to_async(services.conversation_start_from_api)(
                owner=user, system_prompt="", turns=[("user", "hello")], settings_={}
            )
            reply_id = sent.assistant_message.id
            for _ in range(200):
                if reply_id in relay_manager.relays:
                    break
                await asyncio.sleep(0.01)
            await asyncio.wait_for(relay_manager.relays[reply_id], 10)
            queue = relay_manager.tap(reply_id)
            return queue.get_nowait(), relay_manager.ended
        finally:
            await relay_manager.aclose()

    (kind, payload), ended = asyncio.run(end_then_tap())
    assert kind == "end" and payload["fields"]["status"] == "failed"
    assert payload["kind"] == "unavailable"
    assert ended == {}


def test_with_redis_a_reply_is_published_in_order_and_saved_whole(settings):
    # Token events go to the Redis log in batches from the loop (chat/streaming/delivery.py):
    # seq still counts them from 0, and the saved text and next_seq are what the log holds.
    url = require_redis()
    from chat.streaming import delivery
    from chat.streaming.redis_log import RedisEventStorage

    settings.REDIS_URL = url
    settings.EVENTSTREAM_STORAGE_CLASS = "chat.streaming.redis_log.RedisEventStorage"
    settings.FAKE_TOKENS_PER_SECOND = 200
    conversation = create_conversation()
    log = RedisEventStorage()
    start = log.get_current_id(channel_for(conversation.id))
    words = " ".join(f"w{i}" for i in range(40))
    try:
        reply = asyncio.run(send_and_relay(conversation, words))
    finally:
        delivery.forget_publisher()

    events = [
        (e.type, json.loads(e.data))
        for e in log.get_events(channel_for(conversation.id), start, limit=1000)
    ]
    kinds = [kind for kind, _ in events]
    assert kinds[0] == "message.start" and kinds[-1] == "message.end"
    tokens = [data for kind, data in events if kind == "token"]
    assert [t["seq"] for t in tokens] == list(range(len(tokens)))
    assert "".join(t["text"] for t in tokens) == reply.content == words
    assert (reply.status, reply.next_seq) == ("complete", len(tokens))


def test_replies_hear_stop_through_the_process_group_without_joining_one_each(monkeypatch):
    # A group per reply cost two Redis round trips for every reply (join and leave).
    from channels.layers import get_channel_layer

    from chat.relay.stop import STOP_GROUP

    layer = get_channel_layer()
    joined, left = [], []
    real_add = layer.group_add

    async def group_add(group, channel):
        joined.append(group)
        await real_add(group, channel)

    async def group_discard(group, channel):
        left.append(group)

    monkeypatch.setattr(layer, "group_add", group_add)
    monkeypatch.setattr(layer, "group_discard", group_discard)
    conversation = create_conversation()

    async def two_replies():
        relay_manager.ensure_started()
        try:
            for text in ("one two", "three four"):
                sent = await sync_to_async(services.message_send)(
                    conversation=conversation, content=text
                )
                await relayed(sent.assistant_message.id)
        finally:
            await relay_manager.aclose()

    asyncio.run(two_replies())
    assert joined == [STOP_GROUP] and left == []
