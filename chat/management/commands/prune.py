import datetime

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone
from django_eventstream.models import Event

from chat.models import Conversation, Message

BATCH = 500


class Command(BaseCommand):
    # The relay's in-memory event log lives inside each site process and forgets idle
    # channels itself; another process cannot reach it, so only database rows are pruned.
    help = "Delete old django-eventstream events and, if asked, conversations inactive for N days."

    def add_arguments(self, parser):
        parser.add_argument(
            "--events-older-than", type=int, default=7, metavar="DAYS",
            help="Delete django-eventstream events older than this many days (default 7).",
        )
        parser.add_argument(
            "--conversations-older-than", type=int, default=None, metavar="DAYS",
            help="Also delete conversations with no activity for this many days "
            "(off unless given).",
        )
        parser.add_argument("--dry-run", action="store_true", help="Print counts; delete nothing.")

    def handle(self, *args, events_older_than, conversations_older_than, dry_run, **options):
        if events_older_than < 0:
            raise CommandError("--events-older-than must be 0 or more days.")
        if conversations_older_than is not None and conversations_older_than < 1:
            raise CommandError("--conversations-older-than must be at least 1 day.")
        verb = "would delete" if dry_run else "deleted"
        events = Event.objects.filter(created__lt=_days_ago(events_older_than))
        count = events.count() if dry_run else self.delete(events, "events")
        self.stdout.write(f"{verb} {count} events older than {events_older_than} days")
        if conversations_older_than is not None:
            self.prune_conversations(conversations_older_than, dry_run=dry_run, verb=verb)

    def prune_conversations(self, days: int, *, dry_run: bool, verb: str) -> None:
        conversations = inactive_conversations(_days_ago(days))
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


def _days_ago(days: int) -> datetime.datetime:
    return timezone.now() - datetime.timedelta(days=days)


def inactive_conversations(cutoff: datetime.datetime) -> QuerySet[Conversation]:
    # Replies are saved without touching the conversation row: a message updated after
    # the cutoff keeps it, and a reply still streaming always does.
    recent = Message.objects.filter(conversation=OuterRef("pk"), updated_at__gte=cutoff)
    streaming = Message.objects.filter(conversation=OuterRef("pk"), status=Message.Status.STREAMING)
    return Conversation.objects.filter(updated_at__lt=cutoff).exclude(Exists(recent)).exclude(
        Exists(streaming)
    )
