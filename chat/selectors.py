"""Reads. Each returns only what the given user may see."""

import datetime
import functools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

# Each function takes the connection itself once (connections[DEFAULT_DB_ALIAS]):
# django.db.connection is a proxy whose every attribute is a lookup in a thread-critical
# Local, and a send's field preparations and reads made dozens of them (py-spy: ~6% of a
# burst of sends' samples in that proxy).
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import (
    Case,
    CharField,
    Count,
    Exists,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from chat import batch
from chat.batch import Statement
from chat.models import Conversation, Feedback, Message, Preset, ShareLink, UsageEvent
from chat.permissions import can_review
from chat.tree import Node, Tree


def conversation_list(*, user, query: str = "") -> QuerySet[Conversation]:
    conversations = Conversation.objects.filter(owner=user).select_related("preset")
    if query:
        # Every branch counts: each can be brought back with its ‹ › arrows.
        matching_messages = Message.objects.filter(
            conversation=OuterRef("pk"), content__icontains=query
        )
        conversations = conversations.filter(Q(title__icontains=query) | Exists(matching_messages))
    return conversations.order_by("-updated_at")


def conversation_get(*, user, conversation_id: uuid.UUID) -> Conversation:
    """The user's own conversation; raises Conversation.DoesNotExist for anyone else's."""
    return Conversation.objects.select_related("preset").get(pk=conversation_id, owner=user)


def conversation_readable_by(*, user, conversation_id: uuid.UUID) -> bool:
    """Its owner's, or any for a reviewer. An owner's check is one plain SELECT: every open
    event stream asks again at each keep-alive, and the ORM built its exists() at a cost
    several times that of running it."""
    if not user.is_authenticated:
        return False
    if can_review(user):
        return Conversation.objects.filter(pk=conversation_id).exists()
    connection = connections[DEFAULT_DB_ALIAS]
    meta = Conversation._meta
    key = meta.pk.get_db_prep_value(conversation_id, connection)
    owner = meta.get_field("owner").get_db_prep_value(user.pk, connection)
    where = f"{_column(Conversation, 'id')} = %s AND {_column(Conversation, 'owner')} = %s"
    return bool(_rows(Conversation, ["id"], where, [key, owner]))


@dataclass(frozen=True)
class ConversationPath:
    """The messages the user sees, in order, and each one's siblings (ids, oldest first).
    A long path comes a page at a time: `has_earlier` says messages precede the page."""

    messages: list
    siblings: dict
    has_earlier: bool = False


def conversation_tree(*, conversation: Conversation) -> Tree:
    """What conversation.messages.values_list("id", "parent_id", "created_at") reads, as
    one plain SELECT: built through the ORM it cost more than running it, on every send."""
    statement = conversation_tree_statement(conversation_id=conversation.pk)
    return tree_from_rows(batch.run([statement])[0].rows)


TREE_FIELDS = ("id", "parent", "created_at")


def conversation_tree_statement(*, conversation_id) -> Statement:
    connection = connections[DEFAULT_DB_ALIAS]
    select, _ = _select(connection.ops, Message, TREE_FIELDS)
    key = Message._meta.get_field("conversation").get_db_prep_value(conversation_id, connection)
    return Statement(f"{select} WHERE {_column(Message, 'conversation')} = %s", [key])


def tree_from_rows(rows: list) -> Tree:
    """The tree from conversation_tree_statement's rows."""
    connection = connections[DEFAULT_DB_ALIAS]
    _, converters = _select(connection.ops, Message, TREE_FIELDS)
    return Tree.build(Node(*_converted(row, converters, connection)) for row in rows)


def conversation_locked(*, owner_id, conversation_id) -> Conversation:
    """The owner's conversation with its preset, locked for the caller's transaction (the
    conversation's row only; SQLite's IMMEDIATE transaction holds the whole database):
    Conversation.objects.select_for_update(of=("self",)).select_related("preset")
    .get(pk=conversation_id, owner_id=owner_id) as one plain SELECT, which the ORM built
    at a cost several times that of running it, on every send. Conversation.DoesNotExist
    unless it is the owner's."""
    statement = conversation_locked_statement(owner_id=owner_id, conversation_id=conversation_id)
    return conversation_from_locked_rows(batch.run([statement])[0].rows)


def conversation_locked_statement(*, owner_id, conversation_id) -> Statement:
    connection = connections[DEFAULT_DB_ALIAS]
    key = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    return Statement(_locked_sql(connection.ops), [key, owner_id])


@functools.lru_cache(maxsize=256)
def _locked_sql(ops) -> str:
    """The statement's text made once per connection (`ops` is its own), not every send."""
    conversation_meta, preset_meta = Conversation._meta, Preset._meta
    quote = ops.quote_name
    table, presets = quote(conversation_meta.db_table), quote(preset_meta.db_table)
    columns = ", ".join(
        f"{quote(field.model._meta.db_table)}.{quote(field.column)}" for field in _locked_fields()
    )
    sql = (
        f"SELECT {columns} FROM {table} LEFT OUTER JOIN {presets} ON "
        f"{table}.{quote(conversation_meta.get_field('preset').column)} = "
        f"{presets}.{quote(preset_meta.pk.column)} "
        f"WHERE {table}.{quote(conversation_meta.pk.column)} = %s "
        f"AND {table}.{quote(conversation_meta.get_field('owner').column)} = %s"
    )
    features = ops.connection.features
    if features.has_select_for_update:
        of = (table,) if features.has_select_for_update_of else ()
        sql += " " + ops.for_update_sql(of=of)
    return sql


def conversation_from_locked_rows(rows: list) -> Conversation:
    """The conversation (its preset cached on it) from conversation_locked_statement's
    rows; Conversation.DoesNotExist when there are none."""
    if not rows:
        raise Conversation.DoesNotExist("No such conversation of this owner.")
    connection = connections[DEFAULT_DB_ALIAS]
    fields = _locked_fields()
    own = len(Conversation._meta.concrete_fields)
    values = _converted(rows[0], _converters(fields), connection)
    conversation = Conversation.from_db(
        connection.alias, [field.attname for field in fields[:own]], values[:own]
    )
    preset = None
    if conversation.preset_id is not None:
        preset = Preset.from_db(
            connection.alias, [field.attname for field in fields[own:]], values[own:]
        )
    Conversation._meta.get_field("preset").set_cached_value(conversation, preset)
    return conversation


def _locked_fields() -> list:
    return [*Conversation._meta.concrete_fields, *Preset._meta.concrete_fields]


def _column(model, name: str) -> str:
    connection = connections[DEFAULT_DB_ALIAS]
    return connection.ops.quote_name(model._meta.get_field(name).column)


def _rows(model, names: list[str], where: str, params: list) -> list[tuple]:
    """The fields `names` of `model`'s rows WHERE `where` (SQL, %s for each of `params`),
    each value through its column's own converters, as values_list gives them (SQLite's
    text to UUID, datetime, bool). For the reads of the send path and a relay's start,
    which the ORM built at a cost several times that of running them."""
    connection = connections[DEFAULT_DB_ALIAS]
    select, converters = _select(connection.ops, model, tuple(names))
    with connection.cursor() as cursor:
        cursor.execute(f"{select} WHERE {where}", params)
        rows = cursor.fetchall()
    return [_converted(row, converters, connection) for row in rows]


@functools.lru_cache(maxsize=256)
def _select(ops, model, names: tuple[str, ...]) -> tuple[str, list]:
    """The SELECT ... FROM of `names` and their converters, made once per connection (`ops`
    is its own) rather than for every read: the user's read of every request took 186-240
    µs of CPU with them built each time, 137-148 µs without (medians of 5 x 2,000 reads,
    4 runs alternated)."""
    meta = model._meta
    fields = [meta.get_field(name) for name in names]
    quote = ops.quote_name
    select = (
        f"SELECT {', '.join(quote(field.column) for field in fields)} FROM {quote(meta.db_table)}"
    )
    return select, _converters(fields)


def _converters(fields) -> list:
    """Each field's column and the functions the ORM passes its database values through."""
    connection = connections[DEFAULT_DB_ALIAS]
    return _converters_of(connection.ops, tuple(fields))


@functools.lru_cache(maxsize=256)
def _converters_of(ops, fields: tuple) -> list:
    converters = []
    for field in fields:
        column = field.get_col(field.model._meta.db_table)
        functions = [*ops.get_db_converters(column), *column.get_db_converters(ops.connection)]
        converters.append((column, functions))
    return converters


def _converted(row, converters, connection) -> tuple:
    values = []
    for value, (column, functions) in zip(row, converters, strict=True):
        for convert in functions:
            value = convert(value, column, connection)
        values.append(value)
    return tuple(values)


def user_by_id(*, user_id):
    """User.objects.get(pk=user_id) (None when there is none) as one plain SELECT (_rows),
    built with Model.from_db as the ORM builds it: every request reads its user."""
    connection = connections[DEFAULT_DB_ALIAS]
    from django.contrib.auth import get_user_model

    model = get_user_model()
    fields = model._meta.concrete_fields
    key = model._meta.pk.get_db_prep_value(user_id, connection)
    rows = _rows(
        model, [f.name for f in fields], f"{_column(model, model._meta.pk.name)} = %s", [key]
    )
    if not rows:
        return None
    return model.from_db(connection.alias, [f.attname for f in fields], rows[0])


def messages_by_id(ids) -> list[Message]:
    found = Message.objects.select_related("feedback").in_bulk(ids)
    return [found[i] for i in ids if i in found]


def conversation_path(
    *, conversation: Conversation, limit: int | None = None, before: uuid.UUID | None = None
) -> ConversationPath:
    """The active path (one query for the tree's shape, one for the messages shown): its
    newest `limit` messages, or those just before message `before` on the path
    (Message.DoesNotExist for a message not on it)."""
    tree = conversation_tree(conversation=conversation)
    ids = tree.active_path(conversation.active_leaf_id)
    if before is not None:
        if before not in ids:
            raise Message.DoesNotExist("That message is not on the conversation's path.")
        ids = ids[: ids.index(before)]
    has_earlier = limit is not None and len(ids) > limit
    if has_earlier:
        ids = ids[-limit:]
    return ConversationPath(
        messages=messages_by_id(ids),
        siblings={i: tree.siblings(i) for i in ids},
        has_earlier=has_earlier,
    )


@dataclass(frozen=True)
class ConversationDetail:
    conversation: Conversation
    path: ConversationPath
    share: ShareLink | None
    streaming_reply: Message | None  # at most one per conversation (409 otherwise)


def conversation_detail(
    *, conversation: Conversation, limit: int | None = None, before: uuid.UUID | None = None
) -> ConversationDetail:
    return ConversationDetail(
        conversation=conversation,
        path=conversation_path(conversation=conversation, limit=limit, before=before),
        share=share_link_current(conversation=conversation),
        streaming_reply=conversation_streaming_reply(conversation=conversation),
    )


def message_siblings(*, message: Message) -> list:
    return list(
        Message.objects.filter(conversation_id=message.conversation_id, parent_id=message.parent_id)
        .order_by("created_at", "id")
        .values_list("id", flat=True)
    )


def conversation_message(*, conversation: Conversation, message_id) -> Message:
    """A message of this conversation; Message.DoesNotExist for any other id."""
    return conversation.messages.get(pk=message_id)


def conversation_streaming_reply(*, conversation: Conversation) -> Message | None:
    return conversation.messages.filter(status=Message.Status.STREAMING).first()


def message_get(*, user, message_id: uuid.UUID) -> Message:
    return Message.objects.select_related("conversation", "feedback").get(
        pk=message_id, conversation__owner=user
    )


def reply_admission_counts(*, user_id, conversation_id, since) -> tuple[int, int, int]:
    """What a new reply is admitted on: replies being written in this conversation, in all
    of the user's, and replies the user asked for since `since`. One statement, written as
    SQL: building three counts through the ORM cost more CPU than running them."""
    statement = reply_admission_counts_statement(
        user_id=user_id, conversation_id=conversation_id, since=since
    )
    here, streaming_total, recent = batch.run([statement])[0].rows[0]
    return here, streaming_total, recent


def reply_admission_counts_statement(*, user_id, conversation_id, since) -> Statement:
    connection = connections[DEFAULT_DB_ALIAS]
    streaming = Message.Status.STREAMING
    params = [
        Message._meta.get_field("conversation").get_db_prep_value(conversation_id, connection),
        streaming,
        user_id,
        streaming,
    ]
    recent = user_usage_since_statement(
        user_id=user_id, action=UsageEvent.Action.REPLY, since=since
    )
    return Statement(_admission_counts_sql(connection.ops), params + recent.params)


@functools.lru_cache(maxsize=256)
def _admission_counts_sql(ops) -> str:
    message, conversation = Message._meta, Conversation._meta
    quote = ops.quote_name

    def column(meta, name: str) -> str:
        return f"{quote(meta.db_table)}.{quote(meta.get_field(name).column)}"

    messages, conversations = quote(message.db_table), quote(conversation.db_table)
    return (
        f"SELECT (SELECT COUNT(*) FROM {messages} WHERE {column(message, 'conversation')} = %s"
        f" AND {column(message, 'status')} = %s),"
        f" (SELECT COUNT(*) FROM {messages} INNER JOIN {conversations}"
        f" ON {column(message, 'conversation')} = {column(conversation, 'id')}"
        f" WHERE {column(conversation, 'owner')} = %s AND {column(message, 'status')} = %s),"
        f" ({_usage_since_sql(ops)})"
    )


def user_usage_since_statement(*, user_id, action: str, since: datetime.datetime) -> Statement:
    """How many `action`s the user took since `since`, as one plain SELECT COUNT(*): the
    ORM built it at several times the cost of running it, on every new conversation."""
    connection = connections[DEFAULT_DB_ALIAS]
    created_at = UsageEvent._meta.get_field("created_at")
    params = [user_id, action, created_at.get_db_prep_value(since, connection)]
    return Statement(_usage_since_sql(connection.ops), params)


@functools.lru_cache(maxsize=256)
def _usage_since_sql(ops) -> str:
    event = UsageEvent._meta
    quote = ops.quote_name

    def column(name: str) -> str:
        return quote(event.get_field(name).column)

    return (
        f"SELECT COUNT(*) FROM {quote(event.db_table)} WHERE {column('user')} = %s"
        f" AND {column('action')} = %s AND {column('created_at')} >= %s"
    )


def prompt_history_newest_first(
    *, reply: Message, page: int = 32, path: list | None = None
) -> Iterator[tuple[str, str]]:
    """What a reply answers: (role, content) of the messages on its own path, from its
    question back to the first, wherever the user's active path is now. Newest first and
    read a page at a time (the tree's shape is one light query): the caller stops once the
    model's context is full, so a long conversation is not read whole for every reply.
    Rows, not model instances, read as plain SQL (_rows): a relay's start reads nothing
    else of them.

    path: the ids from the first message down to the question, when the caller already has
    them (the send that made the reply). The tree is not read then, and the reply's own row
    comes with the first page: Message.DoesNotExist unless it is still streaming (its
    conversation deleted before its relay started), and its stop_requested is copied onto
    `reply` (a Stop pressed before the relay listened): what the relay's start would
    otherwise spend queries of its own on."""
    connection = connections[DEFAULT_DB_ALIAS]
    if path is None:
        tree = conversation_tree(conversation=reply.conversation)
        ids = tree.path_to(reply.id)[:-1] if reply.id in tree else []
    else:
        ids = list(path)
    ids.reverse()
    check = path is not None
    for start in range(0, max(len(ids), 1), page):
        chunk = ids[start : start + page]
        wanted = [*chunk, reply.id] if check else chunk
        rows = []
        if wanted:  # empty: a reply outside its conversation's tree, with no path given
            rows = _rows(
                Message,
                ["id", "role", "content", "status", "stop_requested"],
                f"{_column(Message, 'id')} IN ({', '.join(['%s'] * len(wanted))})",
                [Message._meta.pk.get_db_prep_value(i, connection) for i in wanted],
            )
        found = {row[0]: row[1:] for row in rows}
        if check:
            own = found.get(reply.id)
            if own is None or own[2] != Message.Status.STREAMING:
                raise Message.DoesNotExist("The reply is no longer being written.")
            reply.stop_requested = own[3]
            check = False
        yield from (found[i][:2] for i in chunk if i in found)


def feedback_for(*, message: Message) -> Feedback | None:
    return Feedback.objects.filter(message=message).first()


def presets_active() -> QuerySet[Preset]:
    return Preset.objects.filter(is_active=True).order_by("name")


def preset_get_active(*, preset_id: int) -> Preset:
    """An active preset; Preset.DoesNotExist for an inactive or unknown id."""
    return Preset.objects.get(pk=preset_id, is_active=True)


def share_link_current(*, conversation: Conversation) -> ShareLink | None:
    return conversation.share_links.filter(revoked_at__isnull=True).order_by("-created_at").first()


def share_link_by_token(*, token: str) -> ShareLink:
    """A live link; ShareLink.DoesNotExist for a revoked or unknown token."""
    return ShareLink.objects.select_related("conversation__owner", "leaf").get(
        token=token, revoked_at__isnull=True
    )


def share_link_messages(*, link: ShareLink) -> list[Message]:
    """The snapshot: the path down to the link's leaf, nothing after it."""
    tree = conversation_tree(conversation=link.conversation)
    return messages_by_id(tree.path_to(link.leaf_id) if link.leaf_id in tree else [])


# --- staff review and housekeeping ---------------------------------------------------


@dataclass(frozen=True)
class Transcript:
    """Every message of a conversation, as branches to read: the active path first."""

    branches: list  # chat.tree.Branch, with message ids
    messages: dict  # id -> Message (feedback loaded)
    active: set  # ids on the active path
    numbers: dict  # id -> its number in reading order, 1-based


def conversation_transcript(*, conversation: Conversation) -> Transcript:
    """Every message, other branches included: a review must see what was regenerated."""
    tree = conversation_tree(conversation=conversation)
    branches = tree.branches(conversation.active_leaf_id)
    ordered = [i for branch in branches for i in branch.messages]
    return Transcript(
        branches=branches,
        messages={m.id: m for m in messages_by_id(ordered)},
        active=set(branches[0].messages) if branches else set(),
        numbers={i: n for n, i in enumerate(ordered, 1)},
    )


def conversations_with_summary(conversations: QuerySet[Conversation]) -> QuerySet[Conversation]:
    """The admin list's figures: message count, last activity, the latest reply's model and
    status (`streaming` while any reply is)."""
    replies = Message.objects.filter(
        conversation=OuterRef("pk"), role=Message.Role.ASSISTANT
    ).order_by("-created_at")
    streaming = Message.objects.filter(conversation=OuterRef("pk"), status=Message.Status.STREAMING)
    return conversations.annotate(
        message_count=Count("messages", distinct=True),
        # Replies are flushed without touching the conversation row, so its updated_at
        # alone would hide a long reply still being written.
        last_activity=Coalesce(Max("messages__updated_at"), "updated_at"),
        last_reply_model=Subquery(replies.values("model")[:1]),
        reply_status=Case(
            When(Exists(streaming), then=Value(Message.Status.STREAMING)),
            default=Subquery(replies.values("status")[:1]),
            output_field=CharField(),
        ),
    )


def reply_model_names() -> list[str]:
    """Every model that wrote a reply, for filtering (a conversation's own field is usually
    blank)."""
    return list(
        Message.objects.filter(role=Message.Role.ASSISTANT)
        .exclude(model="")
        .values_list("model", flat=True)
        .distinct()
        .order_by("model")
    )


def conversations_with_reply_model(
    conversations: QuerySet[Conversation], *, model: str
) -> QuerySet[Conversation]:
    replies = Message.objects.filter(conversation=OuterRef("pk"), model=model)
    return conversations.filter(Exists(replies))


def conversations_inactive_since(*, cutoff: datetime.datetime) -> QuerySet[Conversation]:
    # Replies are saved without touching the conversation row: a message updated after
    # the cutoff keeps it, and a reply still streaming always does.
    recent = Message.objects.filter(conversation=OuterRef("pk"), updated_at__gte=cutoff)
    streaming = Message.objects.filter(conversation=OuterRef("pk"), status=Message.Status.STREAMING)
    return (
        Conversation.objects.filter(updated_at__lt=cutoff)
        .exclude(Exists(recent))
        .exclude(Exists(streaming))
    )


def conversations_with_feedback(
    conversations: QuerySet[Conversation], *, kind: str
) -> QuerySet[Conversation]:
    """kind: "up", "down", "comment" (any comment) or "none" (no feedback at all)."""
    feedback = Feedback.objects.filter(message__conversation=OuterRef("pk"))
    if kind == "none":
        return conversations.exclude(Exists(feedback))
    if kind == "comment":
        return conversations.filter(Exists(feedback.exclude(comment="")))
    return conversations.filter(Exists(feedback.filter(rating=kind)))
