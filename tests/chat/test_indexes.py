"""The chat tables' indexes: every foreign key's lookups use one (a cascade or a filter by it
does not scan the table), none is only the start of another (one more B-tree written on
every insert for nothing: three such were written in every send, migration 0007), and none
holds a column that the relay's flushes of streamed text write (migration 0008)."""

import re

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.test.utils import CaptureQueriesContext

from chat.models import Conversation, Message, UsageDay, UsageEvent
from chat.relay import saving
from tests.support.factories import create_conversation, create_message

pytestmark = pytest.mark.django_db(transaction=True)


def indexes(table: str) -> list[tuple[list[str], bool]]:
    """(columns, unique) of each index on `table`, primary key included."""
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return [
        (info["columns"], bool(info["unique"] or info["primary_key"]))
        for info in found.values()
        if info["index"] or info["primary_key"] or info["unique"]
    ]


def chat_models():
    return [m for m in apps.get_app_config("chat").get_models() if not m._meta.proxy]


def test_every_foreign_key_leads_an_index():
    for model in chat_models():
        leading = {columns[0] for columns, _ in indexes(model._meta.db_table)}
        for field in model._meta.concrete_fields:
            if field.is_relation:
                assert field.column in leading, f"{model.__name__}.{field.name} has no index"


def test_no_plain_index_is_the_start_of_another():
    for model in chat_models():
        table = indexes(model._meta.db_table)
        for columns, unique in table:
            if unique:
                continue  # a constraint, not only a lookup
            longer = [c for c, _ in table if len(c) > len(columns) and c[: len(columns)] == columns]
            assert not longer, f"{model._meta.db_table}: {columns} is the start of {longer[0]}"


def single_column_indexes(table: str, column: str) -> int:
    return sum(1 for columns, unique in indexes(table) if columns == [column] and not unique)


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("chat", target)])


def latest_migration() -> str:
    (leaf,) = MigrationLoader(connection).graph.leaf_nodes("chat")
    return leaf[1]


def columns_set_by(sql: str) -> set[str]:
    """The columns an UPDATE statement assigns."""
    assignments = re.search(r"\bSET\b(.*?)\bWHERE\b", sql, re.S | re.I).group(1)
    return {name.strip('"`[] ') for name in re.findall(r'([\w"`\[\]]+)\s*=', assignments)}


def test_no_index_holds_a_column_that_flushing_streamed_text_writes():
    """A flush runs for every streaming reply twice a second. PostgreSQL can update such a
    row in place (HOT, no new index entries) only when no indexed column changes; with
    updated_at indexed every flush wrote every index anew, and a send's count of replies
    being written read through all those dead entries (bench/README.md)."""
    conversation = create_conversation()
    writing = create_message(conversation, role="assistant", content="", status="streaming")
    idle = create_message(conversation, role="assistant", content="", status="streaming")
    with CaptureQueriesContext(connection) as queries:
        saving.reply_flush(contents={writing.id: ("Once", 1)}, alive=[writing.id, idle.id])
    # An executemany is logged as "N times: UPDATE …".
    statements = [re.sub(r"^\d+ times: ", "", q["sql"]) for q in queries]
    updates = [sql for sql in statements if sql.lstrip().upper().startswith("UPDATE")]
    written = set().union(*(columns_set_by(sql) for sql in updates))
    assert {"content", "next_seq", "updated_at"} <= written, updates
    indexed = {c for columns, _ in indexes(Message._meta.db_table) for c in columns}
    assert not written & indexed, f"a flush writes indexed columns {written & indexed}"


def test_the_replies_being_written_are_found_by_status_and_conversation():
    assert (["status", "conversation_id"], False) in indexes(Message._meta.db_table)


def test_migration_0007_drops_the_four_indexes_and_back():
    dropped = [
        (Conversation._meta.db_table, "owner_id"),
        (Message._meta.db_table, "conversation_id"),
        (UsageEvent._meta.db_table, "user_id"),
        (UsageDay._meta.db_table, "user_id"),
    ]
    assert all(single_column_indexes(t, c) == 0 for t, c in dropped)
    try:
        migrate("0006_sampling_settings")
        assert all(single_column_indexes(t, c) == 1 for t, c in dropped)
    finally:
        migrate(latest_migration())
    assert all(single_column_indexes(t, c) == 0 for t, c in dropped)
