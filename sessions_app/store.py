"""DjangoSessionStore: chatflow_agent's persistent session store on the Django ORM.

The turn protocol (identity map, leases, one commit per turn, deletion tokens) is
``chatflow_agent.core.memory.PersistentSessionStore``; ``DjangoBackend`` is the
``chatflow_agent.core.backend.SessionBackend`` under it, on the database alias's connections. The
rows are those chatflow-agent 0.3.4 and ``SQLiteSessionStore`` write, and the session reads,
leases, waiters and de-duplication claims are ``chatflow_agent.core.sql``'s (the same SQL as
``SQLiteSessionStore``'s, through ``connections[using].cursor()``), so a bot process on
``SQLiteSessionStore`` and the site on the same SQLite file serialise turns on a session between
them. On PostgreSQL the lease row is taken by one ``INSERT … ON CONFLICT … DO UPDATE … WHERE``
(the row lock makes it atomic) and every commit updates the session row first, locking it
against concurrent commits and deletes until the transaction ends.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db.models import TextField, Value
from django.db.models.functions import Cast, Coalesce
from django.dispatch import Signal

from chatflow_agent.core.backend import Changes, CommitResult, StoredSession, TurnReport
from chatflow_agent.core.memory import PersistentSessionStore
from chatflow_agent.core.sql import POSTGRESQL, SQLITE, Cursor, Dialect, SQLLeasesAndClaims, read_head, read_rows
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from chatflow_agent.jsonsafe import json_object
from chatflow_agent.types import Role
from sessions_app.models import ChatMessage, ChatSession
from turns_app import records

__all__ = ["DjangoBackend", "DjangoSessionStore", "session_committing"]

_T = TypeVar("_T")
_DELETE_CHUNK = 500  # ids per DELETE … IN (…): far below every backend's parameter limit
# Django's cursors take ``%s`` placeholders on every database.
_DIALECTS: dict[str, Dialect] = {"sqlite": SQLITE.with_placeholder("%s"), "postgresql": POSTGRESQL}


#: Sent at the start of every commit's transaction, before any row is written, as
#: ``session_committing.send(sender=DjangoSessionStore, session_id=str, metadata=dict, using=str)``
#: (``metadata``: what the commit writes). A receiver that raises ``SessionDeletedError`` refuses the
#: commit: nothing is written and the turn fails with that error. Receivers run on the store's threads.
session_committing = Signal(use_caching=True)


def _text(column: str) -> Coalesce:
    """The column's stored text (SQLite) or its text rendering (PostgreSQL); '' for NULL.

    Used as the session's incarnation token and version: comparing the text the database holds
    avoids a round trip through datetime that could render the same instant differently.
    """
    return Coalesce(Cast(column, TextField()), Value(""), output_field=TextField())


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


class DjangoBackend(SQLLeasesAndClaims):
    """The ``SessionBackend`` on a Django database alias (``using``; SQLite or PostgreSQL).

    A method called on a thread that runs an event loop runs its queries on a helper thread and
    waits, because Django refuses queries on an event-loop thread. :meth:`close` closes the
    connections of every thread that used it and has ended. Its lease and claim methods are
    ``SQLLeasesAndClaims``'.
    """

    inline = False

    def __init__(self, using: str = "default") -> None:
        self.using = using
        vendor = connections[using].vendor
        if vendor not in _DIALECTS:
            raise ValueError(f"DjangoSessionStore supports SQLite and PostgreSQL, not {vendor!r}")
        self._dialect = _DIALECTS[vendor]
        super().__init__(self._dialect, self._one, self._transaction)
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
        try:
            return fn(*args)
        except DatabaseError:
            if not conn.in_atomic_block:
                conn.close_if_unusable_or_obsolete()  # a broken connection reconnects next time
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
        def run() -> _T:
            with connections[self.using].cursor() as cursor:
                return fn(cursor)

        return self._call(run)

    def _transaction(self, fn: Callable[[Cursor], _T]) -> _T:
        """``fn(cursor)`` in one transaction (a savepoint inside an operator's transaction)."""
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            return fn(cursor)

    # ---- sessions -----------------------------------------------------------------------------
    def _sessions(self):
        return ChatSession.objects.using(self.using)

    def _messages(self):
        return ChatMessage.objects.using(self.using)

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
        self._call(self._create, session_id, agent_name, metadata_json)

    def _create(self, session_id: str, agent_name: str, metadata_json: str) -> None:
        now = datetime.now(UTC)
        session = ChatSession(
            session_id=session_id,
            active_agent_name=agent_name,
            metadata=json_object(metadata_json),
            created_at=now,
            updated_at=now,
        )
        self._sessions().bulk_create([session], ignore_conflicts=True)

    def commit(self, changes: Changes) -> CommitResult:
        return self._call(self._commit, changes)

    def _commit(self, changes: Changes) -> CommitResult:
        sid = changes.session_id
        with transaction.atomic(using=self.using):
            metadata = json_object(changes.metadata_json)
            session_committing.send(sender=DjangoSessionStore, session_id=sid, metadata=metadata, using=self.using)
            now = datetime.now(UTC)
            fields = {"active_agent_name": changes.agent_name, "metadata": metadata, "updated_at": now}
            if changes.token is None:
                self._sessions().bulk_create(
                    [ChatSession(session_id=sid, created_at=now, **fields)],
                    update_conflicts=True,
                    unique_fields=["session_id"],
                    update_fields=list(fields),
                )
            elif (
                self._sessions()
                .filter(pk=sid)
                .annotate(token=_text("created_at"))
                .filter(token=changes.token)
                .update(**fields)
                == 0
            ):
                raise SessionDeletedError(sid)  # deleted (maybe re-created) since it was loaded
            for start in range(0, len(changes.delete_ids), _DELETE_CHUNK):
                chunk = changes.delete_ids[start : start + _DELETE_CHUNK]
                self._messages().filter(session_id=sid, id__in=chunk).delete()
            created = self._messages().bulk_create(
                [
                    ChatMessage(
                        session_id=sid,
                        role=msg.role.value,
                        content=msg.content,
                        message_json=msg.model_dump_json(),
                        created_at=now,
                    )
                    for msg in changes.inserts
                ]
            )
            with connections[self.using].cursor() as cursor:
                if changes.release_owner and not self._rules.release_lease(cursor, sid, changes.release_owner):
                    # The lease expired and may belong to another turn now: committing could
                    # interleave with it, so this turn fails and writes nothing.
                    raise SessionBusyError(sid)
                if changes.report is not None:
                    records.close_turn(cursor, sid, changes.report, _first_user_id(changes, created))
                head = read_head(cursor, self._dialect, sid)
        assert head is not None
        return CommitResult([m.id for m in created], head.token, head.version)

    def delete(self, session_id: str) -> bool:
        return self._call(self._delete, session_id)

    def _delete(self, session_id: str) -> bool:
        with transaction.atomic(using=self.using):
            self._messages().filter(session_id=session_id).delete()
            deleted, _ = self._sessions().filter(pk=session_id).delete()
        return deleted > 0

    def list_sessions(self) -> list[str]:
        return self._call(lambda: list(self._sessions().order_by("-updated_at").values_list("pk", flat=True)))

    def clear(self) -> None:
        self._call(self._clear)

    def _clear(self) -> None:
        with transaction.atomic(using=self.using):
            self._messages().all().delete()
            self._sessions().all().delete()


    # ---- turn records (turns_app): written in the lease's and the commit's own transactions -----
    def acquire_lease(self, session_id: str, owner: str, ttl_seconds: float, queue: bool,
                      report: TurnReport | None = None) -> bool:
        if report is None:
            return super().acquire_lease(session_id, owner, ttl_seconds, queue)
        return self._call(self._acquire_recorded, session_id, owner, ttl_seconds, queue, report)

    def _acquire_recorded(self, session_id: str, owner: str, ttl_seconds: float, queue: bool,
                          report: TurnReport) -> bool:
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            if not self._rules.acquire_lease(cursor, self._transaction, session_id, owner, ttl_seconds, queue):
                return False
            records.open_turn(cursor, session_id, report)
            return True

    def release_lease(self, session_id: str, owner: str, report: TurnReport | None = None) -> None:
        if report is None:
            super().release_lease(session_id, owner)
            return
        self._call(self._release_recorded, session_id, owner, report)

    def _release_recorded(self, session_id: str, owner: str, report: TurnReport) -> None:
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            self._rules.release_lease(cursor, session_id, owner)
            records.close_turn(cursor, session_id, report)

    def purge_leases(self, before: float) -> int:
        """Also marks ``interrupted`` the running turn records whose lease expired (``turns_app.records``)."""
        return self._call(self._purge_recorded, before)

    def _purge_recorded(self, before: float) -> int:
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            records.mark_interrupted(cursor, time.time())
            return self._rules.purge_leases(self._transaction, before)


def _first_user_id(changes: Changes, created: list[Any]) -> int | None:
    """The row id of the commit's first USER message (a turn's first message), or None."""
    return next((row.id for msg, row in zip(changes.inserts, created, strict=True) if msg.role == Role.USER), None)


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
        super().__init__(
            DjangoBackend(using),
            default_max_turns=settings.CHATFLOW_MAX_TURNS if default_max_turns is None else default_max_turns,
            dedup_ttl_hours=settings.CHATFLOW_DEDUP_TTL_HOURS if dedup_ttl_hours is None else dedup_ttl_hours,
            lease_ttl_seconds=settings.CHATFLOW_LEASE_SECONDS if lease_ttl_seconds is None else lease_ttl_seconds,
        )

    @property
    def using(self) -> str:
        return self.backend.using
