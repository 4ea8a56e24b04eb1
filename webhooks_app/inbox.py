"""Accepting webhook messages into the inbox, and retrying failed ones.

``accept`` is the webhook's whole synchronous work: in ONE transaction, for each message in payload
order, claim its id in ``chatflow_processed_messages`` with the store's one-statement claim
(``record_processed_message``: a unique key; the TTL runs from the first delivery; an expired id
is claimed again) and, when the claim wins, enqueue the delivery. A redelivery inside the TTL only
increments ``duplicates_suppressed``. Either everything of a payload is written or nothing is.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.models import F
from django.utils import timezone

from sessions_app.runtime import site_store
from sessions_app.store import driver_cursor
from webhooks_app import embedded, tracing
from webhooks_app.models import InboundDelivery

__all__ = ["Inbound", "Accepted", "accept", "aaccept", "claim_key", "retry", "RetryRefused"]

Status = InboundDelivery.Status


@dataclass(frozen=True)
class Inbound:
    """One message parsed from a webhook payload."""

    provider: str
    provider_message_id: str
    session_id: str
    kind: str = InboundDelivery.Kind.TEXT
    text: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    traceparent: str = ""  # W3C trace context of its acknowledgement (webhooks_app.tracing), "" untraced


@dataclass
class Accepted:
    """What ``accept`` did: the deliveries it queued, how many messages were duplicates, and the ids of
    messages refused because another session's message already has that id (nothing written for them)."""

    queued: list[InboundDelivery] = field(default_factory=list)
    duplicates: int = 0
    conflicts: list[str] = field(default_factory=list)


def claim_key(provider: str, provider_message_id: str) -> str:
    """The id claimed in chatflow_processed_messages: WhatsApp's wamid as it is (what a 0.3.4 bot
    using the seed's handler claims), ``telegram:<update_id>`` and ``generic:<message_id>`` otherwise."""
    if provider == InboundDelivery.Provider.WHATSAPP:
        return provider_message_id
    return f"{provider}:{provider_message_id}"


def accept(messages: list[Inbound]) -> Accepted:
    """Claim and enqueue ``messages`` (in order) in one transaction; see the module docstring."""
    result = Accepted()
    store = site_store()
    with transaction.atomic():
        for msg in messages:
            delivery = _accept_one(store, msg)
            if delivery is _CONFLICT:
                result.conflicts.append(msg.provider_message_id)
            elif delivery is None:
                result.duplicates += 1
            else:
                result.queued.append(delivery)
                tracing.remember(delivery.pk, msg.traceparent)
        if result.queued:
            transaction.on_commit(_wake_workers)
    return result


#: False: ``aaccept`` runs on the caller's thread-sensitive thread (tests inside a test transaction).
use_inbox_threads = True
_executor: ThreadPoolExecutor | None = None
_executor_mutex = threading.Lock()


def _inbox_executor() -> ThreadPoolExecutor:
    """Long-lived threads for ``accept``, each keeping its database connection open.

    Under ASGI every sync view runs on a new thread with a new connection, closed after the request:
    on PostgreSQL a connection costs a backend start-up, and on SQLite closing the last connection
    checkpoints the WAL, ~10 ms per webhook either way. One thread on SQLite (writes are serialised
    anyway), four on PostgreSQL.
    """
    global _executor
    with _executor_mutex:
        if _executor is None:
            workers = 1 if connection.vendor == "sqlite" else 4
            _executor = ThreadPoolExecutor(workers, thread_name_prefix="chatflow-inbox")
        return _executor


_LOCK_RETRY_SECONDS = 0.0005
_LOCK_GIVE_UP_SECONDS = 20.0


def _accept_on_inbox_thread(messages: list[Inbound]) -> Accepted:
    """``accept``; on SQLite, waiting for the write lock by polling every 0.5 ms.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25… ms between attempts, so a webhook that
    collides with a worker's commit could wait tens of milliseconds after the lock is free. The inbox
    connection has no busy timeout and retries BEGIN IMMEDIATE itself: acknowledgements go first.
    """
    deadline = time.monotonic() + _LOCK_GIVE_UP_SECONDS
    while True:
        try:
            if connection.vendor == "sqlite":
                connection.ensure_connection()
                if not getattr(connection, "_chatflow_inbox", False):
                    connection.connection.execute("PRAGMA busy_timeout = 0")
                    connection._chatflow_inbox = True
            return accept(messages)
        except OperationalError as err:
            locked = connection.vendor == "sqlite" and "locked" in str(err)
            if not locked or time.monotonic() > deadline:
                connection.close()
                raise
            time.sleep(_LOCK_RETRY_SECONDS)
        except DatabaseError:
            connection.close()  # reconnect next time: the connection may be broken
            raise


async def aaccept(messages: list[Inbound]) -> Accepted:
    """``accept`` from an async view, on the inbox threads (see :func:`_inbox_executor`)."""
    if not use_inbox_threads:
        return await sync_to_async(accept)(messages)
    return await asyncio.get_running_loop().run_in_executor(_inbox_executor(), _accept_on_inbox_thread, messages)


_TABLE = InboundDelivery._meta.db_table
# A new message's delivery, or nothing when a delivery of its id exists (then _accept_seen decides).
_INSERT_NEW = (
    f"INSERT INTO {_TABLE} (provider, provider_message_id, claim_key, session_id, kind, text, metadata, payload, "
    "status, attempts, first_seen, last_seen, duplicates_suppressed, token, lease_owner, lease_expires_at, error, "
    "answer, reply_status, reply_error, finished_at) VALUES (?, ?, ?, ?, ?, ?, {json}, {json}, 'queued', 0, ?, ?, 0, "
    "?, '', NULL, '', '', '', '', NULL) ON CONFLICT (provider, provider_message_id) DO NOTHING RETURNING id"
)
_DUPLICATE = (f"UPDATE {_TABLE} SET duplicates_suppressed = duplicates_suppressed + 1, last_seen = ? "
              "WHERE provider = ? AND provider_message_id = ? AND session_id = ? RETURNING id")
_OTHER_SESSION = f"SELECT 1 FROM {_TABLE} WHERE provider = ? AND provider_message_id = ? AND session_id <> ?"
#: What ``_accept_one`` returns for a message whose id another session's delivery has.
_CONFLICT: Any = object()


def _accept_one(store: Any, msg: Inbound) -> InboundDelivery | None:
    """Claim ``msg``'s id and queue its delivery (inside ``accept``'s transaction); None for a duplicate,
    ``_CONFLICT`` for an id another session's delivery has (ids are de-duplicated across the channel, so it
    is neither played nor counted as that delivery's duplicate).

    The two statements every message makes (the claim, then the new delivery's insert, or a duplicate's
    count) run on the driver's cursor; a message whose id has a delivery already goes through
    :func:`_accept_seen`."""
    now = timezone.now()
    at = connection.ops.adapt_datetimefield_value(now)
    key = claim_key(msg.provider, msg.provider_message_id)
    if not store.record_processed_message(key):  # one statement, in this transaction
        ids = [msg.provider, msg.provider_message_id, msg.session_id]
        if _execute(_DUPLICATE, [at, *ids]) is None and _execute(_OTHER_SESSION, ids) is not None:
            return _CONFLICT
        return None
    token = uuid.uuid4().hex
    row = _execute(_INSERT_NEW, [msg.provider, msg.provider_message_id, key, msg.session_id, msg.kind, msg.text,
                                 json.dumps(msg.metadata), json.dumps(msg.payload), at, at, token])
    if row is None:
        return _accept_seen(msg, key, now)
    values = {"id": row[0], "provider": msg.provider, "provider_message_id": msg.provider_message_id,
              **_fields(msg, key, now, token)}
    concrete = InboundDelivery._meta.concrete_fields
    return InboundDelivery.from_db(connection.alias, [f.attname for f in concrete],
                                   [values[f.attname] for f in concrete])


def _execute(sql: str, params: list[Any]) -> Any:
    """One statement on the driver's cursor of this thread's connection; its first row (None without one)."""
    with driver_cursor() as (cursor, dialect):
        cursor.execute(dialect.render(sql), params)
        return cursor.fetchone() if cursor.description else None


def _fields(msg: Inbound, key: str, now: Any, token: str) -> dict[str, Any]:
    """A queued delivery's fields (those ``_INSERT_NEW`` writes)."""
    return {
        "claim_key": key, "session_id": msg.session_id, "kind": msg.kind, "text": msg.text,
        "metadata": msg.metadata, "payload": msg.payload, "status": Status.QUEUED, "attempts": 0,
        "first_seen": now, "last_seen": now, "duplicates_suppressed": 0, "token": token,
        "lease_owner": "", "lease_expires_at": None, "error": "", "answer": "", "reply_status": "",
        "reply_error": "", "finished_at": None,
    }


def _accept_seen(msg: Inbound, key: str, now: Any) -> InboundDelivery | None:
    """The claim was won but a delivery of this id exists: after the TTL, or after a failure released the claim."""
    same = InboundDelivery.objects.filter(provider=msg.provider, provider_message_id=msg.provider_message_id)
    existing = same.select_for_update().get()
    if existing.status in (Status.QUEUED, Status.RUNNING):
        # The claim had expired (or was released) while the delivery still waits or runs: it is
        # the same work, so this is a duplicate, not a second turn.
        same.update(duplicates_suppressed=F("duplicates_suppressed") + 1, last_seen=now)
        return None
    # A new delivery of an id seen before.
    for name, value in _fields(msg, key, now, uuid.uuid4().hex).items():
        setattr(existing, name, value)
    existing.save()
    return existing


class RetryRefused(Exception):
    """The delivery is not failed (any more), or its id was claimed again meanwhile."""


def retry(delivery_id: int) -> InboundDelivery:
    """Queue a failed delivery again: re-claim its id and queue it, in one transaction."""
    with transaction.atomic():
        delivery = InboundDelivery.objects.select_for_update().filter(pk=delivery_id).first()
        if delivery is None or delivery.status != Status.FAILED:
            raise RetryRefused("Only a failed delivery can be retried.")
        if not site_store().record_processed_message(delivery.claim_key):
            raise RetryRefused("This message id was claimed again meanwhile (a redelivery is being processed).")
        delivery.status = Status.QUEUED
        delivery.token = uuid.uuid4().hex
        delivery.error = ""
        delivery.answer = ""
        delivery.reply_status = ""
        delivery.reply_error = ""
        delivery.finished_at = None
        delivery.lease_owner = ""
        delivery.lease_expires_at = None
        delivery.save()
        transaction.on_commit(_wake_workers)
    return delivery


def release_claim(key: str) -> None:
    """Release a claim (a failure before the turn committed: invariant 6) with the store's one-statement
    release (``release_processed_message``, written beside its claim); call inside the failing transaction."""
    site_store().release_processed_message(key)


def _wake_workers() -> None:
    embedded.wake()
