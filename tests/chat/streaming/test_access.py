"""An open stream's access checks (chat/streaming/access.py) run where the database
connection is kept between calls, and let a failed connection go."""

import asyncio
import threading

import pytest
from django.db import OperationalError

from chat.streaming import access


class RecordingConnection:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_checks_run_on_one_thread_and_a_failed_connection_is_closed(monkeypatch):
    recording = RecordingConnection()
    monkeypatch.setattr(access, "connection", recording)
    threads = []

    def check() -> bool:
        threads.append(threading.get_ident())
        return True

    def failing_check() -> bool:
        threads.append(threading.get_ident())
        raise OperationalError("the database went away")

    async def scenario():
        for _ in range(3):
            assert await access._keeping_connection(check)()
        assert recording.closed == 0
        with pytest.raises(OperationalError):
            await access._keeping_connection(failing_check)()

    asyncio.run(scenario())
    assert recording.closed == 1
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
