"""Replies being written indexed by (status, conversation) instead of (status, updated_at).

Every flush of a streaming reply's text sets updated_at: indexed, it kept PostgreSQL from
updating the row in place (HOT), so each flush added an entry to every index of the table,
and a send's count of the replies being written read through all the dead versions under
'streaming' until a vacuum. The new index also serves that count by conversation directly.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0007_fk_indexes_in_composites"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="message",
            name="msg_status_age",
        ),
        migrations.AddIndex(
            model_name="message",
            index=models.Index(fields=["status", "conversation"], name="msg_streaming"),
        ),
    ]
