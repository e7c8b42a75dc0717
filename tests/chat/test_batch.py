"""chat/batch.py: statements sent together. The same contract on SQLite (one at a time) and
on the real PostgreSQL (one round trip), checked once and run against both."""

import dj_database_url
import pytest
from django.db import DatabaseError
from django.db.utils import ConnectionHandler

from chat import batch
from chat.batch import Statement
from tests.support.postgres import Unavailable, scratch_database


@pytest.fixture(scope="module")
def postgres_database():
    try:
        with scratch_database("tokenstream_batch") as url:
            yield url
    except Unavailable as exc:
        pytest.skip(str(exc))


def _connections(url: str, monkeypatch) -> ConnectionHandler:
    handler = ConnectionHandler({"default": dj_database_url.parse(url)})
    monkeypatch.setattr(batch, "connections", handler)
    connection = handler["default"]
    connection.force_debug_cursor = True  # queries_log: what went to the database
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS batch_item")
        cursor.execute("CREATE TABLE batch_item (id integer PRIMARY KEY, name varchar(20))")
    connection.queries_log.clear()
    return handler


class BatchContract:
    """Whatever the database: each statement's result, in order, as if sent alone."""

    round_trips_for_three: int

    @pytest.fixture
    def connection(self, database_url, monkeypatch, django_db_blocker):
        with django_db_blocker.unblock():
            handler = _connections(database_url, monkeypatch)
            yield handler["default"]
            handler.close_all()

    def test_each_statement_gives_its_own_result_in_order(self, connection):
        results = batch.run(
            [
                Statement(
                    "INSERT INTO batch_item (id, name) VALUES (%s, %s), (%s, %s)", [1, "a", 2, "b"]
                ),
                Statement("SELECT name FROM batch_item WHERE id = %s", [2]),
                Statement("UPDATE batch_item SET name = %s WHERE id >= %s", ["z", 1]),
                Statement("SELECT id, name FROM batch_item ORDER BY id", []),
            ]
        )
        assert [r.rows for r in results] == [[], [("b",)], [], [(1, "z"), (2, "z")]]
        assert results[0].rowcount == 2 and results[2].rowcount == 2

    def test_a_statement_sees_what_the_ones_before_it_wrote(self, connection):
        results = batch.run(
            [
                Statement("INSERT INTO batch_item (id, name) VALUES (%s, %s)", [7, "x"]),
                Statement("SELECT COUNT(*) FROM batch_item WHERE name = %s", ["x"]),
            ]
        )
        assert results[1].rows == [(1,)]

    def test_an_empty_select_gives_no_rows(self, connection):
        (result,) = batch.run([Statement("SELECT id FROM batch_item WHERE id = %s", [99])])
        assert result.rows == []

    def test_a_failing_statement_raises_and_its_transaction_keeps_nothing(self, connection):
        connection.set_autocommit(False)
        try:
            with pytest.raises(DatabaseError):
                batch.run(
                    [
                        Statement("INSERT INTO batch_item (id, name) VALUES (%s, %s)", [1, "a"]),
                        Statement("INSERT INTO batch_item (id, name) VALUES (%s, %s)", [1, "b"]),
                        Statement("INSERT INTO batch_item (id, name) VALUES (%s, %s)", [3, "c"]),
                    ]
                )
        finally:
            connection.rollback()
            connection.set_autocommit(True)
        (result,) = batch.run([Statement("SELECT COUNT(*) FROM batch_item", [])])
        assert result.rows == [(0,)]

    def test_three_statements_take_the_backends_round_trips(self, connection):
        batch.run([Statement("SELECT %s", [n]) for n in range(3)])
        assert len(connection.queries_log) == self.round_trips_for_three


class TestOnSQLite(BatchContract):
    round_trips_for_three = 3  # SQLite runs one statement per call

    @pytest.fixture
    def database_url(self, tmp_path):
        return f"sqlite:///{tmp_path / 'batch.sqlite3'}"


class TestOnPostgreSQL(BatchContract):
    round_trips_for_three = 1

    @pytest.fixture
    def database_url(self, postgres_database):
        return postgres_database

    def test_server_side_binding_sends_them_one_at_a_time(
        self, database_url, monkeypatch, django_db_blocker
    ):
        config = dj_database_url.parse(database_url)
        config["OPTIONS"] = {"server_side_binding": True}
        handler = ConnectionHandler({"default": config})
        monkeypatch.setattr(batch, "connections", handler)
        connection = handler["default"]
        connection.force_debug_cursor = True
        with django_db_blocker.unblock():
            results = batch.run([Statement("SELECT %s::int", [n]) for n in range(3)])
            handler.close_all()
        assert [r.rows for r in results] == [[(0,)], [(1,)], [(2,)]]
        assert len(connection.queries_log) == 3
