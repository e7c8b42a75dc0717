"""What one send costs the database: the send path is the site's busiest write, and a query
added to it is paid by every message (bench/README.md, the relay's cost per send)."""

import datetime
import textwrap

import pytest
from django.utils import timezone

from chat import services, usage
from chat.models import Conversation, UsageEvent
from tests.support.api import finish_replies, post
from tests.support.postgres import json_from_child

# The user (the session comes from its cache), BEGIN and COMMIT (2), the conversation under
# its lock, the streaming and rate counts (one statement), the rate row, the quota
# overrides, the tree, both messages in one INSERT, the conversation's new leaf and title.
SEND_QUERIES = 10


@pytest.mark.django_db(transaction=True)
def test_a_send_takes_at_most_ten_queries(api, user, django_assert_max_num_queries):
    conversation = Conversation.objects.create(owner=user)
    path = f"/api/conversations/{conversation.pk}/messages/"
    assert post(api, path, {"content": "first"}).status_code == 202
    finish_replies()
    with django_assert_max_num_queries(SEND_QUERIES):
        response = post(api, path, {"content": "second"})
    assert response.status_code == 202
    body = response.json()
    question, reply = body["user_message"], body["assistant_message"]
    # The siblings come from the tree read under the lock, not from a query per message.
    assert question["siblings"] == [question["id"]]
    assert reply["siblings"] == [reply["id"]] and reply["feedback"] is None
    assert question["parent_id"] is not None and reply["parent_id"] == question["id"]


@pytest.mark.django_db(transaction=True)
def test_an_edit_still_lists_the_old_question_as_a_sibling(api, user):
    conversation = Conversation.objects.create(owner=user)
    path = f"/api/conversations/{conversation.pk}/messages/"
    first = post(api, path, {"content": "first"}).json()["user_message"]
    finish_replies()
    edited = post(api, f"/api/messages/{first['id']}/edit/", {"content": "again"}).json()
    assert edited["user_message"]["siblings"] == [first["id"], edited["user_message"]["id"]]


@pytest.mark.django_db
def test_another_users_conversation_is_404_and_charges_nothing(api, make_user):
    theirs = Conversation.objects.create(owner=make_user("other"))
    response = post(api, f"/api/conversations/{theirs.pk}/messages/", {"content": "hi"})
    assert response.status_code == 404
    assert not UsageEvent.objects.exists()


@pytest.mark.django_db
def test_the_sweepers_prune_deletes_only_rate_rows_older_than_the_window(user):
    now = timezone.now()
    old = UsageEvent.objects.create(user=user, action=UsageEvent.Action.REPLY)
    recent = UsageEvent.objects.create(user=user, action=UsageEvent.Action.REPLY)
    UsageEvent.objects.filter(pk=old.pk).update(
        created_at=now - usage.RATE_WINDOW - datetime.timedelta(seconds=1)
    )
    assert usage.usage_events_prune(now) == 1
    assert list(UsageEvent.objects.values_list("pk", flat=True)) == [recent.pk]


# In a process of its own with DATABASE_URL set (test_saving.py's way): a new conversation's
# statements on PostgreSQL, and what it left
CREATE_ON_POSTGRES = textwrap.dedent(
    """
    import json
    import django
    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from chat import services
    from chat.models import Conversation, UsageEvent
    from tests.support.factories import create_user
    call_command("migrate", verbosity=0)
    user = create_user()
    with CaptureQueriesContext(connection) as statements:
        made = services.conversation_create(owner=user, title="t", settings_={"top_k": 5})
    saved = Conversation.objects.get(pk=made.pk)
    print(json.dumps({
        "statements": len(statements.captured_queries),
        "saved": [saved.owner_id == user.pk, saved.title, saved.top_k, saved.created_at == made.created_at],
        "rate_rows": UsageEvent.objects.filter(user=user, action="conversation").count(),
    }))
    """
)


@pytest.mark.scaled
def test_on_postgresql_a_new_conversation_is_its_reads_and_its_writes_in_one_transaction(
    postgres_url,
):
    observed = json_from_child(CREATE_ON_POSTGRES, postgres_url)
    # BEGIN, the user's lock with the per-minute count, the rate row with the conversation,
    # COMMIT: six round trips before, two of them through the ORM
    assert observed["statements"] == 4
    assert observed["saved"] == [True, "t", 5, True] and observed["rate_rows"] == 1


@pytest.mark.django_db
def test_a_new_conversation_over_the_per_minute_limit_is_refused_and_not_saved(user, settings):
    settings.CHAT_CONVERSATIONS_PER_MINUTE = 2
    for _ in range(2):
        services.conversation_create(owner=user)
    with pytest.raises(services.RateLimited):
        services.conversation_create(owner=user, title="third")
    assert Conversation.objects.filter(owner=user).count() == 2
    assert UsageEvent.objects.filter(user=user, action="conversation").count() == 2
