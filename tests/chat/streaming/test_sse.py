"""The event stream endpoint as an ASGI app in this process: who may subscribe, what a
subscriber receives, and exact resumption with Last-Event-ID."""

import asyncio

import pytest
from django.contrib.auth.models import AnonymousUser

from chat.streaming import memory_log, sse
from chat.streaming.channels import channel_for
from chat.streaming.eventstream import id_prefix
from chat.streaming.publish import publish_on_loop
from chat.streaming.sse import ConversationEvents, KeepServerSend
from tests.support.factories import create_conversation, create_user
from tests.support.sse import parse_sse_block

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_log():
    memory_log.forget_all_channels()


class Subscriber:
    """Drives one request to the endpoint: collects what it sends until told to leave."""

    def __init__(self, user, conversation_id, last_event_id: str | None = None):
        headers = [(b"last-event-id", last_event_id.encode())] if last_event_id else []
        self.scope = {
            "type": "http",
            "user": user,
            "headers": headers,
            "query_string": b"",
            "url_route": {"kwargs": {"conversation_id": conversation_id}},
        }
        self.status: int | None = None
        self.body = ""
        self.gone = asyncio.Event()

    async def receive(self):
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.body += message.get("body", b"").decode()

    def events(self):
        blocks = (parse_sse_block(b) for b in self.body.split("\n\n"))
        return [e for e in blocks if e is not None and e.event != "stream-open"]

    async def run_while(self, action):
        self.open()
        await asyncio.sleep(0.05)
        await action()
        await asyncio.sleep(0.05)
        await self.leave()

    def open(self) -> None:
        self.task = asyncio.ensure_future(ConversationEvents()(self.scope, self.receive, self.send))

    async def leave(self) -> None:
        self.gone.set()
        await asyncio.wait_for(self.task, 5)

    async def attempt(self) -> int:
        """Opens a stream the endpoint is expected to refuse at once; returns the status."""
        await asyncio.wait_for(ConversationEvents()(self.scope, self.receive, self.send), 2)
        return self.status


async def nothing():
    return None


def publish_tokens(conversation_id, texts):
    async def action():
        for seq, text in enumerate(texts):
            publish_on_loop(conversation_id, "token", {"message_id": "m", "seq": seq, "text": text})

    return action


def test_the_owner_receives_events_published_while_subscribed():
    conversation = create_conversation()
    subscriber = Subscriber(conversation.owner, conversation.id)
    asyncio.run(subscriber.run_while(publish_tokens(conversation.id, ["a", "b", "c"])))

    assert subscriber.status == 200
    assert [e.json["text"] for e in subscriber.events()] == ["a", "b", "c"]


@pytest.mark.parametrize("who, status", [("anonymous", 403), ("stranger", 404)])
def test_nobody_else_may_subscribe(who, status):
    conversation = create_conversation()
    user = AnonymousUser() if who == "anonymous" else create_user()
    subscriber = Subscriber(user, conversation.id)
    asyncio.run(subscriber.run_while(publish_tokens(conversation.id, ["secret"])))

    assert subscriber.status == status and "secret" not in subscriber.body


def test_a_resumed_stream_gets_exactly_the_events_it_missed():
    conversation = create_conversation()
    first = Subscriber(conversation.owner, conversation.id)
    asyncio.run(first.run_while(publish_tokens(conversation.id, ["a", "b"])))
    last_id = first.events()[-1].id
    later = [{"message_id": "m", "seq": 2 + i, "text": t} for i, t in enumerate(["c", "d"])]
    for data in later:  # published while nobody listened
        publish_on_loop(conversation.id, "token", data)

    second = Subscriber(conversation.owner, conversation.id, last_event_id=last_id)
    asyncio.run(second.run_while(nothing))

    assert [e.json["text"] for e in second.events()] == ["c", "d"]


def test_an_unknown_last_event_id_gets_stream_reset():
    conversation = create_conversation()
    stale = f"{id_prefix(channel_for(conversation.id))}5"  # an id from before a restart
    subscriber = Subscriber(conversation.owner, conversation.id, last_event_id=stale)
    asyncio.run(subscriber.run_while(publish_tokens(conversation.id, ["x"])))

    assert [e.event for e in subscriber.events()] == ["stream-reset", "token"]


def test_open_streams_are_capped_per_user_and_per_process(settings):
    settings.EVENTS_MAX_STREAMS_PER_USER, settings.EVENTS_MAX_STREAMS = 2, 3
    mine, theirs, third = create_conversation(), create_conversation(), create_conversation()

    async def scenario():
        held = [Subscriber(mine.owner, mine.id) for _ in range(2)]
        for subscriber in held:
            subscriber.open()
        await asyncio.sleep(0.05)
        over_user = Subscriber(mine.owner, mine.id)
        assert await over_user.attempt() == 429
        assert "Too many open event streams" in over_user.body
        other = Subscriber(theirs.owner, theirs.id)
        other.open()
        await asyncio.sleep(0.05)
        assert other.status == 200
        over_process = Subscriber(third.owner, third.id)
        assert await over_process.attempt() == 503
        assert "as many event streams as it can" in over_process.body
        await held[0].leave()
        again = Subscriber(mine.owner, mine.id)
        again.open()
        await asyncio.sleep(0.05)
        assert again.status == 200
        for subscriber in (held[1], other, again):
            await subscriber.leave()

    asyncio.run(scenario())


def signed_in_scope(subscriber: Subscriber, user) -> str:
    """Gives the subscriber's request a real session, as AuthMiddlewareStack does."""
    from importlib import import_module

    from django.conf import settings
    from django.test import Client

    client = Client()
    client.force_login(user)
    key = client.cookies[settings.SESSION_COOKIE_NAME].value
    subscriber.scope["session"] = import_module(settings.SESSION_ENGINE).SessionStore(key)
    return key


@pytest.mark.parametrize("how", ["sign-out", "deactivated", "password changed"])
def test_a_stream_ends_once_its_session_is_gone(monkeypatch, how):
    from importlib import import_module

    from asgiref.sync import sync_to_async
    from django.conf import settings

    from chat.streaming import sse

    monkeypatch.setattr(sse, "KEEP_ALIVE_SECONDS", 0.1)
    conversation = create_conversation()
    owner = conversation.owner
    subscriber = Subscriber(owner, conversation.id)
    key = signed_in_scope(subscriber, owner)

    def end_session():
        if how == "sign-out":
            import_module(settings.SESSION_ENGINE).SessionStore(key).delete()
        elif how == "deactivated":
            type(owner).objects.filter(pk=owner.pk).update(is_active=False)
        else:
            owner.set_password("another-Long-pass-1")
            owner.save()

    async def scenario():
        subscriber.open()
        await asyncio.sleep(0.3)
        assert not subscriber.task.done()  # a live session keeps its stream
        await sync_to_async(end_session)()
        await asyncio.wait_for(subscriber.task, 2)  # ends without the client leaving

    asyncio.run(scenario())
    assert subscriber.status == 200


def test_a_stream_whose_channel_was_evicted_gets_reset_and_every_later_event_once(settings):
    settings.EVENTLOG_MAX_BYTES = 20_000
    conversation = create_conversation()
    subscriber = Subscriber(conversation.owner, conversation.id)

    async def action():
        await publish_tokens(conversation.id, ["a", "b"])()
        for number in range(30):  # other conversations fill the log
            publish_on_loop(f"other-{number}", "token", {"text": "x" * 1000})
        await asyncio.sleep(0.05)
        publish_on_loop(conversation.id, "token", {"message_id": "m", "seq": 2, "text": "c"})
        await asyncio.sleep(0.05)
        publish_on_loop(conversation.id, "token", {"message_id": "m", "seq": 3, "text": "d"})

    asyncio.run(subscriber.run_while(action))
    seen = [(e.event, e.json.get("text")) for e in subscriber.events()]
    assert seen == [("token", "a"), ("token", "b"), ("stream-reset", None), ("token", "d")]


def test_the_body_goes_to_the_servers_send_and_only_the_start_through_the_wrapper():
    # The route keeps the server's send in the scope (KeepServerSend) under channels'
    # session middleware, whose send wrapper acts on the start alone.
    conversation = create_conversation()
    subscriber = Subscriber(conversation.owner, conversation.id)
    wrapped = []
    server_send = subscriber.send

    async def through_the_wrapper(message):
        wrapped.append(message["type"])
        await server_send(message)

    async def serve(scope, receive, send):
        await ConversationEvents()(scope, receive, through_the_wrapper)

    async def run():
        subscriber.task = asyncio.ensure_future(
            KeepServerSend(serve)(subscriber.scope, subscriber.receive, server_send)
        )
        await asyncio.sleep(0.05)
        await publish_tokens(conversation.id, ["a", "b"])()
        await asyncio.sleep(0.05)
        await subscriber.leave()

    asyncio.run(run())
    assert subscriber.status == 200
    assert [e.json["text"] for e in subscriber.events()] == ["a", "b"]
    assert wrapped == ["http.response.start"]


class FakeSocket:
    """A SocketWriter stand-in: takes a body written as its event is published, except
    when `busy` (a full socket buffer), when the stream's `send` must carry it instead."""

    def __init__(self, subscriber):
        self.subscriber = subscriber
        self.busy = False
        self.publishing = False
        self.written_as_published = 0

    def write(self, body: bytes) -> bool:
        if self.busy:
            return False
        self.subscriber.body += body.decode()
        self.written_as_published += self.publishing
        return True


def test_live_events_written_as_published_or_queued_arrive_once_each_in_order(monkeypatch):
    conversation = create_conversation()
    subscriber = Subscriber(conversation.owner, conversation.id)
    socket = FakeSocket(subscriber)
    monkeypatch.setattr(sse.SocketWriter, "for_send", classmethod(lambda cls, send: socket))
    texts = [f"t{i}" for i in range(30)]

    async def action():
        for seq, text in enumerate(texts):
            socket.busy = seq % 7 in (3, 4)  # now and then the socket's buffer is full
            socket.publishing = True
            publish_on_loop(conversation.id, "token", {"message_id": "m", "seq": seq, "text": text})
            socket.publishing = False
            if seq % 5 == 0:
                await asyncio.sleep(0.01)  # the stream's task runs between some of them

    asyncio.run(subscriber.run_while(action))
    assert [e.json["text"] for e in subscriber.events()] == texts
    ids = [int(e.id.rsplit(":", 1)[-1]) for e in subscriber.events()]
    assert ids == list(range(ids[0], ids[0] + len(texts)))
    # Most went out as published, without waking the stream's task.
    assert socket.written_as_published >= len(texts) // 2
