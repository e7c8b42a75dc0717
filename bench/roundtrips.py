"""What one round trip to the database and to the session cache costs the site's process,
and how many statements a send makes: SQLite and PostgreSQL side by side in one run.

    python -m bench.roundtrips                                  # SQLite, PostgreSQL, Redis
    python -m bench.roundtrips --database sqlite --repeat 2000

A message's send is a handful of short statements, so on PostgreSQL its CPU in the site's
process is mostly the client's side of each round trip (Django's cursor, psycopg, the
socket), not the work the database does. For each database this makes a throwaway one (a
temporary SQLite file; a new PostgreSQL database at --postgres, dropped afterwards: skipped
with the reason when PostgreSQL is not there), migrates it, and prints, as the best of three
blocks of --repeat calls, the CPU time of this process (time.process_time: user + system) of:

- one one-row SELECT through Django's cursor;
- the same inside transaction.atomic() (BEGIN and COMMIT are round trips of their own);
- one read of a session from the sessions cache (this process's memory, or Redis when
  --redis-url is given to the PostgreSQL run, as the scaled-out setup has it);
- one new conversation (chat.services.conversation_create: the user's lock, the per-minute
  count, its rate row and its own), with the statements it ran;
- one send (chat.services.message_send_to: the locks, the admission checks, both rows),
  with the statements it ran, BEGIN and COMMIT included (BENCH_SHOW_STATEMENTS=1 prints
  them). The reply's relay is not started here (its start reads the history);
- that reply's final save (chat.relay.saving.reply_finish: its end and its usage).
"""

import argparse
import logging
import os
import sys
import tempfile
import time

from bench.throwaway import postgres_database, run_child

POSTGRES = "postgres://postgres@127.0.0.1:5432/postgres"
REDIS = "redis://127.0.0.1:6379/7"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1000, help="calls per timed block")
    parser.add_argument("--database", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--postgres", default=POSTGRES, help="a server to make the database on")
    parser.add_argument(
        "--redis-url", default=REDIS, help="the sessions cache of the PostgreSQL run ('': none)"
    )
    return parser.parse_args(argv)


def _cpu_us(fn, repeat: int) -> float:
    """CPU microseconds per call, best of three blocks (the machine's noise only adds)."""
    fn()  # warm: the connection, psycopg's query cache
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, (time.process_time() - started) / repeat * 1e6)
    return best


def measure(repeat: int) -> dict:
    import django

    django.setup()
    from django.conf import settings
    from django.core.cache import caches
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from chat import services
    from chat.models import Message
    from chat.relay import saving
    from chat.usage import ReplyUsage
    from tests.support.factories import create_user

    call_command("migrate", verbosity=0)
    # One user sends them all: the per-minute limits would refuse the second block.
    settings.CHAT_MESSAGES_PER_MINUTE = 10**9
    settings.CHAT_CONVERSATIONS_PER_MINUTE = 10**9
    # No event loop here: the committed replies' relays are not started (and not logged).
    logging.getLogger("chat.relay").setLevel(logging.CRITICAL)
    user = create_user()

    def select():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM auth_user WHERE id = %s", [user.pk])
            cursor.fetchone()

    def in_transaction():
        with transaction.atomic():
            select()

    sessions = caches["sessions"]
    sessions.set("bench-session", {"_auth_user_id": str(user.pk), "_auth_user_hash": "x" * 64})

    reply_usage = ReplyUsage(
        user_id=user.pk, source="page", model="m", status="complete", ttft_ms=90
    )
    final_fields = {"status": Message.Status.COMPLETE, "content": "hello", "completion_tokens": 1}

    def send() -> tuple[float, float, float]:
        """The CPU of a new conversation, of one send on it, and of its reply's final save
        as the relay makes it (so that the user's count of replies being written stays 0)."""
        started = time.process_time()
        conversation = services.conversation_create(owner=user)
        created_at = time.process_time()
        sent = services.message_send_to(
            owner_id=user.pk, conversation_id=conversation.pk, content="hi"
        )
        sent_at = time.process_time()
        saving.reply_finish(
            message_id=sent.assistant_message.pk, fields=final_fields, usage=reply_usage
        )
        return created_at - started, sent_at - created_at, time.process_time() - sent_at

    send()  # warm: the connection, psycopg's query cache, the day's usage row
    with CaptureQueriesContext(connection) as create_statements:
        conversation = services.conversation_create(owner=user)
    with CaptureQueriesContext(connection) as statements:
        sent = services.message_send_to(
            owner_id=user.pk, conversation_id=conversation.pk, content="hi"
        )
    with CaptureQueriesContext(connection) as finish_statements:
        saving.reply_finish(
            message_id=sent.assistant_message.pk, fields=final_fields, usage=reply_usage
        )
    if os.environ.get("BENCH_SHOW_STATEMENTS"):
        captured = [create_statements, statements, finish_statements]
        for query in [q for context in captured for q in context.captured_queries]:
            print(query["sql"][:150])
    blocks = [[send() for _ in range(repeat)] for _ in range(3)]
    return {
        "select": _cpu_us(select, repeat),
        "atomic": _cpu_us(in_transaction, repeat),
        "session": _cpu_us(lambda: sessions.get("bench-session"), repeat),
        "create": min(sum(c for c, _, _ in block) / repeat * 1e6 for block in blocks),
        "send": min(sum(s for _, s, _ in block) / repeat * 1e6 for block in blocks),
        "finish": min(sum(f for _, _, f in block) / repeat * 1e6 for block in blocks),
        "create_statements": len(create_statements.captured_queries),
        "statements": len(statements.captured_queries),
        "finish_statements": len(finish_statements.captured_queries),
    }


def report(name: str, data: dict) -> None:
    print(f"\n{name}: CPU of this process per call (best of 3 blocks)")
    print(f"  one-row SELECT                      {data['select']:8.1f} µs")
    print(f"  the same in a transaction           {data['atomic']:8.1f} µs")
    print(f"  a session read from the cache       {data['session']:8.1f} µs")
    print(
        f"  a new conversation (conversation_create) {data['create'] / 1000:5.2f} ms"
        f"  ({data['create_statements']} statements, BEGIN and COMMIT included)"
    )
    print(
        f"  a send (message_send_to)            {data['send'] / 1000:8.2f} ms"
        f"  ({data['statements']} statements, BEGIN and COMMIT included)"
    )
    print(
        f"  its reply's final save (reply_finish) {data['finish'] / 1000:8.2f} ms"
        f"  ({data['finish_statements']} statements)"
    )


# --- databases -----------------------------------------------------------------------


def _child(args, database_url: str, var_dir: str, redis_url: str = "") -> int:
    argv = ["--repeat", str(args.repeat)]
    return run_child(
        "bench.roundtrips", argv, database_url=database_url, var_dir=var_dir, REDIS_URL=redis_url
    )


def _redis_or_none(url: str) -> str:
    if not url:
        return ""
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except Exception as exc:  # not running: the PostgreSQL run keeps its sessions in memory
        print(f"\nRedis at {url}: not used ({exc})")
        return ""
    return url


def _on_postgres(args, var_dir: str) -> int:
    with postgres_database(args.postgres) as url:
        return _child(args, url, var_dir, _redis_or_none(args.redis_url)) if url else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:
        argv.remove("--child")
        args = parse_args(argv)
        url = os.environ["DATABASE_URL"]
        name = "PostgreSQL" if url.startswith("postgres") else "SQLite"
        name += " + Redis sessions" if os.environ.get("REDIS_URL") else " + in-memory sessions"
        report(name, measure(args.repeat))
        return 0
    args = parse_args(argv)
    status = 0
    with tempfile.TemporaryDirectory(prefix="roundtrips-bench-") as var_dir:
        if args.database in ("sqlite", "both"):
            status |= _child(args, f"sqlite:///{var_dir}/bench.sqlite3", var_dir)
        if args.database in ("postgres", "both"):
            status |= _on_postgres(args, var_dir)
    return status


if __name__ == "__main__":
    sys.exit(main())
