"""Many requests of one user at the same moment, each in its own thread and database
connection, as daphne runs sync views: what the per-user limits let through.

Run against a real database: `DATABASE_URL=postgres://… python -m tests.support.limit_race
send 8`. Prints one JSON object: {"accepted": n, "refused": n, "errors": [...]}.
"""

import json
import sys
import threading

import django


def race(action: str, attempts: int) -> dict:
    from django.db import connection

    from chat import services
    from chat.models import Conversation, Message
    from tests.support.factories import (
        create_conversation,
        create_message,
        create_user,
        unique_name,
    )

    user = create_user(unique_name("racer"))
    conversations = [create_conversation(owner=user) for _ in range(attempts)]
    replies = []
    if action == "regenerate":
        for conversation in conversations:
            question = create_message(conversation, content="q")
            replies.append(create_message(conversation, role="assistant", reply_to=question))
    barrier = threading.Barrier(attempts)
    results: list[str] = []

    def attempt(index: int) -> None:
        try:
            barrier.wait()
            if action == "send":
                conversation = Conversation.objects.get(pk=conversations[index].pk)
                services.message_send(conversation=conversation, content="hi")
            elif action == "regenerate":
                reply = Message.objects.get(pk=replies[index].pk)
                services.reply_regenerate(reply=reply)
            else:
                services.conversation_create(owner=user, title="t")
            results.append("accepted")
        except services.RateLimited:
            results.append("refused")
        except Exception as exc:  # reported, so a deadlock or a crash fails the test
            results.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(attempts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "accepted": results.count("accepted"),
        "refused": results.count("refused"),
        "errors": [r for r in results if r not in ("accepted", "refused")],
    }


if __name__ == "__main__":
    django.setup()
    print(json.dumps(race(sys.argv[1], int(sys.argv[2]))))
