"""Database round trips and write transactions, counted on the drivers' own connections.

The session store runs its statements on a cursor of the driver's connection (``sqlite3`` or
psycopg), not through Django's cursor wrapper, so ``connection.execute_wrappers`` never sees them.
:func:`count_connections` puts a :class:`CountingConnection` under every Django connection opened
from then on: each ``execute`` is a round trip, and so is each ``commit``/``rollback`` and, on
PostgreSQL, the ``BEGIN`` psycopg sends before the first statement of a transaction. A write
transaction is a writing statement in autocommit, or a committed transaction that wrote.

Measurement only (``chatflow_worker --costs`` and the benchmarks under ``bench/``): nothing installs
it in a serving process.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["CountingConnection", "Counts", "count_connections", "table_group"]

_WRITES = ("INSERT", "UPDATE", "DELETE")


def table_group(sql: str) -> str:
    """What a statement works on: ``queue`` (webhook deliveries), ``lease`` (leases and waiters),
    ``session`` (sessions and messages) or ``other``."""
    if "chatflow_inbound_deliveries" in sql:
        return "queue"
    if "chatflow_session_leases" in sql or "chatflow_session_waiters" in sql:
        return "lease"
    if "chatflow_messages" in sql or "chatflow_sessions" in sql:
        return "session"
    return "other"


class Counts:
    """Totals, thread-safe: ``round_trips`` and ``write_transactions`` (ints), ``statements`` (by first
    SQL word), ``by_group`` / ``writes_by_group`` (by :func:`table_group` of the transaction's first
    statement), and ``autocommit_seconds`` by group (time spent in statements outside a transaction).

    ``on_statement(group, seconds, in_transaction)``, when given, is called after each statement."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.round_trips = 0
        self.write_transactions = 0
        self.statements: Counter[str] = Counter()
        self.by_group: Counter[str] = Counter()
        self.writes_by_group: Counter[str] = Counter()
        self.autocommit_seconds: Counter[str] = Counter()

    def reset(self) -> None:
        with self.lock:
            self.round_trips = self.write_transactions = 0
            for counter in (self.statements, self.by_group, self.writes_by_group, self.autocommit_seconds):
                counter.clear()


class _CountingCursor:
    def __init__(self, cursor: Any, conn: CountingConnection) -> None:
        self._cursor, self._conn = cursor, conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __iter__(self) -> Any:
        return iter(self._cursor)

    def __enter__(self) -> _CountingCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()

    def execute(self, sql: Any, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            if params is None:
                return self._cursor.execute(sql, *args, **kwargs)
            return self._cursor.execute(sql, params, *args, **kwargs)
        finally:
            self._conn.statement(str(sql), time.perf_counter() - started)

    def executemany(self, sql: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return self._cursor.executemany(sql, params, *args, **kwargs)
        finally:
            self._conn.statement(str(sql), time.perf_counter() - started)


class CountingConnection:
    """``CountingConnection(raw, counts, vendor)``: the driver connection ``raw`` (``vendor`` ``"sqlite"``
    or ``"postgresql"``) with every statement, commit and rollback counted in ``counts``; everything
    else is ``raw``'s."""

    def __init__(self, raw: Any, counts: Counts, vendor: str) -> None:
        object.__setattr__(self, "_raw", raw)
        object.__setattr__(self, "_counts", counts)
        object.__setattr__(self, "_vendor", vendor)
        object.__setattr__(self, "_open", None)  # (group, wrote, round trips so far) of the open transaction

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._raw, name, value)

    def _in_transaction(self) -> bool:
        if self._vendor == "sqlite":
            return bool(self._raw.in_transaction)
        from psycopg.pq import TransactionStatus

        return bool(self._raw.info.transaction_status != TransactionStatus.IDLE)

    def cursor(self, *args: Any, **kwargs: Any) -> _CountingCursor:
        return _CountingCursor(self._raw.cursor(*args, **kwargs), self)

    def server_binding_cursor(self) -> _CountingCursor:
        """PostgreSQL: a counted ``psycopg.Cursor`` (server-side binding) on the connection, as the
        session store opens on a bare one."""
        import psycopg

        return _CountingCursor(psycopg.Cursor(self._raw), self)

    def statement(self, sql: str, seconds: float) -> None:
        """Count one executed statement (after it ran)."""
        words = sql.split(None, 1)
        verb = words[0].upper() if words else ""
        upper = sql.upper()
        writes = verb in _WRITES or (verb == "WITH" and any(w in upper for w in _WRITES)) or " FOR UPDATE" in upper
        counts = self._counts
        with counts.lock:
            counts.statements[verb] += 1
            counts.round_trips += 1
            if verb in ("COMMIT", "ROLLBACK", "END"):
                self._end(verb != "ROLLBACK", 1)
                return
            if verb == "BEGIN":
                object.__setattr__(self, "_open", ("other", False, 1))
                return
            group = table_group(sql)
            state = self._open
            if state is None and self._vendor == "postgresql" and not self._raw.autocommit:
                counts.round_trips += 1  # psycopg sends BEGIN before the transaction's first statement
                state = ("other", False, 1)
            if state is None and not self._in_transaction():
                counts.by_group[group] += 1
                counts.autocommit_seconds[group] += seconds
                if writes:
                    counts.write_transactions += 1
                    counts.writes_by_group[group] += 1
                return
            if state is None:
                state = ("other", False, 0)
            # The transaction counts in the group of its first statement on the chatflow tables.
            object.__setattr__(self, "_open", (group if state[0] == "other" else state[0], state[1] or writes,
                                               state[2] + 1))

    def _end(self, committed: bool, trips: int) -> None:
        """The transaction in progress ended (its COMMIT or ROLLBACK: ``trips`` round trips)."""
        state = self._open
        object.__setattr__(self, "_open", None)
        group, wrote, statements = state if state is not None else ("other", False, 0)
        self._counts.by_group[group] += statements + trips
        if committed and wrote:
            self._counts.write_transactions += 1
            self._counts.writes_by_group[group] += 1

    def commit(self) -> None:
        with self._counts.lock:
            if self._open is not None or self._in_transaction():  # psycopg sends nothing when idle
                self._counts.round_trips += 1
                self._end(True, 1)
        self._raw.commit()

    def rollback(self) -> None:
        with self._counts.lock:
            if self._open is not None or self._in_transaction():
                self._counts.round_trips += 1
                self._end(False, 1)
        self._raw.rollback()


def count_connections(counts: Counts) -> Callable[[], None]:
    """Count, in ``counts``, on every Django connection opened from now on (this thread's open ones are
    closed first, so they reopen counted); returns the function that stops wrapping new connections."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    def wrap(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.connection = CountingConnection(connection.connection, counts, connection.vendor)

    connections.close_all()
    connection_created.connect(wrap, weak=False)
    return lambda: connection_created.disconnect(wrap)
