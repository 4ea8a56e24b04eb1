"""The console's dedup ledger: a session's inbound deliveries, the audited retry of a failed one, and the
audited resend of a reply that may not have reached the customer.

A reply is *unknown* when ``reply_status=sending`` was recorded and no worker will finish the send: the
delivery is done/failed (a worker claimed it again after a crash, and never sends twice), or still
running with an expired lease (its worker died and none has claimed it yet). Such a reply, and one whose
send failed, can be resent by an operator (:func:`resend`): at most one send per click.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.conf import settings
from django.db import connections, transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet
from django.utils import timezone

from sessions_app import actions
from sessions_app.access import may
from webhooks_app import inbox, replies, taskqueue
from webhooks_app.access import RESEND, RETRY
from webhooks_app.models import InboundDelivery

__all__ = ["context", "retry", "queue_thread", "with_reply_state", "attention_context", "resend", "ResendRefused",
           "RETRY_ACTION", "RESEND_ACTION", "LEDGER_SIZE", "reply_failed_flag",
           "turn_failed_flag"]

RETRY_ACTION = "retry_delivery"
RESEND_ACTION = "resend_reply"
LEDGER_SIZE = 50

Status, Reply, Provider = InboundDelivery.Status, InboundDelivery.Reply, InboundDelivery.Provider
_FINISHED = [Status.DONE, Status.FAILED]


def _reply_unknown(now: Any) -> Q:
    """``sending`` recorded and no worker finishing the send (see the module docstring)."""
    return Q(reply_status=Reply.SENDING) & (
        Q(status__in=_FINISHED) | Q(status=Status.RUNNING, lease_expires_at__lt=now))


def _resendable(now: Any) -> Q:
    """A reply of a channel that answers (WhatsApp, Telegram) that is unknown, or whose send failed, and
    that still has an answer to send."""
    return Q(provider__in=[Provider.WHATSAPP, Provider.TELEGRAM]) & ~Q(answer="") & (
        _reply_unknown(now) | Q(reply_status=Reply.FAILED, status__in=_FINISHED))


def with_reply_state(qs: QuerySet | None = None) -> QuerySet:
    """``qs`` (every delivery by default) with the booleans ``reply_unknown`` and ``resendable``."""
    now = timezone.now()
    qs = InboundDelivery.objects.all() if qs is None else qs
    return qs.annotate(reply_unknown=ExpressionWrapper(_reply_unknown(now), output_field=BooleanField()),
                       resendable=ExpressionWrapper(_resendable(now), output_field=BooleanField()))


def reply_failed_flag() -> Exists:
    """For the session list (``console_app.listing.register_flag``): the session has a reply that failed
    or may not have reached the customer (one Resend would send it)."""
    return Exists(InboundDelivery.objects.filter(_resendable(timezone.now()), session_id=OuterRef("pk")))


def turn_failed_flag() -> Exists:
    """For the session list: the session's newest delivery failed (its turn raised; Retry queues it again)."""
    later = InboundDelivery.objects.filter(session_id=OuterRef("session_id"), id__gt=OuterRef("id"))
    return Exists(InboundDelivery.objects.filter(session_id=OuterRef("pk"), status=Status.FAILED)
                  .exclude(Exists(later)))


def context(user: Any, session_id: str, note: str = "", refused: bool = False) -> dict[str, Any]:
    """The ledger partial's context: the session's newest deliveries (at most LEDGER_SIZE)."""
    found = list(with_reply_state(InboundDelivery.objects.filter(session_id=session_id)).order_by("-id")[:LEDGER_SIZE])
    return {
        "ledger_session_id": session_id,
        "deliveries": found,
        "can_retry": may(user, RETRY),
        "can_resend": may(user, RESEND),
        "ledger_note": note,
        "ledger_refused": refused,
    }


def retry(user: Any, delivery: InboundDelivery) -> InboundDelivery:
    """Queue a failed delivery again and write the audit entry, in one transaction."""
    with transaction.atomic():
        before = {"delivery": delivery.pk, "provider": delivery.provider,
                  "provider_message_id": delivery.provider_message_id, "status": delivery.status,
                  "error": delivery.error[:500], "attempts": delivery.attempts}
        queued = inbox.retry(delivery.pk)
        actions.audit(user, RETRY_ACTION, delivery.session_id, before,
                      {"delivery": queued.pk, "status": queued.status})
    return queued


def attention_context(user: Any) -> dict[str, Any]:
    """The cross-session list: the newest deliveries (at most LEDGER_SIZE) whose reply can be resent."""
    qs = with_reply_state().filter(resendable=True).order_by("-id")
    return {"deliveries": list(qs[:LEDGER_SIZE]), "total": qs.count(),
            "can_retry": may(user, RETRY),
            "can_resend": may(user, RESEND)}


class ResendRefused(Exception):
    """The reply is not unknown or failed (any more): e.g. a resend of it is in progress."""


def resend(user: Any, delivery: InboundDelivery) -> InboundDelivery:
    """Send the delivery's stored answer again through its channel and record the new reply status.

    One transaction claims the resend (the delivery runs again under a lease of ``resend:<hex>``, with
    ``reply_status=sending``, so a second click or a worker cannot take it) and writes the audit entry;
    then the answer is sent (split as the worker does, :func:`replies.send`) and ``sent``/``failed`` is
    recorded by :func:`taskqueue.complete`. Returns the delivery as recorded. Raises ResendRefused.
    """
    owner = f"resend:{uuid.uuid4().hex[:12]}"
    claimed = _claim_resend(user, delivery.pk, owner)
    try:
        async_to_sync(_send)(claimed, owner)
    except Exception as err:  # noqa: BLE001 - recorded on the delivery, shown in the ledger
        taskqueue.complete(claimed, owner, Reply.FAILED, f"{type(err).__name__}: {err}")
    else:
        taskqueue.complete(claimed, owner, Reply.SENT)
    claimed.refresh_from_db()
    return claimed


def _claim_resend(user: Any, delivery_id: int, owner: str) -> InboundDelivery:
    now = timezone.now()
    with transaction.atomic():
        # The condition is in the WHERE clause: PostgreSQL checks it again once the row lock is granted.
        delivery = with_reply_state(InboundDelivery.objects.select_for_update().filter(pk=delivery_id)).filter(
            resendable=True).first()
        if delivery is None:
            raise ResendRefused("Only a reply that is unknown or failed can be resent; "
                                "this one is being sent, was sent, or has nothing to send.")
        before = {"delivery": delivery.pk, "provider": delivery.provider,
                  "provider_message_id": delivery.provider_message_id, "status": delivery.status,
                  "reply_status": "unknown" if delivery.reply_unknown else delivery.reply_status,
                  "reply_error": delivery.reply_error[:500]}
        delivery.status, delivery.reply_status, delivery.reply_error = Status.RUNNING, Reply.SENDING, ""
        delivery.lease_owner = owner
        delivery.lease_expires_at = now + timedelta(seconds=settings.CHATFLOW_LEASE_SECONDS)
        delivery.save(update_fields=["status", "reply_status", "reply_error", "lease_owner", "lease_expires_at"])
        actions.audit(user, RESEND_ACTION, delivery.session_id, before,
                      {"delivery": delivery.pk, "reply_status": Reply.SENDING})
    return delivery


async def _send(delivery: InboundDelivery, owner: str) -> None:
    """Send the answer, renewing the resend's lease every third of it until the send ends (a send that
    outlasted its lease would make the reply look unknown, and resendable, while it goes out)."""
    lease = settings.CHATFLOW_LEASE_SECONDS
    renew = sync_to_async(taskqueue.renew)  # thread-sensitive: the request's own database connection
    async with replies.client() as http:
        sending = asyncio.ensure_future(replies.send(http, delivery, delivery.answer))
        while not (await asyncio.wait({sending}, timeout=lease / 3))[0]:
            await renew(delivery, owner, lease)
        sending.result()


@contextmanager
def queue_thread() -> Iterator[ThreadPoolExecutor]:
    """A one-thread executor for queue queries from an event loop; its connection is closed at the end."""
    ex = ThreadPoolExecutor(1, thread_name_prefix="chatflow-queue-request")
    try:
        yield ex
    finally:
        ex.submit(connections.close_all).result()
        ex.shutdown()
