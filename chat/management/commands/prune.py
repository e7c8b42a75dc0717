import datetime

from django.core.management.base import BaseCommand, CommandError
from django.db.models import QuerySet
from django.utils import timezone

from chat.models import Message
from chat.selectors import conversations_inactive_since

BATCH = 500


class Command(BaseCommand):
    # Events need no pruning: each site process keeps them in memory and forgets idle
    # channels itself, and the Redis log expires them.
    help = "Delete conversations with no activity for N days (their messages go with them)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--conversations-older-than",
            type=int,
            required=True,
            metavar="DAYS",
            help="Delete conversations with no activity for this many days (at least 1).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Print counts; delete nothing.")

    def handle(self, *args, conversations_older_than, dry_run, **options):
        days = conversations_older_than
        if days < 1:
            raise CommandError("--conversations-older-than must be at least 1 day.")
        verb = "would delete" if dry_run else "deleted"
        cutoff = timezone.now() - datetime.timedelta(days=days)
        conversations = conversations_inactive_since(cutoff=cutoff)
        messages = Message.objects.filter(conversation__in=conversations).count()
        count = conversations.count() if dry_run else self.delete(conversations, "conversations")
        self.stdout.write(
            f"{verb} {count} conversations ({messages} messages) inactive for {days} days"
        )

    def delete(self, queryset: QuerySet, label: str) -> int:
        """In batches, so a large table is never locked for one long transaction."""
        total = queryset.count()
        done = 0
        while done < total:
            pks = list(queryset.values_list("pk", flat=True)[:BATCH])
            if not pks:
                break
            queryset.model.objects.filter(pk__in=pks).delete()
            done += len(pks)
            if total > BATCH:
                self.stdout.write(f"  {label}: {done}/{total}")
        return done
