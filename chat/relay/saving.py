"""The relay's writes: streamed text saved in batches, the final state, and replies left
`streaming` by a site process that died."""

import datetime
import functools
import uuid

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from chat.inference_client import ChatRequest
from chat.models import Message
from chat.relay import prompt
from chat.usage import ReplyUsage, usage_record, usage_upsert_from


def reply_load(
    *, message_id: uuid.UUID, known: Message | None = None, path: list | None = None
) -> tuple[Message, ChatRequest]:
    """The reply still streaming and the request that writes it; Message.DoesNotExist
    when it ended before its relay started.

    known and path: the reply as the send that made it holds it (its conversation and
    preset loaded) and the ids of its question's path. Then the history's one query is all
    (it also checks the reply still streams): the send's rows are not read again."""
    if known is not None and path is not None:
        return known, prompt.build_request(known, path=path)
    message = Message.objects.select_related("conversation__preset").get(
        pk=message_id, status=Message.Status.STREAMING
    )
    return message, prompt.build_request(message)


def reply_flush(*, contents: dict[uuid.UUID, tuple[str, int]], alive: list[uuid.UUID]) -> None:
    """Save streamed text of many replies in one transaction, and mark their relays alive.

    One prepared UPDATE run for every reply (executemany): at 200 streams an ORM update per
    reply twice a second was a tenth of the site's CPU."""
    now = timezone.now()
    with transaction.atomic():
        if contents:
            _update_streaming_texts(contents, now)
        idle = [message_id for message_id in alive if message_id not in contents]
        if idle:
            Message.objects.filter(pk__in=idle, status=Message.Status.STREAMING).update(
                updated_at=now
            )


def reply_finish(*, message_id: uuid.UUID, fields: dict, usage: ReplyUsage | None) -> None:
    """The final state, and the reply's tokens added to its owner's usage, together.

    Counted only when the reply leaves `streaming` here (or its conversation was deleted
    meanwhile: the tokens were still used). A reply the sweeper already marked interrupted
    (its relay could not write for RELAY_STALE_AFTER) was counted by the sweeper.

    The UPDATE that finds the reply still streaming is also the one that ends it (on
    PostgreSQL it waits for the sweeper's row lock and then checks the status again), so
    the usual case is one statement rather than a locking read and then the write; on
    PostgreSQL the day's usage is added by the same statement (`_end_and_count`)."""
    values = {**fields, "updated_at": timezone.now()}
    connection = connections[DEFAULT_DB_ALIAS]
    one_statement = usage is not None and connection.vendor == "postgresql"
    if one_statement and _end_and_count(connection, message_id, values, usage):
        return
    # Below, also what PostgreSQL's statement found no longer streaming (it wrote nothing):
    # the sweeper's case or a deletion's.
    with transaction.atomic():
        ended_here = _update_reply(message_id, values, only_streaming=True)
        if not ended_here:
            # Interrupted by the sweeper (already counted), or deleted (counted below).
            ended_here = not _update_reply(message_id, values, only_streaming=False)
        if usage is not None and ended_here:
            usage_record(usage=usage)


def _update_reply(message_id: uuid.UUID, values: dict, *, only_streaming: bool) -> int:
    """Message.objects.filter(pk=…[, status=streaming]).update(**values) as one plain
    UPDATE: the ORM built its ten assignments at several times the cost of running it, at
    the end of every reply. Returns the rows changed."""
    connection = connections[DEFAULT_DB_ALIAS]
    sql = _reply_update_sql(connection.ops, tuple(values), only_streaming)
    with connection.cursor() as cursor:
        cursor.execute(sql, _reply_update_params(connection, message_id, values, only_streaming))
        return cursor.rowcount


def _end_and_count(connection, message_id: uuid.UUID, values: dict, usage: ReplyUsage) -> bool:
    """End a streaming reply and add its usage to the day's row as one statement: the
    UPDATE, in a data-modifying WITH, feeds the UsageDay upsert. In autocommit that is one
    round trip where BEGIN, two UPDATEs and COMMIT were four, at the end of every reply.
    False (nothing written) when the reply was no longer streaming."""
    update = _reply_update_sql(connection.ops, tuple(values), True)
    upsert, upsert_params = usage_upsert_from(connection, usage=usage, source="ended")
    params = _reply_update_params(connection, message_id, values, True) + upsert_params
    with connection.cursor() as cursor:
        cursor.execute(f"WITH ended AS ({update} RETURNING 1) {upsert}", params)
        return cursor.rowcount > 0


@functools.lru_cache(maxsize=64)
def _reply_update_sql(ops, names: tuple, only_streaming: bool) -> str:
    meta = Message._meta
    quote = ops.quote_name
    sql = (
        f"UPDATE {quote(meta.db_table)} SET "
        f"{', '.join(f'{quote(meta.get_field(name).column)} = %s' for name in names)} "
        f"WHERE {quote(meta.pk.column)} = %s"
    )
    if only_streaming:
        sql += f" AND {quote(meta.get_field('status').column)} = %s"
    return sql


def _reply_update_params(connection, message_id, values: dict, only_streaming: bool) -> list:
    meta = Message._meta
    params = [meta.get_field(name).get_db_prep_save(v, connection) for name, v in values.items()]
    params.append(meta.pk.get_db_prep_value(message_id, connection))
    if only_streaming:
        params.append(Message.Status.STREAMING)
    return params


def replies_interrupt_orphans(*, stale_after: float, exclude: set) -> list[Message]:
    """Replies left `streaming` by a site process that died: their relay stopped writing."""
    cutoff = timezone.now() - datetime.timedelta(seconds=stale_after)
    with transaction.atomic():
        orphans = list(
            Message.objects.select_for_update(of=("self",))
            .select_related("conversation", "reply_to")
            .filter(status=Message.Status.STREAMING, updated_at__lt=cutoff)
            .exclude(pk__in=exclude)
        )
        for message in orphans:
            message.status = Message.Status.INTERRUPTED
            message.error = "The site restarted while this reply was being written."
            message.retryable = True
            message.save(update_fields=["status", "error", "retryable", "updated_at"])
            usage_record(usage=_orphan_usage(message))
    return orphans


def _orphan_usage(message: Message) -> ReplyUsage:
    """The relay that measured this reply died with it: count the saved text, and the
    prompt as the site guesses it (the text shows the model had read it)."""
    conversation = message.conversation
    prompt_tokens = prompt.request_tokens(prompt.build_request(message)) if message.content else 0
    return ReplyUsage(
        user_id=conversation.owner_id,
        source=conversation.source,
        model=message.model,
        status=message.status,
        prompt_tokens=prompt_tokens,
        completion_tokens=len(message.content) // prompt.CHARS_PER_TOKEN,
    )


def _update_streaming_texts(contents: dict[uuid.UUID, tuple[str, int]], now) -> None:
    connection = connections[DEFAULT_DB_ALIAS]
    meta = Message._meta
    field = meta.get_field
    sql = (
        f"UPDATE {_quote(meta.db_table)} SET {_quote(field('content').column)} = %s, "
        f"{_quote(field('next_seq').column)} = %s, {_quote(field('updated_at').column)} = %s "
        f"WHERE {_quote(meta.pk.column)} = %s AND {_quote(field('status').column)} = %s"
    )
    stamp = field("updated_at").get_db_prep_value(now, connection)
    rows = [
        (
            content,
            next_seq,
            stamp,
            meta.pk.get_db_prep_value(message_id, connection),
            Message.Status.STREAMING,
        )
        for message_id, (content, next_seq) in contents.items()
    ]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _quote(name: str) -> str:
    connection = connections[DEFAULT_DB_ALIAS]
    return connection.ops.quote_name(name)
