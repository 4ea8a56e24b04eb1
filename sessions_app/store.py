"""DjangoSessionStore: chatflow_agent's persistent session store on the Django ORM.

The turn protocol (identity map, leases, one commit per turn, deletion tokens) is
``chatflow_agent.core.memory.PersistentSessionStore``; this module implements its blocking
``_db_*`` primitives on the models of ``sessions_app``. The rows are those chatflow-agent 0.3.4
and ``SQLiteSessionStore`` write, and leases use the same table and rule, so a bot process on
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
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, transaction
from django.db.models import TextField, Value
from django.db.models.functions import Cast, Coalesce
from django.dispatch import Signal

from chatflow_agent.core.backend import Changes, CommitResult, StoredRow, StoredSession
from chatflow_agent.core.memory import PersistentSessionStore
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from chatflow_agent.jsonsafe import json_object
from sessions_app.models import ChatMessage, ChatSession, ProcessedMessage, SessionLease, SessionWaiter

__all__ = ["DjangoSessionStore", "session_committing"]

_DELETE_CHUNK = 500  # ids per DELETE … IN (…): far below every backend's parameter limit
_PURGE_EVERY_SECONDS = 300
_WAITER_TTL = 5.0  # seconds a queued waiter stays in line without polling (as SQLiteSessionStore)


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


class DjangoSessionStore(PersistentSessionStore):
    """``DjangoSessionStore(using="default", default_max_turns=None, dedup_ttl_hours=None, lease_ttl_seconds=None)``.

    ``default_max_turns``, ``dedup_ttl_hours`` and ``lease_ttl_seconds`` default to the CHATFLOW_MAX_TURNS,
    CHATFLOW_DEDUP_TTL_HOURS and CHATFLOW_LEASE_SECONDS settings; ``using`` names the database alias.
    """

    def __init__(
        self,
        using: str = "default",
        default_max_turns: int | None = None,
        dedup_ttl_hours: float | None = None,
        lease_ttl_seconds: float | None = None,
    ) -> None:
        super().__init__(
            default_max_turns=settings.CHATFLOW_MAX_TURNS if default_max_turns is None else default_max_turns,
            dedup_ttl_hours=settings.CHATFLOW_DEDUP_TTL_HOURS if dedup_ttl_hours is None else dedup_ttl_hours,
            lease_ttl_seconds=settings.CHATFLOW_LEASE_SECONDS if lease_ttl_seconds is None else lease_ttl_seconds,
        )
        self.using = using
        self._vendor = connections[using].vendor
        # Django connections this store used, by id: (the thread that owns it, the wrapper).
        self._opened: dict[int, tuple[weakref.ref[threading.Thread], Any]] = {}
        self._opened_mutex = threading.Lock()
        self._helper: ThreadPoolExecutor | None = None
        self._last_purge = 0.0
        self._queued: set[str] = set()  # lease owners of this store that joined a waiting line

    # ---- where queries run ------------------------------------------------------------------
    def _call(self, fn: Any, *args: Any) -> Any:
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

    def _tracked(self, fn: Any, *args: Any) -> Any:
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
        """Stop the store's threads and close the connections of every thread that has ended."""
        super().close()
        with self._opened_mutex:
            helper, self._helper = self._helper, None
        if helper is not None:
            helper.shutdown(wait=True)
        with self._opened_mutex:
            ended = [key for key, (thread, _) in self._opened.items() if not _alive(thread)]
            closing = [self._opened.pop(key)[1] for key in ended]
        _close_foreign(closing)  # live threads' connections stay with their threads

    # ---- queries -------------------------------------------------------------------------------
    def _sessions(self):
        return ChatSession.objects.using(self.using)

    def _messages(self):
        return ChatMessage.objects.using(self.using)

    def _stamp(self, at: float) -> Any:
        """A timestamp parameter for raw SQL: UTC text on SQLite (what the runtime writes), else aware."""
        moment = datetime.fromtimestamp(at, UTC)
        return moment.strftime("%Y-%m-%d %H:%M:%S.%f") if self._vendor == "sqlite" else moment

    def _head(self, session_id: str) -> StoredSession | None:
        """The session row and its version in one statement (raw SQL: this runs twice per turn,
        and compiling the equivalent annotated queryset cost ~1.5 ms, most of a turn)."""
        text = "::text" if self._vendor == "postgresql" else ""
        sql = (
            f"SELECT s.active_agent_name, s.metadata_json, COALESCE(s.created_at{text}, ''), "
            f"COALESCE(s.updated_at{text}, ''), "
            "(SELECT COALESCE(MAX(m.id), 0) FROM chatflow_messages m WHERE m.session_id = s.session_id), "
            "(SELECT COUNT(*) FROM chatflow_messages m WHERE m.session_id = s.session_id) "
            "FROM chatflow_sessions s WHERE s.session_id = %s"
        )
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, [session_id])
            row = cursor.fetchone()
        if row is None:
            return None
        agent, metadata, token, stamp, max_id, count = row
        return StoredSession(session_id, agent, json_object(metadata), token, (stamp, max_id, count))

    def _load(self, session_id: str) -> StoredSession | None:
        head = self._head(session_id)
        if head is not None:
            head.rows = [
                StoredRow(*row)
                for row in self._messages()
                .filter(session_id=session_id)
                .order_by("id")
                .values_list("id", "role", "content", "message_json")
            ]
        return head

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
            if changes.release_owner:
                released, _ = (
                    SessionLease.objects.using(self.using)
                    .filter(session_id=sid, owner=changes.release_owner)
                    .delete()
                )
                if released == 0:
                    # The lease expired and may belong to another turn now: committing could
                    # interleave with it, so this turn fails and writes nothing.
                    raise SessionBusyError(sid)
            head = self._head(sid)
        assert head is not None
        return CommitResult([m.id for m in created], head.token, head.version)

    def _delete(self, session_id: str) -> bool:
        with transaction.atomic(using=self.using):
            self._messages().filter(session_id=session_id).delete()
            deleted, _ = self._sessions().filter(pk=session_id).delete()
        return deleted > 0

    def _clear(self) -> None:
        with transaction.atomic(using=self.using):
            self._messages().all().delete()
            self._sessions().all().delete()

    def _execute(self, sql: str, params: tuple[Any, ...]) -> int:
        """One raw statement (autocommitted unless the caller is in a transaction); its rowcount."""
        with connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def _claim(self, message_id: str, ttl_seconds: float) -> bool:
        now = time.time()
        if now - self._last_purge > _PURGE_EVERY_SECONDS:
            self._last_purge = now
            self._purge(ttl_seconds)
        # One statement: a new id inserts, an id older than the TTL is claimed again, else nothing.
        return self._execute(
            "INSERT INTO chatflow_processed_messages (message_id, processed_at) VALUES (%s, %s) "
            "ON CONFLICT (message_id) DO UPDATE SET processed_at = EXCLUDED.processed_at "
            "WHERE chatflow_processed_messages.processed_at < %s",
            (message_id, self._stamp(now), self._stamp(now - ttl_seconds)),
        ) == 1

    def _is_processed(self, message_id: str, ttl_seconds: float) -> bool:
        cutoff = datetime.fromtimestamp(time.time() - ttl_seconds, UTC)
        return ProcessedMessage.objects.using(self.using).filter(pk=message_id, processed_at__gte=cutoff).exists()

    def _purge(self, ttl_seconds: float) -> int:
        cutoff = datetime.fromtimestamp(time.time() - ttl_seconds, UTC)
        deleted, _ = ProcessedMessage.objects.using(self.using).filter(processed_at__lt=cutoff).delete()
        return deleted

    def _acquire_lease(self, session_id: str, owner: str, ttl: float, queue: bool) -> bool:
        """Take the lease if it is free and nobody queued for it earlier (SQLiteSessionStore's rule).

        Fast path: one upsert. Otherwise join the session's waiting line (a ticket, kept alive by
        each poll) and take the lease only when first in line: FIFO across processes.
        """
        now = time.time()
        # Once in line, only the line's own rule applies: a fast-path win would leave this turn's
        # waiter row behind, holding up every later waiter until it expires.
        if owner not in self._queued and self._try_lease(session_id, owner, ttl, now, None):
            return True
        if not queue:
            return False
        self._queued.add(owner)
        waiters = SessionWaiter.objects.using(self.using)
        with transaction.atomic(using=self.using):
            ticket = waiters.filter(owner=owner).values_list("ticket", flat=True).first()
            if ticket is None:
                ticket = waiters.create(session_id=session_id, owner=owner, expires_at=now + _WAITER_TTL).ticket
            else:
                waiters.filter(owner=owner).update(expires_at=now + _WAITER_TTL)
            if self._try_lease(session_id, owner, ttl, now, ticket):
                waiters.filter(owner=owner).delete()
                self._queued.discard(owner)
                return True
        return False

    def _try_lease(self, session_id: str, owner: str, ttl: float, now: float, ticket: int | None) -> bool:
        """One statement: insert or take over an expired lease, unless a live waiter is ahead."""
        ahead = "" if ticket is None else "AND w.ticket < %s "
        params = [session_id, owner, now + ttl, now, session_id, now, owner,
                  *([] if ticket is None else [ticket]), now]
        return self._execute(
            "INSERT INTO chatflow_session_leases (session_id, owner, expires_at, acquired_at) SELECT %s, %s, %s, %s "
            "WHERE NOT EXISTS (SELECT 1 FROM chatflow_session_waiters w WHERE w.session_id = %s "
            f"AND w.expires_at >= %s AND w.owner <> %s {ahead}) "
            "ON CONFLICT (session_id) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at, "
            "acquired_at = EXCLUDED.acquired_at WHERE chatflow_session_leases.expires_at < %s",
            tuple(params),
        ) == 1

    def _leave_queue(self, owner: str) -> None:
        self._queued.discard(owner)
        SessionWaiter.objects.using(self.using).filter(owner=owner).delete()

    def _purge_leases(self, before: float) -> int:
        with transaction.atomic(using=self.using):  # a savepoint inside an operator's transaction
            leases, _ = SessionLease.objects.using(self.using).filter(expires_at__lt=before).delete()
            waiters, _ = SessionWaiter.objects.using(self.using).filter(expires_at__lt=before).delete()
        return leases + waiters

    def _renew_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        leases = SessionLease.objects.using(self.using).filter(session_id=session_id, owner=owner)
        return leases.update(expires_at=time.time() + ttl) == 1

    def _release_lease(self, session_id: str, owner: str) -> None:
        SessionLease.objects.using(self.using).filter(session_id=session_id, owner=owner).delete()

    # ---- PersistentSessionStore primitives ------------------------------------------------
    def _db_head(self, session_id: str) -> StoredSession | None:
        return self._call(self._head, session_id)

    def _db_load(self, session_id: str) -> StoredSession | None:
        return self._call(self._load, session_id)

    def _db_create(self, session_id: str, agent_name: str, metadata_json: str) -> None:
        self._call(self._create, session_id, agent_name, metadata_json)

    def _db_commit(self, changes: Changes) -> CommitResult:
        return self._call(self._commit, changes)

    def _db_delete(self, session_id: str) -> bool:
        return self._call(self._delete, session_id)

    def _db_list(self) -> list[str]:
        return self._call(lambda: list(self._sessions().order_by("-updated_at").values_list("pk", flat=True)))

    def _db_clear(self) -> None:
        self._call(self._clear)

    def _db_claim(self, message_id: str, ttl_seconds: float) -> bool:
        return self._call(self._claim, message_id, ttl_seconds)

    def _db_is_processed(self, message_id: str, ttl_seconds: float) -> bool:
        return self._call(self._is_processed, message_id, ttl_seconds)

    def _db_purge_processed(self, ttl_seconds: float) -> int:
        return self._call(self._purge, ttl_seconds)

    def _db_acquire_lease(self, session_id: str, owner: str, ttl: float, queue: bool = True) -> bool:
        return self._call(self._acquire_lease, session_id, owner, ttl, queue)

    def _db_leave_queue(self, session_id: str, owner: str) -> None:
        self._call(self._leave_queue, owner)

    def _db_renew_lease(self, session_id: str, owner: str, ttl: float) -> bool:
        return self._call(self._renew_lease, session_id, owner, ttl)

    def _db_release_lease(self, session_id: str, owner: str) -> None:
        self._call(self._release_lease, session_id, owner)

    def _db_purge_leases(self, before: float) -> int:
        return self._call(self._purge_leases, before)
