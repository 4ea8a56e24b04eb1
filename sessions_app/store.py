"""DjangoSessionStore: chatflow_agent's persistent session store on a Django database alias.

The turn protocol (identity map, leases, one commit per turn, deletion tokens) is
``chatflow_agent.core.memory.PersistentSessionStore``; ``DjangoBackend`` is the
``chatflow_agent.core.backend.SessionBackend`` under it, on the alias's connections. The rows are
those chatflow-agent 0.3.4 and ``SQLiteSessionStore`` write, with the same SQL
(``chatflow_agent.core.sql``: reads, commits, creates, deletes, leases, waiters, de-duplication
claims), run on a cursor of the driver's connection under Django's wrapper (``sqlite3`` or
``psycopg``): in whatever transaction Django has open on it, so a sync call inside an operator's
``transaction.atomic`` joins that transaction (its writes in a savepoint) and rolls back with it;
the driver's errors are raised as ``django.db``'s. A bot process on ``SQLiteSessionStore`` and the
site on the same SQLite file therefore serialise turns on a session between them. On PostgreSQL the
lease row is taken by one ``INSERT … ON CONFLICT … DO UPDATE … WHERE`` (the row lock makes it
atomic) and every commit updates the session row first, locking it against concurrent commits and
deletes until the transaction ends.

A commit is one transaction (``transaction.atomic``) on one cursor: the turn's commit hooks
(``chatflow_agent.core.hooks``: the per-turn work the turn carries, e.g. a webhook delivery's settle, the
takeover gate's decision), the ``session_committing`` signal, then ``chatflow_agent.core.sql.write_commit``.
Timestamps are UTC text on SQLite (the form 0.3.4 writes) and ``timestamptz`` on PostgreSQL. A delete
(``delete``, ``adelete``, ``clear``, ``erase``) is ``sessions_app.holdings.erase``: in its transaction,
everything the site's apps hold of the session goes with its rows, whoever calls it (the console, an
import, a bot sharing the store).

Threads: the awaitable methods run queries on the store's pool threads; a sync method called on
a thread that runs an event loop (0.3.4-style code in an async view) runs its queries on a helper
thread and waits, because Django refuses queries on an event-loop thread. Every connection the
store opens on another thread is closed by :meth:`close`.

SQLite needs ``"transaction_mode": "IMMEDIATE"`` in the database OPTIONS (chatflow_site.settings
sets it): a commit then takes the write lock at BEGIN and waits on the busy timeout, instead of
failing when it upgrades a read lock.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.dispatch import Signal

from chatflow_agent.core.backend import Changes, CommitResult, StoredSession, TurnReport
from chatflow_agent.core.memory import PersistentSessionStore
from chatflow_agent.core.sql import (
    POSTGRESQL,
    SQLITE,
    Cursor,
    Dialect,
    LeaseRider,
    SQLLeasesAndClaims,
    clear_sessions,
    create_session,
    delete_session,
    list_session_ids,
    read_head,
    read_rows,
    sqlite_transaction,
    write_commit,
)
from chatflow_agent.jsonsafe import json_object
from chatflow_agent.types import Role
from sessions_app import holdings
from sessions_app.models import SessionLease
from turns_app import records

__all__ = ["IDLE_CHECK_SECONDS", "DjangoBackend", "DjangoSessionStore", "driver_cursor", "recheck_connections",
           "reopen_if_dropped", "session_committing"]

_T = TypeVar("_T")
# The statements run on the driver's own cursor (``?`` for sqlite3, ``%s`` for psycopg).
_DIALECTS: dict[str, Dialect] = {"sqlite": SQLITE, "postgresql": POSTGRESQL}
_POSTGRESQL_WORKERS = 8  # pool threads (so connections) per store on PostgreSQL
# This transaction only, evaluated by the lease statement once the lease is taken (see _acquire).
_NO_FLUSH_WAIT = "set_config('synchronous_commit', 'off', true) IS NOT NULL"


def _unflushed_lease(lease_sql: str, params: Sequence[Any]) -> tuple[str, Sequence[Any]]:
    """PostgreSQL, a turn without a record: the lease upsert whose transaction skips the flush wait."""
    return f"WITH lease AS ({lease_sql} RETURNING session_id) SELECT 1 FROM lease WHERE {_NO_FLUSH_WAIT}", params


def _open_cursor(conn: Any) -> Any:
    """A cursor of the driver's connection under Django's wrapper ``conn``. On PostgreSQL a server-binding
    ``psycopg.Cursor`` (not Django's client-binding one): psycopg prepares a statement once it has run the
    connection's ``prepare_threshold`` times (the database's ``OPTIONS``; None never prepares), so a hot
    statement is planned once per connection instead of on every run."""
    raw = conn.connection
    if conn.vendor != "postgresql":
        return raw.cursor()
    import psycopg

    if isinstance(raw, psycopg.Connection):
        return psycopg.Cursor(raw)
    # A wrapper of the connection: its own server-binding cursor if it has one (sessions_app.roundtrips),
    # else whatever cursor it gives (the statements run all the same, planned on every run).
    opener = getattr(raw, "server_binding_cursor", None)
    return raw.cursor() if opener is None else opener()


#: A connection that ran no statement for this many seconds is checked before its next one.
IDLE_CHECK_SECONDS = 1.0

_generation = 0  # bumped by recheck_connections
_dropped = 0  # connections found dropped by the server, in this process
_seen: weakref.WeakKeyDictionary[Any, tuple[int, float]] = weakref.WeakKeyDictionary()  # wrapper → (generation, used)
_seen_mutex = threading.Lock()


def recheck_connections() -> None:
    """Thread-safe: the database server may have dropped this process's connections (a restart, an
    administrator's ``pg_terminate_backend``): every connection is checked before its next statement
    (:func:`reopen_if_dropped`). Called on any connection-level error a store or a queue worker sees."""
    global _generation
    with _seen_mutex:
        _generation += 1


def reopen_if_dropped(using: str = "default", *, failed: bool = False) -> None:
    """Before a statement on this thread's connection ``using``: close it if the server dropped it, so the
    statement runs on a new one (Django opens it) instead of failing on the dead one.

    The check is Django's ``is_usable()`` (one ``SELECT 1`` on PostgreSQL; nothing on SQLite) and runs only
    when the server may have dropped the connection: when it ran no statement for
    :data:`IDLE_CHECK_SECONDS` (a turn's model call, a quiet queue), after :func:`recheck_connections`, or
    with ``failed`` (a statement on it just failed). A connection that fails the check calls
    :func:`recheck_connections` (the server dropped the others too, most likely). Never inside a
    transaction: a connection dropped there fails its transaction, which rolls back whole. A connection
    dropped between the check and the statement still fails that statement."""
    conn = connections[using]
    if conn.in_atomic_block:
        return
    now = time.monotonic()
    with _seen_mutex:
        generation, used = _seen.get(conn, (-1, now))
        _seen[conn] = (_generation, now)
        due = failed or generation != _generation or now - used >= IDLE_CHECK_SECONDS
    if not due or conn.connection is None:
        return
    if not conn.is_usable():
        conn.close()
        global _dropped
        with _seen_mutex:
            _dropped += 1
        recheck_connections()


def dropped_connections() -> int:
    """How many connections :func:`reopen_if_dropped` found dropped by the server in this process so far: a
    statement that failed while this count moved failed on a dropped connection, not on the database's own
    refusal (a lock, a deadlock, a constraint)."""
    return _dropped


@contextmanager
def driver_cursor(using: str = "default") -> Iterator[tuple[Cursor, Dialect]]:
    """A cursor of the driver's own connection (``sqlite3`` or psycopg) under Django's connection ``using``
    (opened if needed), with its ``chatflow_agent.core.sql.Dialect``: for statements on a hot path, where
    building an ORM query costs far more than running it. Statements run in whatever transaction Django
    has open on the connection (autocommit otherwise) and the driver's errors are raised as
    ``django.db``'s. Write them with ``?`` placeholders and render them with ``dialect.render``. On
    PostgreSQL the parameters are bound by the server (a ``None`` needs a cast where its type is not
    evident) and the statements are prepared as the database's ``prepare_threshold`` option says.

    Not on a thread that runs an event loop (Django refuses queries there)."""
    reopen_if_dropped(using)
    conn = connections[using]
    conn.ensure_connection()
    with conn.wrap_database_errors:
        cursor = _open_cursor(conn)
        try:
            yield cursor, _DIALECTS[conn.vendor]
        finally:
            cursor.close()


#: Sent in every commit's transaction, after the turn's commit hooks and before any row is written, as
#: ``session_committing.send(sender=DjangoSessionStore, session_id=str, metadata=dict, using=str, turn=bool,
#: report=TurnReport | None)`` (``metadata``: what the commit writes; ``turn``: the commit ends a turn a Runner
#: played, not an operator's or a script's ``turn``/``sync_turn`` without a turn report; ``report``: that
#: turn's report, its ``response`` what the turn answers). A receiver that raises
#: ``SessionDeletedError`` refuses the commit: nothing is written and the turn fails with that error.
#: Receivers run on the store's threads. It is for observers of every commit (timings, tests); work that
#: belongs to one turn travels with that turn as its commit hooks (``chatflow_agent.core.hooks``).
session_committing = Signal(use_caching=True)


def _alive(thread_ref: weakref.ref[threading.Thread]) -> bool:
    thread = thread_ref()
    return thread is not None and thread.is_alive()


def _close_foreign(wrappers: list[Any]) -> None:
    """Close Django connection wrappers that belonged to threads which have ended.

    On an event-loop thread Django refuses to touch a connection, so a short-lived thread does it.
    """
    if not wrappers:
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        for wrapper in wrappers:
            wrapper.inc_thread_sharing()
            try:
                wrapper.close()
            finally:
                wrapper.dec_thread_sharing()
        return
    closer = threading.Thread(target=_close_foreign, args=(wrappers,), name="chatflow-django-close")
    closer.start()
    closer.join()


class DjangoBackend:
    """The ``SessionBackend`` on a Django database alias (``using``; SQLite or PostgreSQL).

    A method called on a thread that runs an event loop runs its queries on a helper thread and
    waits, because Django refuses queries on an event-loop thread. :meth:`close` closes the
    connections of every thread that used it and has ended. Its claim methods, and its lease methods
    for a turn without a record, are those of the ``SQLLeasesAndClaims`` it holds; the turn records
    ride on the same ``SessionRules`` (``SQLLeasesAndClaims.rules``), as does the commit's release.
    """

    inline = False

    def __init__(self, using: str = "default") -> None:
        self.using = using
        vendor = connections[using].vendor
        if vendor not in _DIALECTS:
            raise ValueError(f"DjangoSessionStore supports SQLite and PostgreSQL, not {vendor!r}")
        self._dialect = _DIALECTS[vendor]
        self._sql = SQLLeasesAndClaims(self._dialect, self._one, self._transaction)
        self._rules = self._sql.rules
        # Django connections this backend used, by id: (the thread that owns it, the wrapper).
        self._opened: dict[int, tuple[weakref.ref[threading.Thread], Any]] = {}
        self._opened_mutex = threading.Lock()
        self._helper: ThreadPoolExecutor | None = None

    # ---- where queries run ------------------------------------------------------------------
    def _call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run ``fn(*args)`` here, or on the helper thread when this thread runs an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._tracked(fn, *args)
        with self._opened_mutex:
            if self._helper is None:
                self._helper = ThreadPoolExecutor(1, thread_name_prefix="chatflow-django-sync")
            helper = self._helper
        return helper.submit(self._tracked, fn, *args).result()

    def _tracked(self, fn: Callable[..., _T], *args: Any) -> _T:
        conn = connections[self.using]
        if id(conn) not in self._opened:
            self._track(conn)
        reopen_if_dropped(self.using)  # e.g. a commit after a turn's model call, during which the server restarted
        try:
            return fn(*args)
        except DatabaseError as err:
            if isinstance(err, (OperationalError, InterfaceError)):  # the other threads' may be broken too
                recheck_connections()
            reopen_if_dropped(self.using, failed=True)  # a broken connection is opened again next time
            raise

    def _track(self, conn: Any) -> None:
        """Remember ``conn`` (this thread's) and close the connections of threads that have ended.

        Django opens one connection per thread and nobody closes those of threads it did not
        start: without this, every short-lived thread making a sync call would leave one open.
        """
        with self._opened_mutex:
            ended = [key for key, (thread, _) in self._opened.items() if not _alive(thread)]
            closing = [self._opened.pop(key)[1] for key in ended]
            self._opened[id(conn)] = (weakref.ref(threading.current_thread()), conn)
        _close_foreign(closing)

    def close(self) -> None:
        """Stop the helper thread and close the connections of every thread that has ended."""
        with self._opened_mutex:
            helper, self._helper = self._helper, None
        if helper is not None:
            helper.shutdown(wait=True)
        with self._opened_mutex:
            ended = [key for key, (thread, _) in self._opened.items() if not _alive(thread)]
            closing = [self._opened.pop(key)[1] for key in ended]
        _close_foreign(closing)  # live threads' connections stay with their threads

    def _one(self, fn: Callable[[Cursor], _T]) -> _T:
        """``fn(cursor)`` on this thread's connection (autocommitted unless in a transaction)."""
        return self._call(self._autocommit, fn)

    def _autocommit(self, fn: Callable[[Cursor], _T]) -> _T:
        reopen_if_dropped(self.using)
        conn = connections[self.using]
        conn.ensure_connection()
        return self._on_driver(conn, fn)

    def _transaction(self, fn: Callable[[Cursor], _T]) -> _T:
        """``fn(cursor)`` in one transaction (a savepoint inside an operator's transaction)."""
        reopen_if_dropped(self.using)
        with transaction.atomic(using=self.using):
            return self._on_driver(connections[self.using], fn)

    @staticmethod
    def _on_driver(conn: Any, fn: Callable[[Cursor], _T]) -> _T:
        """``fn`` on a cursor of the driver's connection under Django's wrapper: in whatever
        transaction Django has open on it, with the driver's errors raised as ``django.db``'s."""
        with conn.wrap_database_errors:
            cursor = _open_cursor(conn)
            try:
                return fn(cursor)
            finally:
                cursor.close()

    # ---- leases (and the turn records that ride on them: turns_app.records) ------------------
    def acquire_lease(self, session_id: str, owner: str, ttl_seconds: float, queue: bool,
                      report: TurnReport | None = None) -> bool:
        if self._dialect is not POSTGRESQL and report is None:
            return self._sql.acquire_lease(session_id, owner, ttl_seconds, queue)
        return self._call(self._acquire, session_id, owner, ttl_seconds, queue, report)

    def _acquire(self, session_id: str, owner: str, ttl_seconds: float, queue: bool,
                 report: TurnReport | None) -> bool:
        """The lease and, with ``report``, the turn's record (``running``), written together.

        On PostgreSQL that is one statement in its own transaction (``turns_app.records``'s rider on
        the lease upsert), and that transaction does not wait for its WAL flush: the lease is exclusion
        between live processes, not data; other sessions see it once it commits, flushed or not,
        and a server crash that loses it also ends the connection of the turn holding it, whose
        commit then finds no lease and writes nothing (``SessionBusyError``). The turn's commit
        stays durable, and its flush covers the lease and the record written before it. Inside an
        operator's transaction the lease joins it unchanged (that transaction keeps its durability).
        On SQLite the record's statements follow the upsert in one ``BEGIN IMMEDIATE`` transaction
        on the driver's connection (a wait in the session's line joins it).
        """
        conn = connections[self.using]
        outer = conn.in_atomic_block
        if self._dialect is POSTGRESQL:
            condition = "" if outer else _NO_FLUSH_WAIT
            if report is not None:
                rider: LeaseRider | None = records.lease_opening_turn(self._dialect, session_id, report, condition)
            else:
                rider = None if outer else _unflushed_lease

            def ride(cursor: Cursor) -> bool:
                return self._rules.acquire_lease(cursor, self._transaction, session_id, owner, ttl_seconds, queue,
                                                 rider)

            return self._autocommit(ride)

        def take(cursor: Cursor) -> bool:
            # One transaction already: a wait in the session's line joins it.
            if not self._rules.acquire_lease(cursor, lambda fn: fn(cursor), session_id, owner, ttl_seconds, queue):
                return False
            if report is not None:
                records.open_turn(cursor, self._dialect, session_id, report)
            return True

        return self._on_driver(conn, take) if outer else self._autocommit(lambda c: sqlite_transaction(c, take))

    def release_lease(self, session_id: str, owner: str, report: TurnReport | None = None) -> None:
        if report is None:
            self._sql.release_lease(session_id, owner)
            return
        self._call(self._release_recorded, session_id, owner, report)

    def leave_queue(self, session_id: str, owner: str) -> None:
        self._sql.leave_queue(session_id, owner)

    def renew_lease(self, session_id: str, owner: str, ttl_seconds: float) -> bool:
        return self._sql.renew_lease(session_id, owner, ttl_seconds)

    def _release_recorded(self, session_id: str, owner: str, report: TurnReport) -> None:
        """Release ``owner``'s lease and close its record (a turn that did not commit) in one transaction."""
        if self._dialect is POSTGRESQL:  # one statement
            rider = records.lease_closing_turn(self._dialect, session_id, report)
            self._autocommit(lambda c: self._rules.release_lease(c, session_id, owner, rider))
            return

        def release(cursor: Cursor) -> None:
            self._rules.release_lease(cursor, session_id, owner)
            records.close_turn(cursor, self._dialect, session_id, report)

        self._transaction(release)

    def purge_leases(self, before: float) -> int:
        """Also marks ``interrupted`` the running turn records whose lease expired (``turns_app.records``)."""
        return self._call(self._purge_recorded, before)

    def _purge_recorded(self, before: float) -> int:
        with transaction.atomic(using=self.using):
            self._on_driver(connections[self.using],
                            lambda c: records.mark_interrupted(c, self._dialect, time.time(), cancelled_before=before))
            return self._rules.purge_leases(self._transaction, before)

    def cancel_record(self, session_id: str, owner: str, now: float, error: str = records.CANCELLED_ERROR,
                      replay: bool = False) -> bool:
        """Close ``owner``'s running turn record of ``session_id`` as ``cancelled`` with ``error`` (who and why;
        ``replay``: its message is to be played again; ``turns_app.records.cancel_turn``), in the caller's
        transaction (a savepoint of it): call it from sync code where the lease is taken away. True when a
        record was running."""
        return self._transaction(
            lambda c: records.cancel_turn(c, self._dialect, session_id, owner, now, error, replay))

    def mark_interrupted(self, now: float, cancelled_before: float | None = None) -> int:
        """Mark ``interrupted`` the ``running`` turn records whose lease is gone or expired at ``now``
        (unix seconds), and count the cancelled ones no close can reach any more (``cancelled_before``), in
        one transaction; how many were marked (``turns_app.records.mark_interrupted``)."""
        return self._call(self._transaction,
                          lambda c: records.mark_interrupted(c, self._dialect, now, cancelled_before))

    # ---- de-duplication claims -------------------------------------------------------------------
    def claim_message(self, message_id: str, ttl_seconds: float) -> bool:
        return self._sql.claim_message(message_id, ttl_seconds)

    def release_claim(self, message_id: str) -> None:
        self._sql.release_claim(message_id)

    def is_message_claimed(self, message_id: str, ttl_seconds: float) -> bool:
        return self._sql.is_message_claimed(message_id, ttl_seconds)

    def purge_claims(self, ttl_seconds: float) -> int:
        return self._sql.purge_claims(ttl_seconds)

    # ---- sessions -----------------------------------------------------------------------------
    def head(self, session_id: str) -> StoredSession | None:
        return self._one(lambda c: read_head(c, self._dialect, session_id))

    def load(self, session_id: str) -> StoredSession | None:
        def load(cursor: Cursor) -> StoredSession | None:
            head = read_head(cursor, self._dialect, session_id)
            if head is not None:
                head.rows = read_rows(cursor, self._dialect, session_id)
            return head

        return self._one(load)

    def create(self, session_id: str, agent_name: str, metadata_json: str) -> None:
        self._one(lambda c: create_session(c, self._dialect, session_id, agent_name, metadata_json))

    def commit(self, changes: Changes) -> CommitResult:
        return self._call(self._commit, changes)

    def _commit(self, changes: Changes) -> CommitResult:
        """One transaction on one cursor: the turn's commit hooks, the ``session_committing`` signal, then
        ``write_commit``. A hook or receiver that raises refuses the commit (the transaction rolls back)."""
        with transaction.atomic(using=self.using):
            metadata = json_object(changes.metadata_json)
            if changes.hooks is not None:
                changes.hooks.committing(changes.session_id, metadata, changes.report)
            session_committing.send(sender=DjangoSessionStore, session_id=changes.session_id, metadata=metadata,
                                    using=self.using, turn=changes.report is not None, report=changes.report)
            conn = connections[self.using]
            return self._on_driver(conn, lambda c: self._write_commit(c, changes))

    def _write_commit(self, cursor: Cursor, changes: Changes) -> CommitResult:
        """``write_commit`` and the turn record's close: on PostgreSQL in the lease release's statement
        (a turn's commit always releases its lease), on SQLite after it."""
        report = changes.report
        if report is None:
            return write_commit(cursor, self._rules, changes)
        if self._dialect is POSTGRESQL and changes.release_owner:
            def closing(new_ids: list[int]) -> LeaseRider:
                return records.lease_closing_turn(self._dialect, changes.session_id, report,
                                                 _first_user_id(changes, new_ids))

            return write_commit(cursor, self._rules, changes, closing)
        result = write_commit(cursor, self._rules, changes)
        records.close_turn(cursor, self._dialect, changes.session_id, report, _first_user_id(changes, result.new_ids))
        return result

    def delete(self, session_id: str) -> bool:
        """The session's rows and everything every app holds of it (:meth:`erase`); True if a row went."""
        return self.erase(session_id).existed

    def erase(self, session_id: str) -> holdings.Erased:
        """Delete ``session_id``'s rows and everything every app holds of it, in one transaction
        (``sessions_app.holdings.erase``: its lock order, and what it did)."""
        return self._call(self._erase, session_id)

    def _erase(self, session_id: str) -> holdings.Erased:
        reopen_if_dropped(self.using)
        conn = connections[self.using]

        def delete_rows() -> bool:
            return self._on_driver(conn, lambda c: delete_session(c, self._dialect, session_id))

        return holdings.erase(session_id, delete_rows, using=self.using)

    def list_sessions(self) -> list[str]:
        return self._one(lambda c: list_session_ids(c, self._dialect))

    def clear(self) -> None:
        """Every session's rows and everything every app holds of any session (``holdings.erase_all``)."""
        self._call(self._clear)

    def _clear(self) -> None:
        reopen_if_dropped(self.using)
        conn = connections[self.using]

        def delete_rows() -> None:
            self._on_driver(conn, lambda c: clear_sessions(c, self._dialect))

        holdings.erase_all(delete_rows, using=self.using)


def _first_user_id(changes: Changes, new_ids: list[int]) -> int | None:
    """The row id of the commit's first USER message (a turn's first message), or None."""
    pairs = zip(changes.inserts, new_ids, strict=True)
    return next((row_id for msg, row_id in pairs if msg.role == Role.USER), None)


class DjangoSessionStore(PersistentSessionStore):
    """``DjangoSessionStore(using="default", default_max_turns=None, dedup_ttl_hours=None, lease_ttl_seconds=None)``:
    a ``DjangoBackend`` under a ``PersistentSessionStore``.

    ``default_max_turns``, ``dedup_ttl_hours`` and ``lease_ttl_seconds`` default to the CHATFLOW_MAX_TURNS,
    CHATFLOW_DEDUP_TTL_HOURS and CHATFLOW_LEASE_SECONDS settings; ``using`` names the database alias.
    """

    backend: DjangoBackend

    def __init__(
        self,
        using: str = "default",
        default_max_turns: int | None = None,
        dedup_ttl_hours: float | None = None,
        lease_ttl_seconds: float | None = None,
    ) -> None:
        if connections[using].vendor == "postgresql":
            # PostgreSQL writes different sessions side by side and one WAL flush covers every commit
            # waiting for it: more threads (each on its own connection) share the flushes.
            self._BLOCKING_IO_WORKERS = _POSTGRESQL_WORKERS
        super().__init__(
            DjangoBackend(using),
            default_max_turns=settings.CHATFLOW_MAX_TURNS if default_max_turns is None else default_max_turns,
            dedup_ttl_hours=settings.CHATFLOW_DEDUP_TTL_HOURS if dedup_ttl_hours is None else dedup_ttl_hours,
            lease_ttl_seconds=settings.CHATFLOW_LEASE_SECONDS if lease_ttl_seconds is None else lease_ttl_seconds,
        )

    @property
    def using(self) -> str:
        return self.backend.using

    def erase(self, session_id: str) -> holdings.Erased:
        """:meth:`delete` (its live objects raise ``SessionDeletedError``, everything every app holds of the
        session goes with it: ``sessions_app.holdings.erase``), returning what it did: for an audited delete,
        which calls it inside its own transaction. ``Erased.existed`` is False when no session row was there."""
        done: list[holdings.Erased] = []

        def delete_rows(sid: str) -> bool:
            done.append(self.backend.erase(sid))
            return done[-1].existed

        self.delete_with(session_id, delete_rows)
        return done[0]

    # ---- cancelling a turn -----------------------------------------------------------------------
    def cancel_turn(self, session_id: str, error: str, *, replay: bool = False, only_expired: bool = False,
                    owner: str = "", audited: Callable[[SessionLease, bool], object] | None = None
                    ) -> SessionLease | None:
        """Stop the turn holding ``session_id``'s lease, in this process or another: the lease is taken away
        (deleted), so that turn's commit is refused and it is rolled back — at once in this process
        (:meth:`stop_turn`), else when its process finds the lease gone (:meth:`holds_lease`; a queue worker
        looks every second) or at its next renewal. A live lease's turn record ends ``cancelled`` with
        ``error`` (who and why) in the same transaction, and that is what the stopped turn learns from
        (:meth:`cancel_of`) unless ``replay`` (its message is to be played again: a takeover "now"). A stale
        lease (expired: its holder died or stalled) is only released; its turn is played again if it was a
        delivery's. ``only_expired``: only an expired lease is taken; ``owner``: only that owner's lease.
        ``audited(lease, expired)`` runs in the same transaction (the operator's audit entry; ``expired``: the
        lease was stale). Returns the lease taken away (a deleted ``SessionLease``), None when no such lease
        held the session."""
        with transaction.atomic(using=self.using):
            leases = SessionLease.objects.using(self.using).select_for_update().filter(session_id=session_id)
            if only_expired:
                leases = leases.filter(expires_at__lt=time.time())
            if owner:
                leases = leases.filter(owner=owner)
            lease = leases.first()
            if lease is None:
                return None
            expired = lease.expired
            lease.delete()
            if not expired:  # (a stale lease's holder died: its record ends interrupted, as any such)
                # The turn's record ends cancelled now: a turn that takes the lease before this one has rolled
                # back would mark it interrupted, and this one's own close then finds nothing running.
                self.backend.cancel_record(session_id, lease.owner, time.time(), error, replay)
            if audited is not None:
                audited(lease, expired)
        self.stop_turn(session_id, owner=lease.owner)  # that turn, not one that began since
        return lease

    def holds_lease(self, session_id: str, owner: str) -> bool:
        """True while ``owner`` holds ``session_id``'s lease. False once its turn was stopped from another process
        (:meth:`cancel_turn`) or its lease was taken after it ran out: a process running that turn calls
        :meth:`stop_turn` then, instead of waiting for the lease's next renewal to find out."""
        return SessionLease.objects.using(self.using).filter(session_id=session_id, owner=owner).exists()

    def cancel_of(self, session_id: str, owner: str) -> str | None:
        """Who cancelled ``owner``'s turn of ``session_id`` and why (the ``error`` of :meth:`cancel_turn`) when a
        cancel without ``replay`` stopped it; None otherwise (a takeover "now" stopped it, or it lost its lease
        otherwise: its message is to be played again). Read from the turn's record, keyed by its lease owner
        (``turns_app.records.cancel_of``)."""
        return records.cancel_of(session_id, owner, self.using)

    async def run_blocking(self, session_id: str, fn: Callable[..., _T], *args: Any) -> _T:
        """Await blocking ``fn(*args)`` (ORM queries of a turn hook, e.g. a turn gate) on the thread this
        store uses for ``session_id``'s turn: in order with the turn's own queries, on a connection the
        store closes with its threads."""
        return await self._run_blocking_on(session_id, fn, *args)
