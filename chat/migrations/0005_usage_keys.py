# Usage accounting (UsageDay), token quota overrides (TokenQuota), API keys (ApiKey) and
# the source (page or API) of a conversation.

import django.db.models.deletion
import uuid
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('chat', '0004_conversation_tree'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='source',
            field=models.CharField(choices=[('page', 'Page'), ('api', 'Api')], default='page', max_length=8),
        ),
        migrations.CreateModel(
            name='ApiKey',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=100)),
                ('prefix', models.CharField(help_text='The start of the key, to recognise it.', max_length=16)),
                ('key_hash', models.CharField(max_length=64, unique=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_keys', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'verbose_name': 'API key',
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='TokenQuota',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('daily_tokens', models.PositiveBigIntegerField(blank=True, help_text="Tokens (prompt + completion) per UTC day. Blank: inherit (the user's groups, then the site). 0: no limit.", null=True)),
                ('monthly_tokens', models.PositiveBigIntegerField(blank=True, help_text="Tokens per calendar month (UTC). Blank: inherit (the user's groups, then the site). 0: no limit.", null=True)),
                ('group', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='token_quota', to='auth.group')),
                ('user', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='token_quota', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('group__isnull', True), ('user__isnull', False)), models.Q(('group__isnull', False), ('user__isnull', True)), _connector='OR'), name='token_quota_user_xor_group')],
            },
        ),
        migrations.CreateModel(
            name='UsageDay',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('day', models.DateField()),
                ('model', models.CharField(blank=True, max_length=200)),
                ('source', models.CharField(choices=[('page', 'Page'), ('api', 'Api')], max_length=8)),
                ('prompt_tokens', models.BigIntegerField(default=0)),
                ('completion_tokens', models.BigIntegerField(default=0)),
                ('replies', models.PositiveIntegerField(default=0)),
                ('failures', models.PositiveIntegerField(default=0)),
                ('cancellations', models.PositiveIntegerField(default=0)),
                ('ttft_count', models.PositiveIntegerField(default=0)),
                ('ttft_ms_total', models.BigIntegerField(default=0)),
                ('decode_tokens', models.BigIntegerField(default=0)),
                ('decode_ms', models.BigIntegerField(default=0)),
                ('ttft_le_50', models.PositiveIntegerField(default=0)),
                ('ttft_le_100', models.PositiveIntegerField(default=0)),
                ('ttft_le_200', models.PositiveIntegerField(default=0)),
                ('ttft_le_300', models.PositiveIntegerField(default=0)),
                ('ttft_le_500', models.PositiveIntegerField(default=0)),
                ('ttft_le_750', models.PositiveIntegerField(default=0)),
                ('ttft_le_1000', models.PositiveIntegerField(default=0)),
                ('ttft_le_1500', models.PositiveIntegerField(default=0)),
                ('ttft_le_2000', models.PositiveIntegerField(default=0)),
                ('ttft_le_3000', models.PositiveIntegerField(default=0)),
                ('ttft_le_5000', models.PositiveIntegerField(default=0)),
                ('ttft_le_10000', models.PositiveIntegerField(default=0)),
                ('ttft_le_20000', models.PositiveIntegerField(default=0)),
                ('ttft_le_60000', models.PositiveIntegerField(default=0)),
                ('ttft_slower', models.PositiveIntegerField(default=0)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='usage_days', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'indexes': [models.Index(fields=['day'], name='usage_day_day')],
                'constraints': [models.UniqueConstraint(fields=('user', 'day', 'model', 'source'), name='usage_day_unique')],
            },
        ),
    ]
