"""Statements sent together: one round trip to PostgreSQL where there were several.

A send's reads under the user's lock, and then its writes, are several statements that do
not depend on each other's results until all of them have run. Sent one at a time, each
is a round trip, and on PostgreSQL each cost the site's process CPU of its own (~25 µs
through Django's cursor and psycopg on an idle machine, more during a burst of sends)
besides the wait.

With Django's default client-side binding (psycopg's ClientCursor), statements joined by
semicolons go as one query: the server runs them one after another in the caller's
transaction, each with its own snapshot and locks exactly as if it had been sent alone,
stops at the first that fails, and returns one result each (cursor.nextset()). Elsewhere
(SQLite runs one statement per call; server-side binding cannot carry several) they run
one at a time, with the same results.
"""

import functools
from dataclasses import dataclass, field

from django.db import DEFAULT_DB_ALIAS, connections


@dataclass(frozen=True)
class Statement:
    sql: str  # one statement, %s for each of params, no trailing semicolon; rows if SELECT
    params: list = field(default_factory=list)


@dataclass(frozen=True)
class Result:
    rows: list  # the rows as the database driver gives them; empty for a write
    rowcount: int


def run(statements: list[Statement]) -> list[Result]:
    """Each statement's result, in order; one round trip where the database allows it.

    The results are read from the driver's own cursor, with Django's translation of its
    errors: through Django's wrapper each attribute is a lookup and each fetch a wrapped
    call, and psycopg builds a column description each time it is asked whether there are
    rows (a SELECT is what has them, here)."""
    connection = connections[DEFAULT_DB_ALIAS]
    with connection.cursor() as cursor, connection.wrap_database_errors:
        raw = cursor.cursor
        if len(statements) > 1 and sends_together(connection):
            cursor.execute(
                "; ".join(s.sql for s in statements), [p for s in statements for p in s.params]
            )
            results = [_result(raw, statements[0])]
            for statement in statements[1:]:
                raw.nextset()
                results.append(_result(raw, statement))
            return results
        results = []
        for statement in statements:
            cursor.execute(statement.sql, statement.params)
            results.append(_result(raw, statement))
        return results


def sends_together(connection) -> bool:
    options = connection.settings_dict.get("OPTIONS", {})
    return connection.vendor == "postgresql" and not options.get("server_side_binding")


def _result(cursor, statement: Statement) -> Result:
    rows = cursor.fetchall() if statement.sql.startswith("SELECT") else []
    return Result(rows=rows, rowcount=cursor.rowcount)


def update_statement(instance, names: list[str]) -> Statement:
    """instance.save(update_fields=names) as one plain UPDATE (no model signals: none are
    connected). Model.save built the statement through the ORM at a cost several times
    that of running it, on every send."""
    connection = connections[DEFAULT_DB_ALIAS]
    sql, fields = _update_sql(connection.ops, type(instance), tuple(names))
    params = [f.get_db_prep_save(f.pre_save(instance, False), connection) for f in fields]
    params.append(instance._meta.pk.get_db_prep_value(instance.pk, connection))
    return Statement(sql, params)


@functools.lru_cache(maxsize=256)
def _update_sql(ops, model, names: tuple) -> tuple[str, list]:
    """The statement's text made once per connection (`ops` is its own), not every send."""
    meta = model._meta
    fields = [meta.get_field(name) for name in names]
    quote = ops.quote_name
    sql = (
        f"UPDATE {quote(meta.db_table)} SET "
        f"{', '.join(f'{quote(f.column)} = %s' for f in fields)} "
        f"WHERE {quote(meta.pk.column)} = %s"
    )
    return sql, fields


def insert_statement(instances: list) -> Statement:
    """What bulk_create does for new rows of one model (no signals; auto_now stamps), as
    one plain multi-row INSERT, for the caller to run in its transaction (the instances
    count as saved from here). On PostgreSQL bulk_create sends each column as an array to
    UNNEST, and psycopg's client-side binding quoted every element of every array in Python:
    the send's costliest statement. And Model.save (QuerySet.create) built its INSERT through
    the ORM at a cost several times that of running it. An auto-increment key is left to
    the database and not read back (the instances keep pk None)."""
    connection = connections[DEFAULT_DB_ALIAS]
    sql, fields = _insert_sql(connection.ops, type(instances[0]), len(instances))
    params = []
    for instance in instances:
        instance._prepare_related_fields_for_save(operation_name="bulk_create")
        params += [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    for instance in instances:
        instance._state.adding = False
        instance._state.db = connection.alias
    return Statement(sql, params)


@functools.lru_cache(maxsize=256)
def _insert_sql(ops, model, count: int) -> tuple[str, list]:
    meta = model._meta
    fields = [f for f in meta.concrete_fields if f is not meta.auto_field]
    quote = ops.quote_name
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES {', '.join([row] * count)}"
    )
    return sql, fields
