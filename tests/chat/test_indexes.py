"""The chat tables' indexes: every foreign key's lookups use one (a cascade or a filter by it
does not scan the table), and none is only the start of another (one more B-tree written on
every insert for nothing: three such were written in every send, migration 0007)."""

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from chat.models import Conversation, Message, UsageDay, UsageEvent

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
        migrate("0007_fk_indexes_in_composites")
    assert all(single_column_indexes(t, c) == 0 for t, c in dropped)
