"""Drops the single-column indexes of four foreign keys that lead a composite index
(conv_owner_recent, msg_conv_order, usage_user_recent, usage_day_unique): that index serves
their lookups, and each second index was one more B-tree written (three of them in every
send).

The database side drops the indexes by what they index, not with AlterField: on SQLite
AlterField rebuilds the whole table (every message copied) to drop one index.
"""

from django.conf import settings
from django.db import migrations, models

FIELDS = [
    ("conversation", "owner"),
    ("message", "conversation"),
    ("usageevent", "user"),
    ("usageday", "user"),
]


def _single_column_indexes(schema_editor, model, field):
    return schema_editor._constraint_names(model, [field.column], index=True, unique=False)


def drop_indexes(apps, schema_editor):
    for model_name, field_name in FIELDS:
        model = apps.get_model("chat", model_name)
        field = model._meta.get_field(field_name)
        for name in _single_column_indexes(schema_editor, model, field):
            schema_editor.execute(schema_editor._delete_index_sql(model, name))


def create_indexes(apps, schema_editor):
    for model_name, field_name in FIELDS:
        model = apps.get_model("chat", model_name)
        field = model._meta.get_field(field_name)
        if not _single_column_indexes(schema_editor, model, field):
            schema_editor.execute(schema_editor._create_index_sql(model, fields=[field]))


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0006_sampling_settings"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
            state_operations=[
                migrations.AlterField(
                    model_name="conversation",
                    name="owner",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="conversations",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="conversation",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="messages",
                        to="chat.conversation",
                    ),
                ),
                migrations.AlterField(
                    model_name="usageday",
                    name="user",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="usage_days",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="usageevent",
                    name="user",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=models.deletion.CASCADE,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        )
    ]
