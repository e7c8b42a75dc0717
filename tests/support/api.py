"""Calling the site JSON API through Django's test client, for the in-process API tests."""

import json

from django.test import Client

from chat.models import Message


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def call(client, method: str, path: str, payload=None, raw=None):
    """A JSON request: payload is sent as JSON, raw as it is (str or bytes)."""
    if method == "get":
        return client.get(path)
    body = raw if raw is not None else ("" if payload is None else json.dumps(payload))
    return getattr(client, method)(path, data=body, content_type="application/json")


def finish_replies(conversation=None, content: str = "done") -> None:
    """In-process tests run no relay (on_commit never fires inside a test transaction):
    end the streaming replies as a relay would."""
    replies = Message.objects.filter(status=Message.Status.STREAMING)
    if conversation is not None:
        replies = replies.filter(conversation=conversation)
    replies.update(status=Message.Status.COMPLETE, content=content, finish_reason="stop")


def post(client, path, payload=None, raw=None, method="post"):
    """call() with the path first: payload as JSON (raw as it is) with `method`."""
    return call(client, method, path, payload, raw)
