"""The console's dedup ledger: a session's inbound deliveries, and the audited retry of a failed one."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction

from sessions_app import actions
from sessions_app.access import may
from webhooks_app import inbox
from webhooks_app.models import InboundDelivery

__all__ = ["context", "retry", "queue_thread", "RETRY_ACTION", "LEDGER_SIZE"]

RETRY_ACTION = "retry_delivery"
LEDGER_SIZE = 50


def context(user: Any, session_id: str, note: str = "", refused: bool = False) -> dict[str, Any]:
    """The ledger partial's context: the session's newest deliveries (at most LEDGER_SIZE)."""
    deliveries = list(InboundDelivery.objects.filter(session_id=session_id).order_by("-id")[:LEDGER_SIZE])
    return {
        "ledger_session_id": session_id,
        "deliveries": deliveries,
        "can_retry": may(user, "webhooks_app.retry_delivery"),
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


@contextmanager
def queue_thread() -> Iterator[ThreadPoolExecutor]:
    """A one-thread executor for queue queries from an event loop; its connection is closed at the end."""
    ex = ThreadPoolExecutor(1, thread_name_prefix="chatflow-queue-request")
    try:
        yield ex
    finally:
        ex.submit(connections.close_all).result()
        ex.shutdown()
