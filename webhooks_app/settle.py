"""A deleted session's webhook deliveries: settled with the deletion, never played into a new session.

Two receivers, connected in ``WebhooksAppConfig.ready`` (invariant 5):

- :func:`cancel_deliveries` (``sessions_app.actions.session_deleting``, inside the delete's
  transaction): the session's queued deliveries, and the running ones whose turn has not finished,
  become ``cancelled``; every delivery of the session loses its text, answer, payload and channel
  metadata. Provider ids, claim keys and the claims in ``chatflow_processed_messages`` stay, so a
  redelivery is still suppressed as a duplicate.
- :func:`refuse_cancelled_turn` (``sessions_app.store.session_committing``, inside a commit's
  transaction): a delivery's turn — claimed before the delete, played after it — cannot commit once
  its delivery is cancelled, so it never re-creates the session. The delivery's row is locked
  (PostgreSQL) before the session row, in the order the delete takes them, so a commit and a delete
  that race are serialised on it; on SQLite the two transactions are serialised anyway.

Only commits of deliveries this process is playing (:func:`playing`) are checked: other turns pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db.models import Q
from django.utils import timezone

from chatflow_agent.exceptions import SessionDeletedError
from webhooks_app.models import InboundDelivery
from webhooks_app.taskqueue import MARKER_KEY

__all__ = ["CANCELLED_ERROR", "CANCELLED_REPLY", "cancel_deliveries", "playing", "refuse_cancelled_turn"]

CANCELLED_ERROR = "The session was deleted before this message was played."
CANCELLED_REPLY = "The session was deleted: the reply is not sent again."

Status, Reply = InboundDelivery.Status, InboundDelivery.Reply
_playing: set[str] = set()  # markers of the deliveries whose turns this process is playing


@contextmanager
def playing(delivery: InboundDelivery) -> Iterator[None]:
    """While inside, a commit that carries ``delivery``'s marker is refused if the delivery is cancelled."""
    _playing.add(delivery.marker)
    try:
        yield
    finally:
        _playing.discard(delivery.marker)


def cancel_deliveries(sender: Any, session_id: str, **kwargs: Any) -> dict[str, int]:
    """Cancel the session's open deliveries and redact all of them; ``{"deliveries_cancelled": n, …}``."""
    deliveries = InboundDelivery.objects.filter(session_id=session_id)
    unplayed = Q(status=Status.QUEUED) | Q(status=Status.RUNNING, reply_status=InboundDelivery.Reply.PENDING)
    cancelled = deliveries.filter(unplayed).update(
        status=Status.CANCELLED, error=CANCELLED_ERROR, lease_owner="", lease_expires_at=None,
        finished_at=timezone.now(), reply_status=Reply.NONE,
    )
    redacted = deliveries.update(text="", answer="", payload={}, metadata={})
    # A reply that is unknown or failed can no longer be resent: its answer is gone. (A worker still
    # sending one records how its send ended afterwards.)
    deliveries.filter(reply_status__in=[Reply.SENDING, Reply.FAILED]).update(
        reply_status=Reply.NONE, reply_error=CANCELLED_REPLY)
    return {"deliveries_cancelled": cancelled, "deliveries_redacted": redacted}


def refuse_cancelled_turn(sender: Any, session_id: str, metadata: dict[str, Any], using: str = "default",
                          **kwargs: Any) -> None:
    """Raise ``SessionDeletedError`` when the commit is the turn of a delivery cancelled meanwhile."""
    marker = metadata.get(MARKER_KEY)
    if not isinstance(marker, str) or marker not in _playing:
        return
    pk, _, token = marker.partition(":")
    status = (InboundDelivery.objects.using(using).select_for_update().filter(pk=pk, token=token)
              .values_list("status", flat=True).first())
    if status == Status.CANCELLED:
        raise SessionDeletedError(session_id)
