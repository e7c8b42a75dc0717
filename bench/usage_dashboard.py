"""How long the staff usage dashboard (/admin/usage/) takes on a year of a team's use.

    python -m bench.usage_dashboard                    # 200 users, 365 days, SQLite and PostgreSQL
    python -m bench.usage_dashboard --database sqlite --users 50 --days 90

For each database it makes a throwaway one (a temporary SQLite file; a new PostgreSQL
database at --postgres, dropped afterwards: skipped with the reason when PostgreSQL is not
there), migrates it, and fills UsageDay the way the relay does: every user on most days,
one to three models, some through the API, a few failures and cancellations. Then it
times, median and worst of --repeat runs:

- the figures' queries (chat.dashboard.usage_window: 30 days of sums by day, user, model);
- the whole page as staff get it (Django's test client: middleware, queries, template);
- the CSV download;
- the send-time quota check of one user (chat.usage.quota_exceeded, with quotas set).

The page's live server table is filled by the browser from servers.json afterwards, so no
inference server is asked here.
"""

import argparse
import datetime
import os
import random
import statistics
import sys
import tempfile
import time

from bench.throwaway import postgres_database, run_child

POSTGRES = "postgres://postgres@127.0.0.1:5432/postgres"
MODELS = ("SmolLM2-135M-Instruct", "llama-3.1-8b-instruct", "qwen2.5-coder-7b")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--database", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--postgres", default=POSTGRES, help="a server to make the database on")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


# --- data ----------------------------------------------------------------------------


def _ttft_buckets(replies: int, median_ms: float) -> dict[str, int]:
    """Most replies in the bucket of this day's typical TTFT, the rest in the next one."""
    from chat.models import TTFT_BUCKET_FIELDS, TTFT_BUCKETS_MS

    index = next(
        (i for i, bound in enumerate(TTFT_BUCKETS_MS) if median_ms <= bound), len(TTFT_BUCKETS_MS)
    )
    slow = replies // 5
    counts = {TTFT_BUCKET_FIELDS[index]: replies - slow}
    if slow:
        following = TTFT_BUCKET_FIELDS[min(index + 1, len(TTFT_BUCKET_FIELDS) - 1)]
        counts[following] = counts.get(following, 0) + slow
    return counts


def _row(rng: random.Random, user_id: int, day: datetime.date, model: str, source: str):
    from chat.models import UsageDay

    replies = rng.randint(1, 40 if source == "page" else 120)
    failures = rng.random() < 0.1 and rng.randint(1, max(1, replies // 10)) or 0
    cancellations = rng.random() < 0.2 and rng.randint(1, max(1, replies // 8)) or 0
    completion = replies * rng.randint(80, 600)
    answered = replies - failures
    ttft = rng.lognormvariate(5.8, 0.6)  # about 330 ms typical, a long tail
    seconds = completion / rng.uniform(15, 60)
    return UsageDay(
        user_id=user_id,
        day=day,
        model=model,
        source=source,
        prompt_tokens=replies * rng.randint(200, 3000),
        completion_tokens=completion,
        replies=replies,
        failures=failures,
        cancellations=cancellations,
        ttft_count=answered,
        ttft_ms_total=int(ttft * answered),
        decode_tokens=max(0, completion - answered),
        decode_ms=int(seconds * 1000),
        **_ttft_buckets(answered, ttft),
    )


def generate(
    *,
    users: int,
    days: int,
    prefix: str = "bench",
    seed: int = 7,
    today: datetime.date | None = None,
) -> dict:
    """Users named <prefix><n> and their UsageDay rows for the last `days` days. Returns
    how many users, rows and replies that is."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from chat.models import UsageDay

    rng = random.Random(seed)
    today = today or timezone.localdate()
    User = get_user_model()
    people = [User.objects.get_or_create(username=f"{prefix}{n}")[0] for n in range(users)]
    batch, rows, replies = [], 0, 0
    for person in people:
        habits = rng.sample(MODELS, rng.randint(1, 3))
        scripted = rng.random() < 0.3
        for back in range(days):
            day = today - datetime.timedelta(days=back)
            if rng.random() < (0.35 if day.weekday() >= 5 else 0.9):
                sources = ("page", "api") if scripted and rng.random() < 0.6 else ("page",)
                for model in habits[: rng.randint(1, len(habits))]:
                    for source in sources:
                        batch.append(_row(rng, person.id, day, model, source))
            if len(batch) >= 5000:
                rows, replies = rows + len(batch), replies + sum(r.replies for r in batch)
                UsageDay.objects.bulk_create(batch, ignore_conflicts=True)
                batch = []
    UsageDay.objects.bulk_create(batch, ignore_conflicts=True)
    rows, replies = rows + len(batch), replies + sum(r.replies for r in batch)
    return {"users": users, "rows": rows, "replies": replies}


# --- timing --------------------------------------------------------------------------


def _timed(fn, repeat: int) -> dict:
    fn()  # warm: connections, templates, the database's cache
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - started) * 1000)
    return {"median_ms": statistics.median(runs), "max_ms": max(runs)}


def measure(args) -> dict:
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    from chat import dashboard, usage

    setup_test_environment()  # the test client's ALLOWED_HOSTS and template signals
    settings.ALLOWED_HOSTS = ["*"]
    call_command("migrate", verbosity=0)
    started = time.perf_counter()
    data = generate(users=args.users, days=args.days, seed=args.seed)
    data["fill_s"] = time.perf_counter() - started
    staff = get_user_model().objects.create_user("bench-staff", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(staff)
    settings.CHAT_DAILY_TOKEN_QUOTA = 10**9
    settings.CHAT_MONTHLY_TOKEN_QUOTA = 10**10
    someone = get_user_model().objects.get(username="bench0")

    def page():
        response = client.get("/admin/usage/")
        assert response.status_code == 200, response.status_code

    data["timings"] = {
        "figures (usage_window)": _timed(dashboard.usage_window, args.repeat),
        "page /admin/usage/": _timed(page, args.repeat),
        "CSV /admin/usage/usage.csv": _timed(
            lambda: client.get("/admin/usage/usage.csv"), args.repeat
        ),
        "quota check at send": _timed(lambda: usage.quota_exceeded(user=someone), args.repeat),
    }
    return data


def report(name: str, data: dict) -> None:
    print(
        f"\n{name}: {data['users']} users, {data['rows']:,} UsageDay rows standing for "
        f"{data['replies']:,} replies (filled in {data['fill_s']:.1f} s)"
    )
    print(f"  {'what':<30} {'median':>10} {'worst':>10}")
    for what, timing in data["timings"].items():
        print(f"  {what:<30} {timing['median_ms']:>8.1f} ms {timing['max_ms']:>7.1f} ms")


# --- databases -----------------------------------------------------------------------


def _child(args, database_url: str, var_dir: str) -> int:
    argv = ["--users", str(args.users), "--days", str(args.days)]
    argv += ["--repeat", str(args.repeat), "--seed", str(args.seed)]
    return run_child("bench.usage_dashboard", argv, database_url=database_url, var_dir=var_dir)


def _on_postgres(args, var_dir: str) -> int:
    with postgres_database(args.postgres) as url:
        return _child(args, url, var_dir) if url else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        argv.remove("--child")
        args = parse_args(argv)
        engine = "PostgreSQL" if os.environ["DATABASE_URL"].startswith("postgres") else "SQLite"
        report(engine, measure(args))
        return 0
    args = parse_args(argv)
    status = 0
    with tempfile.TemporaryDirectory(prefix="usage-bench-") as var_dir:
        if args.database in ("sqlite", "both"):
            status |= _child(args, f"sqlite:///{var_dir}/bench.sqlite3", var_dir)
        if args.database in ("postgres", "both"):
            status |= _on_postgres(args, var_dir)
    return status


if __name__ == "__main__":
    sys.exit(main())
