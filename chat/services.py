"""Writes. Every function takes keyword-only, typed arguments, keeps its rows consistent in
one transaction, and owns its effects: a new reply's relay starts once the reply is
committed, so the relay always finds its row. Errors say what went wrong in a sentence for
the user; the API layer alone decides which HTTP status each kind gets."""

import datetime
import functools
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from chat import batch, selectors, usage
from chat.batch import Statement
from chat.inference_client import catalog
from chat.models import Conversation, Feedback, Message, Preset, UsageEvent
from chat.relay.manager import relay_manager
from chat.relay.prompt import generation_for
from chat.tree import Tree

TITLE_CHARS = 60
RATE_WINDOW = usage.RATE_WINDOW


class ServiceError(Exception):
    """The request cannot be done as asked (a rule of the conversation, not a fault)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Conflict(ServiceError):
    """The conversation's state forbids it now (a reply is still being written)."""


class RateLimited(ServiceError):
    """A per-user limit was reached; waiting makes it possible again."""


class Unavailable(ServiceError):
    """Something the site depends on (the model servers) did not answer."""


class QuotaExceeded(RateLimited):
    """A daily or monthly token quota is used up until `resets_at`."""

    def __init__(self, message: str, resets_at: datetime.datetime):
        super().__init__(message)
        self.resets_at = resets_at


@dataclass(frozen=True)
class SentMessage:
    user_message: Message
    assistant_message: Message
    # Each message's siblings (ids, oldest first) where the service knew them without a
    # query; the API reads the others.
    siblings: dict = field(default_factory=dict)


def _check_model(model: str) -> None:
    """Only a model the servers list goes upstream; blank means the server's default."""
    if not model or model == settings.INFERENCE_MODEL:
        return
    known = catalog.model_ids()
    if not known:
        raise Unavailable(
            "The model servers cannot be reached to check the model. Try again in a moment."
        )
    if model not in known:
        raise ServiceError(f"There is no model `{model}`. Choose one of: {', '.join(known[:20])}.")


def conversation_create(
    *,
    owner,
    title: str = "",
    system_prompt: str = "",
    preset: Preset | None = None,
    settings_: dict | None = None,
) -> Conversation:
    _check_model((settings_ or {}).get("model", ""))
    limit = settings.CHAT_CONVERSATIONS_PER_MINUTE
    conversation = Conversation(
        owner=owner, title=title, system_prompt=system_prompt, preset=preset, **(settings_ or {})
    )
    with transaction.atomic():
        rate_row = _lock_and_charge(
            user_id=owner.pk,
            action=UsageEvent.Action.CONVERSATION,
            limit=limit,
            refusal=f"You created {limit} conversations in the last minute, the most allowed. "
            "Wait a minute and try again.",
        )
        batch.run([rate_row, batch.insert_statement([conversation])])
    return conversation


def conversation_update(*, conversation: Conversation, fields: dict) -> Conversation:
    """fields: the model's own (a preset as a Preset or None)."""
    if fields.get("model", conversation.model) != conversation.model:
        _check_model(fields["model"])
    for name, value in fields.items():
        setattr(conversation, name, value)
    conversation.save(update_fields=[*fields, "updated_at"])
    return conversation


def conversation_delete(*, conversation: Conversation) -> None:
    """Its replies stop too: a relay writing into a deleted conversation would keep the
    model busy outside every per-user limit, which counts only replies that still exist."""
    streaming = list(
        conversation.messages.filter(status=Message.Status.STREAMING).values_list("pk", flat=True)
    )
    conversation.delete()
    for reply_id in streaming:
        relay_manager.request_stop(reply_id)


def title_from(content: str) -> str:
    text = " ".join(content.split())
    if len(text) <= TITLE_CHARS:
        return text or "New chat"
    cut = text[:TITLE_CHARS].rsplit(" ", 1)[0] or text[:TITLE_CHARS]
    return cut + "…"


def _lock_user(user_id) -> None:
    """Serialise one user's limited actions across threads and processes: a limit is a
    count read and then raised, and without this two requests both read the old count
    (8 simultaneous sends were accepted with a limit of 3). FOR NO KEY UPDATE does not block
    rows that merely reference the user. SQLite needs nothing: its IMMEDIATE transactions
    already take the database's write lock when they begin (so the query is skipped there:
    Django would run it without the lock). Plain SQL: the ORM built this one-row SELECT at
    several times the cost of running it, on every send (half of a PostgreSQL send's locking
    CPU in a py-spy profile)."""
    statement = _lock_user_statement(user_id)
    if statement is not None:
        batch.run([statement])


def _lock_user_statement(user_id) -> Statement | None:
    connection = connections[DEFAULT_DB_ALIAS]
    if not connection.features.has_select_for_update:
        return None
    key = get_user_model()._meta.pk.get_db_prep_value(user_id, connection)
    return Statement(_lock_user_sql(connection.ops), [key])


@functools.lru_cache(maxsize=256)
def _lock_user_sql(ops) -> str:
    """Made once per connection (`ops` is its own), not every send."""
    meta = get_user_model()._meta
    features = ops.connection.features
    return (
        f"SELECT 1 FROM {ops.quote_name(meta.db_table)} WHERE {ops.quote_name(meta.pk.column)}"
        f" = %s {ops.for_update_sql(no_key=features.has_select_for_no_key_update)}"
    )


@dataclass(frozen=True)
class _Admitted:
    """A new reply's conversation, locked, its checks passed; `writes` (the reply's rate
    row) go to the database with the caller's own rows."""

    conversation: Conversation
    tree: Tree | None
    writes: list


def _lock_and_admit(*, owner_id, conversation_id, tree: bool = False) -> _Admitted:
    """Every new reply (send, edit, regenerate, an API call) passes here. The owner first,
    then the conversation: every writer takes them in this order. The conversation too, so
    two requests cannot both pass the streaming check, nor both move the active leaf (its
    row only: PostgreSQL cannot lock the nullable side of the preset's outer join). Then
    what the reply is admitted on, counted under the locks (what committed before: nothing
    can slip in between), the quota overrides and, when asked, the tree. All are read in
    one round trip where the database allows it (chat/batch.py), in this order.
    Conversation.DoesNotExist unless the conversation is the owner's (the send view's only
    read of it: the fields that matter are read here, under the lock)."""
    since = timezone.now() - RATE_WINDOW
    reads = [
        selectors.conversation_locked_statement(owner_id=owner_id, conversation_id=conversation_id),
        selectors.reply_admission_counts_statement(
            user_id=owner_id, conversation_id=conversation_id, since=since
        ),
        usage.overrides_statement(user_id=owner_id),
    ]
    if tree:
        reads.append(selectors.conversation_tree_statement(conversation_id=conversation_id))
    lock = _lock_user_statement(owner_id)
    results = batch.run([lock, *reads] if lock else reads)[-len(reads) :]
    conversation = selectors.conversation_from_locked_rows(results[0].rows)
    _check_admission(*results[1].rows[0], user_id=owner_id, overrides=results[2].rows)
    return _Admitted(
        conversation=conversation,
        tree=selectors.tree_from_rows(results[3].rows) if tree else None,
        writes=[
            batch.insert_statement([UsageEvent(user_id=owner_id, action=UsageEvent.Action.REPLY)])
        ],
    )


def _lock_and_charge(*, user_id, action: str, limit: int, refusal: str) -> Statement:
    """Takes the user's lock and counts their `action`s in the last minute, in one round
    trip where the database allows it (chat/batch.py), or refuses; the rate row of one more,
    for the caller to write with its own rows (one round trip too). Rows older than the
    window count for nothing here; the relay's sweeper deletes them
    (usage.usage_events_prune), not every send. A new conversation was six round trips on
    PostgreSQL, each through the ORM, and cost more CPU than a send (bench.roundtrips)."""
    since = timezone.now() - RATE_WINDOW
    count = selectors.user_usage_since_statement(user_id=user_id, action=action, since=since)
    lock = _lock_user_statement(user_id)
    if batch.run([lock, count] if lock else [count])[-1].rows[0][0] >= limit:
        raise RateLimited(refusal)
    return batch.insert_statement([UsageEvent(user_id=user_id, action=action)])


def _check_admission(here: int, streaming: int, recent: int, *, user_id, overrides) -> None:
    """here, streaming, recent: what selectors.reply_admission_counts counts."""
    if here:
        raise Conflict("A reply is still being written in this conversation. Stop it or wait.")
    if streaming >= settings.CHAT_MAX_STREAMING_PER_USER:
        raise RateLimited(
            "You have too many replies being written at once. Wait for one to finish."
        )
    limit = settings.CHAT_MESSAGES_PER_MINUTE
    if recent >= limit:
        raise RateLimited(
            f"You asked for {limit} replies in the last minute, the most allowed. "
            "Wait a minute and try again."
        )
    exceeded = usage.quota_exceeded(user=user_id, overrides=overrides)
    if exceeded is not None:
        raise QuotaExceeded(usage.quota_sentence(exceeded), exceeded.resets_at)


def _new_reply(
    *, conversation: Conversation, question: Message, path: list | None = None
) -> Message:
    """An unsaved streaming reply to `question`; its relay starts once it is committed.
    path: the ids from the first message down to `question`, when the caller knows them:
    the relay's start then reads only the history's text (saving.reply_load)."""
    reply = Message(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        status=Message.Status.STREAMING,
        parent=question,
        reply_to=question,
        model=conversation.model or settings.INFERENCE_MODEL,
        generation=generation_for(conversation),
    )
    # A new reply has no feedback: the presenter need not ask the database.
    Message.feedback.related.set_cached_value(reply, None)
    if path is None:
        transaction.on_commit(lambda: relay_manager.launch(reply.id))
    else:
        transaction.on_commit(lambda: relay_manager.launch(reply.id, reply, path))
    return reply


def _reply_create(
    *, conversation: Conversation, question: Message, path: list | None = None, writes: list
) -> Message:
    """A streaming reply to `question`, the end of the active path, written with `writes`
    (the admission's) in one round trip where the database allows it."""
    reply = _new_reply(conversation=conversation, question=question, path=path)
    conversation.active_leaf = reply
    batch.run(
        [
            *writes,
            batch.insert_statement([reply]),
            batch.update_statement(conversation, ["active_leaf", "updated_at"]),
        ]
    )
    return reply


def _question_and_reply(
    *, admitted: _Admitted, parent_id, content: str, path: list | None = None
) -> SentMessage:
    """A question under parent_id (None: a first message) and its streaming reply, which
    becomes the end of the active path. Both rows in one INSERT (their ids are made here),
    written with the admission's rows in one round trip where the database allows it.
    path: the ids from the first message down to parent_id, when the caller knows them."""
    conversation = admitted.conversation
    question = Message(
        conversation=conversation, role=Message.Role.USER, content=content, parent_id=parent_id
    )
    question_path = None if path is None else [*path, question.id]
    reply = _new_reply(conversation=conversation, question=question, path=question_path)
    conversation.active_leaf = reply
    if not conversation.title:
        conversation.title = title_from(content)
    batch.run(
        [
            *admitted.writes,
            batch.insert_statement([question, reply]),
            batch.update_statement(conversation, ["title", "active_leaf", "updated_at"]),
        ]
    )
    return SentMessage(user_message=question, assistant_message=reply)


def message_send(*, conversation: Conversation, content: str) -> SentMessage:
    """A new question at the end of the active path, and its reply."""
    return message_send_to(
        owner_id=conversation.owner_id, conversation_id=conversation.pk, content=content
    )


def message_send_to(*, owner_id, conversation_id, content: str) -> SentMessage:
    """message_send by ids: Conversation.DoesNotExist unless the conversation is the
    owner's. The tree read under the lock also gives the new messages' siblings. Four round
    trips on PostgreSQL (BEGIN, the reads, the writes, COMMIT), where one statement at a
    time made ten."""
    with transaction.atomic():
        admitted = _lock_and_admit(owner_id=owner_id, conversation_id=conversation_id, tree=True)
        tree = admitted.tree
        path = tree.active_path(admitted.conversation.active_leaf_id)
        parent_id = path[-1] if path else None
        sent = _question_and_reply(
            admitted=admitted, parent_id=parent_id, content=content, path=path
        )
    question, reply = sent.user_message, sent.assistant_message
    siblings = {
        question.id: [*tree.children.get(parent_id, []), question.id],
        reply.id: [reply.id],
    }
    return SentMessage(user_message=question, assistant_message=reply, siblings=siblings)


def reply_regenerate(*, reply: Message) -> Message:
    """Another reply to the same question, beside the old one; the old one stays a sibling."""
    if reply.role != Message.Role.ASSISTANT or reply.parent_id is None:
        raise ServiceError("Only a reply of the assistant can be regenerated.")
    with transaction.atomic():
        admitted = _lock_and_admit(
            owner_id=reply.conversation.owner_id, conversation_id=reply.conversation_id
        )
        return _reply_create(
            conversation=admitted.conversation, question=reply.parent, writes=admitted.writes
        )


def message_edit(*, message: Message, content: str) -> SentMessage:
    """A new version of any question of the user, beside the old one (same parent), and its
    reply. The old question and everything after it stay, one sibling away."""
    if message.role != Message.Role.USER:
        raise ServiceError("Only your own messages can be edited.")
    with transaction.atomic():
        admitted = _lock_and_admit(
            owner_id=message.conversation.owner_id, conversation_id=message.conversation_id
        )
        return _question_and_reply(admitted=admitted, parent_id=message.parent_id, content=content)


def conversation_switch(*, conversation: Conversation, message: Message) -> Conversation:
    """Make the active path run through this message, down to the newest message under it.
    Allowed while a reply streams: that reply goes on, on its own branch."""
    with transaction.atomic():
        conversation = Conversation.objects.select_for_update().get(pk=conversation.pk)
        tree = selectors.conversation_tree(conversation=conversation)
        conversation.active_leaf_id = tree.newest_leaf_under(message.pk)
        conversation.save(update_fields=["active_leaf"])
    return conversation


def reply_stop(*, reply: Message) -> None:
    """Stop a reply being written; a reply that already ended is left as it is."""
    stopping = Message.objects.filter(pk=reply.pk, status=Message.Status.STREAMING).update(
        stop_requested=True
    )
    if stopping:
        relay_manager.request_stop(reply.pk)


def feedback_set(*, reply: Message, rating: str | None, comment: str) -> Feedback | None:
    """Set or change the user's rating and comment on a reply; both empty removes it."""
    if reply.role != Message.Role.ASSISTANT:
        raise ServiceError("Only a reply of the assistant can be rated.")
    if reply.status == Message.Status.STREAMING:
        raise Conflict("This reply is still being written. Rate it once it has finished.")
    if not rating and not comment.strip():
        Feedback.objects.filter(message=reply).delete()
        return None
    feedback, _ = Feedback.objects.update_or_create(
        message=reply, defaults={"rating": rating or "", "comment": comment}
    )
    return feedback


def conversation_start_from_api(
    *, owner, system_prompt: str, turns: list[tuple[str, str]], settings_: dict
) -> SentMessage:
    """One call to the site's /v1/chat/completions: its messages become a new conversation
    (source `api`), one path with the last one the question, and the reply starts as from
    the page, under the same per-user limits and quotas. `turns` are (role, content),
    oldest first."""
    question_text = turns[-1][1]
    with transaction.atomic():
        _lock_user(owner.pk)
        conversation = Conversation.objects.create(
            owner=owner,
            source=Conversation.Source.API,
            title=title_from(question_text),
            system_prompt=system_prompt,
            **settings_,
        )
        admitted = _lock_and_admit(owner_id=owner.pk, conversation_id=conversation.pk)
        history = _history_create(conversation=conversation, turns=turns)
        reply = _reply_create(
            conversation=conversation,
            question=history[-1],
            path=[message.id for message in history],
            writes=admitted.writes,
        )
    return SentMessage(user_message=history[-1], assistant_message=reply)


def _history_create(*, conversation: Conversation, turns: list[tuple[str, str]]) -> list[Message]:
    """The caller's messages in order, each under the one before. They are created together,
    so each gets its own microsecond: siblings and exports order by created_at."""
    first = timezone.now() - datetime.timedelta(microseconds=len(turns) + 1)
    messages: list[Message] = []
    for role, content in turns:
        message = Message(
            conversation=conversation,
            role=role,
            content=content,
            parent=messages[-1] if messages else None,
        )
        messages.append(message)
    Message.objects.bulk_create(messages)
    for index, message in enumerate(messages):
        message.created_at = first + datetime.timedelta(microseconds=index)
    Message.objects.bulk_update(messages, ["created_at"])
    return messages
