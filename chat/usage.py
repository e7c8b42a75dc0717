"""Token accounting and quotas.

Every reply adds its tokens to one UsageDay row (user, UTC day, model, page or API) when it
ends, in the transaction that saves its final state: the totals survive restarts, and a
reply is counted exactly once, whether it completed, was stopped, failed or was interrupted.

Quotas are checked when a reply is asked for (chat/services.py), against what has been
counted so far: a reply in progress is never cut, so a user can go past a quota by at most
the replies they already had running.
"""

import datetime
import functools
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connections, transaction
from django.db.models import Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from chat import batch
from chat.batch import Statement
from chat.models import (
    TTFT_BUCKET_FIELDS,
    TTFT_BUCKETS_MS,
    Message,
    TokenQuota,
    UsageDay,
    UsageEvent,
)

ENDED_AS_FAILURE = {Message.Status.FAILED, Message.Status.INTERRUPTED}
# The window of the per-minute limits (UsageEvent rows older than it count for nothing).
RATE_WINDOW = datetime.timedelta(minutes=1)


@dataclass(frozen=True)
class ReplyUsage:
    """What one ended reply used, as the relay (or the sweeper) measured it."""

    user_id: int
    source: str
    model: str
    status: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: int | None = None
    duration_ms: int | None = None


def ttft_bucket_field(ttft_ms: int) -> str:
    for bound, name in zip(TTFT_BUCKETS_MS, TTFT_BUCKET_FIELDS):
        if ttft_ms <= bound:
            return name
    return TTFT_BUCKET_FIELDS[-1]


def _increments(usage: ReplyUsage) -> dict[str, int]:
    counts = {
        "prompt_tokens": usage.prompt_tokens or 0,
        "completion_tokens": usage.completion_tokens or 0,
        "replies": 1,
        "failures": int(usage.status in ENDED_AS_FAILURE),
        "cancellations": int(usage.status == Message.Status.CANCELLED),
    }
    if usage.ttft_ms is not None:
        counts.update(
            {"ttft_count": 1, "ttft_ms_total": usage.ttft_ms, ttft_bucket_field(usage.ttft_ms): 1}
        )
        tokens = usage.completion_tokens or 0
        decode_ms = (usage.duration_ms or 0) - usage.ttft_ms
        # The same rule as chat.rates.decode_rate: the first token's wait is not speed.
        if tokens >= 2 and decode_ms > 0:
            counts.update({"decode_tokens": tokens - 1, "decode_ms": decode_ms})
    return counts


def _day_row(
    *, usage: ReplyUsage, day: datetime.date | None = None
) -> tuple[dict[str, object], dict[str, int]]:
    """The UsageDay row one ended reply counts in (its unique key) and what it adds there."""
    key = {
        "user_id": usage.user_id,
        "day": day or timezone.localdate(),
        "model": usage.model[:200],
        "source": usage.source,
    }
    return key, _increments(usage)


def usage_upsert_from(connection, *, usage: ReplyUsage, source: str) -> tuple[str, list]:
    """SQL and parameters that add one ended reply to its UsageDay row, an INSERT … ON
    CONFLICT DO UPDATE of each count, for every row of `source` (a table or WITH name: the
    caller decides whether the reply counts). PostgreSQL only; usage_record elsewhere."""
    key, counts = _day_row(usage=usage)
    sql, fields = _upsert_sql(connection.ops, tuple(key), source)
    row = {**key, **counts}
    params = [
        f.get_db_prep_save(row[f.attname] if f.attname in row else f.get_default(), connection)
        for f in fields
    ]
    return sql, params


@functools.lru_cache(maxsize=16)
def _upsert_sql(ops, key: tuple, source: str) -> tuple[str, list]:
    """Made once per connection (`ops` is its own). The values are cast to their columns'
    types, which PostgreSQL would not infer for a SELECT list under server-side binding;
    every column outside the key is a count, added on conflict."""
    meta = UsageDay._meta
    quote = ops.quote_name
    table = quote(meta.db_table)
    fields = [f for f in meta.concrete_fields if f is not meta.auto_field]
    counters = [quote(f.column) for f in fields if f.attname not in key]
    values = ", ".join(f"CAST(%s AS {f.db_type(ops.connection)})" for f in fields)
    sql = (
        f"INSERT INTO {table} ({', '.join(quote(f.column) for f in fields)}) "
        f"SELECT {values} FROM {source} "
        f"ON CONFLICT ({', '.join(quote(meta.get_field(name).column) for name in key)}) "
        f"DO UPDATE SET {', '.join(f'{c} = {table}.{c} + EXCLUDED.{c}' for c in counters)}"
    )
    return sql, fields


def usage_record(*, usage: ReplyUsage, day: datetime.date | None = None) -> None:
    """Add one ended reply to its UsageDay row. Call inside the transaction that saves the
    reply's final state, so that the two commit together or not at all."""
    key, counts = _day_row(usage=usage, day=day)
    if _add_to_day(key, counts):
        return
    try:
        # A savepoint: on PostgreSQL a failed INSERT would abort the whole transaction.
        with transaction.atomic():
            UsageDay.objects.create(**key, **counts)
    except IntegrityError:  # another reply of this user created the row first
        _add_to_day(key, counts)


def _add_to_day(key: dict, counts: dict[str, int]) -> bool:
    """UPDATE the day's row, each count added (`f = f + n`); False if there is no row.
    Written as SQL: resolving an F() expression for each of ten columns was most of the
    CPU of a reply's final save (what the ORM would run is the same statement)."""
    connection = connections[DEFAULT_DB_ALIAS]
    meta = UsageDay._meta
    quote = connection.ops.quote_name
    columns = {name: quote(meta.get_field(name).column) for name in [*counts, *key]}
    assignments = ", ".join(f"{columns[name]} = {columns[name]} + %s" for name in counts)
    condition = " AND ".join(f"{columns[name]} = %s" for name in key)
    params = [*counts.values()]
    params += [
        meta.get_field(name).get_db_prep_value(value, connection) for name, value in key.items()
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {condition}", params)
        return cursor.rowcount > 0


def usage_events_prune(now: datetime.datetime | None = None) -> int:
    """Delete the rate-limit rows older than the window: the relay's sweeper does it every
    few seconds, so that a send need not (they count for nothing once old)."""
    cutoff = (now or timezone.now()) - RATE_WINDOW
    deleted, _ = UsageEvent.objects.filter(created_at__lt=cutoff).delete()
    return deleted


# --- what a user used ----------------------------------------------------------------


def period_starts(now: datetime.datetime | None = None) -> dict[str, datetime.date]:
    today = timezone.localdate(now)
    return {"day": today, "month": today.replace(day=1)}


def resets_at(period: str, now: datetime.datetime | None = None) -> datetime.datetime:
    """When a daily or monthly quota starts again: the next UTC midnight, or the first of
    next month."""
    today = timezone.localdate(now)
    if period == "daily":
        start = today + datetime.timedelta(days=1)
    else:
        start = (today.replace(day=28) + datetime.timedelta(days=4)).replace(day=1)
    return datetime.datetime.combine(start, datetime.time(), tzinfo=datetime.UTC)


FIGURES = ("prompt_tokens", "completion_tokens", "replies")


def user_usage(*, user, now: datetime.datetime | None = None) -> dict[str, dict]:
    """The user's tokens and replies today and this month (UTC), counted as replies end.
    One query over at most a month of the user's rows."""
    starts = period_starts(now)
    rows = UsageDay.objects.filter(user=user, day__gte=starts["month"], day__lte=starts["day"])
    sums = {}
    for name in FIGURES:
        sums[f"today_{name}"] = Coalesce(Sum(name, filter=Q(day=starts["day"])), 0)
        sums[f"month_{name}"] = Coalesce(Sum(name), 0)
    totals = rows.aggregate(**sums)
    usage = {}
    for period in ("today", "month"):
        figures = {name: totals[f"{period}_{name}"] for name in FIGURES}
        figures["total_tokens"] = figures["prompt_tokens"] + figures["completion_tokens"]
        usage[period] = figures
    return usage


# --- quotas --------------------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    period: str  # "daily" or "monthly"
    tokens: int | None  # None: no limit
    set_by: str  # "user", "group" or "site"


PERIODS = (
    ("daily", "daily_tokens", "CHAT_DAILY_TOKEN_QUOTA"),
    ("monthly", "monthly_tokens", "CHAT_MONTHLY_TOKEN_QUOTA"),
)


def _most_generous(values: list[int]) -> int:
    return 0 if 0 in values else max(values)


def user_limits(*, user, overrides: list | None = None) -> list[Limit]:
    """The quotas that apply to the user (a user or a user id): their own override, else
    the most generous of their groups' overrides, else the site's; 0 at any level means no
    limit. One query for both kinds of override (every send asks), unless the caller read
    its rows already (overrides: overrides_statement's rows)."""
    if overrides is None:
        overrides = batch.run([overrides_statement(user_id=getattr(user, "pk", user))])[0].rows
    own, groups = None, []
    for quota in (dict(zip(OVERRIDE_FIELDS, row)) for row in overrides):
        if quota["user"] is not None:
            own = own or quota
        else:
            groups.append(quota)
    limits = []
    for period, field, setting in PERIODS:
        group_values = [q[field] for q in groups if q[field] is not None]
        if own is not None and own[field] is not None:
            value, set_by = own[field], "user"
        elif group_values:
            value, set_by = _most_generous(group_values), "group"
        else:
            value, set_by = getattr(settings, setting), "site"
        limits.append(Limit(period, value or None, set_by))
    return limits


OVERRIDE_FIELDS = ("user", "daily_tokens", "monthly_tokens")


def overrides_statement(*, user_id) -> Statement:
    """The user's own TokenQuota and their groups' (OVERRIDE_FIELDS), oldest first. Written
    as SQL: the ORM's work to build this OR of a subquery was a tenth of a send's CPU, and
    every send asks."""
    return Statement(_overrides_sql(connections[DEFAULT_DB_ALIAS].ops), [user_id, user_id])


@functools.lru_cache(maxsize=256)
def _overrides_sql(ops) -> str:
    """Made once per connection (`ops` is its own), not every send."""
    quota, member = TokenQuota._meta, get_user_model().groups.through._meta
    quote = ops.quote_name

    def column(meta, name: str) -> str:
        return quote(meta.get_field(name).column)

    return (
        f"SELECT {', '.join(column(quota, name) for name in OVERRIDE_FIELDS)}"
        f" FROM {quote(quota.db_table)} WHERE {column(quota, 'user')} = %s"
        f" OR {column(quota, 'group')} IN (SELECT {column(member, 'group')}"
        f" FROM {quote(member.db_table)} WHERE {column(member, 'user')} = %s)"
        f" ORDER BY {column(quota, 'id')}"
    )


@dataclass(frozen=True)
class QuotaState:
    limit: Limit
    used: int
    resets_at: datetime.datetime

    @property
    def exceeded(self) -> bool:
        return self.limit.tokens is not None and self.used >= self.limit.tokens

    @property
    def remaining(self) -> int | None:
        return None if self.limit.tokens is None else max(0, self.limit.tokens - self.used)


def user_quotas(
    *,
    user,
    now: datetime.datetime | None = None,
    usage: dict | None = None,
    limits: list[Limit] | None = None,
) -> list[QuotaState]:
    usage = usage or user_usage(user=user, now=now)
    used = {"daily": usage["today"]["total_tokens"], "monthly": usage["month"]["total_tokens"]}
    return [
        QuotaState(limit, used[limit.period], resets_at(limit.period, now))
        for limit in (limits or user_limits(user=user))
    ]


def quota_exceeded(
    *, user, now: datetime.datetime | None = None, overrides: list | None = None
) -> QuotaState | None:
    """The first quota the user (or user id) has used up, or None. Skips the usage query
    when no quota applies (the default). overrides: as for user_limits."""
    limits = user_limits(user=user, overrides=overrides)
    if all(limit.tokens is None for limit in limits):
        return None
    quotas = user_quotas(user=user, now=now, limits=limits)
    return next((q for q in quotas if q.exceeded), None)


def quota_sentence(state: QuotaState, now: datetime.datetime | None = None) -> str:
    now = now or timezone.now()
    left = state.resets_at - now
    hours, minutes = divmod(max(1, round(left.total_seconds() / 60)), 60)
    wait = f"{hours} h {minutes} min" if hours else f"{minutes} min"
    when = state.resets_at.strftime("%Y-%m-%d %H:%M UTC")
    tokens = f"{state.limit.tokens:,} token{'s' if state.limit.tokens != 1 else ''}"
    return (
        f"You have used your {state.limit.period} quota of {tokens}. "
        f"It resets at {when} (in {wait})."
    )
