"""A delivery's turn and its session, settled together: a deleted session's deliveries are never played into a
new session, and a delivery's turn commits with what it answered.

Two hooks, connected in ``WebhooksAppConfig.ready``:

- :func:`cancel_deliveries` (registered with ``sessions_app.holdings``: run inside a session delete's
  transaction; invariant 5): the session's queued deliveries, the running ones whose turn has not
  finished, and the failed ones (no retry can play them any more) become ``cancelled``; every delivery
  of the session loses its text, answer, payload and channel metadata (a done one says so in its error,
  :data:`ANSWER_GONE`). Provider ids, claim keys and the
  claims in ``chatflow_processed_messages`` stay, so a redelivery is still suppressed as a duplicate.
- :func:`settle_turn` (``sessions_app.store.session_committing``, inside the commit's transaction of a
  delivery's turn — one this process plays, :func:`playing`): the delivery records the turn's answer and
  its reply status (``taskqueue.finish``) in that transaction, so it is stored if and only if the turn is,
  with no write of its own. Its update takes the delivery's row lock (PostgreSQL) before the session row,
  in the order the delete takes them, so a commit and a delete that race are serialised on it (on SQLite
  the two transactions are serialised anyway). When the update finds the delivery no longer this worker's,
  the commit is refused and nothing is written: ``SessionDeletedError`` if it was cancelled (its session
  deleted: the turn never re-creates it), :class:`DeliveryLost` otherwise (its lease passed to another
  worker, which plays it).

Other turns pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Q, TextField, Value, When
from django.db.models.functions import Coalesce, Concat
from django.utils import timezone

from chatflow_agent.core.reports import TurnReport
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from webhooks_app import taskqueue
from webhooks_app.models import InboundDelivery
from webhooks_app.taskqueue import MARKER_KEY

__all__ = ["ANSWER_GONE", "CANCELLED_ERROR", "CANCELLED_FAILED", "CANCELLED_REPLY", "DeliveryLost", "Playing",
           "cancel_deliveries", "playing", "settle_turn"]

CANCELLED_ERROR = "The session was deleted before this message was played."
CANCELLED_REPLY = "The session was deleted: the reply is not sent again."
#: The error of a delivery that was done when its session was deleted: its answer went with the session.
ANSWER_GONE = "The session was deleted after this message was answered: the answer is gone."
#: The start of the error of a failed delivery whose session was deleted (its failure's error follows).
CANCELLED_FAILED = "The session was deleted after this message failed; it cannot be retried. It failed with: "

Status, Reply = InboundDelivery.Status, InboundDelivery.Reply


@dataclass
class Playing:
    """A delivery whose turn this process is playing (see :func:`playing`); ``settled`` turns True when its
    turn's commit, having recorded the answer, is committed."""

    delivery: InboundDelivery
    owner: str  # the worker's lease owner
    replies_out: bool  # the channel sends the answer back (WhatsApp, Telegram)
    answer: str | None  # the answer when the turn has none of its own (a reset), else None
    settled: bool = False


_playing: dict[str, Playing] = {}  # marker → the delivery whose turn this process is playing


class DeliveryLost(SessionBusyError):
    """The delivery's turn could not commit: its lease passed to another worker, which plays it."""


@contextmanager
def playing(delivery: InboundDelivery, owner: str, replies_out: bool, answer: str | None = None) -> Iterator[Playing]:
    """While inside, the commit that carries ``delivery``'s marker also records the turn's answer on the delivery
    (see the module docstring); ``answer`` stands for a turn that gives none (a reset clears the history)."""
    play = _playing[delivery.marker] = Playing(delivery, owner, replies_out, answer)
    try:
        yield play
    finally:
        _playing.pop(delivery.marker, None)


def cancel_deliveries(session_id: str) -> dict[str, int]:
    """Cancel the session's open and failed deliveries and redact all of them; ``{"deliveries_cancelled": n, …}``."""
    deliveries = InboundDelivery.objects.filter(session_id=session_id)
    unplayed = Q(status=Status.QUEUED) | Q(status=Status.RUNNING, reply_status=InboundDelivery.Reply.PENDING)
    cancelled = deliveries.filter(unplayed).update(
        status=Status.CANCELLED, error=CANCELLED_ERROR, lease_owner="", lease_expires_at=None,
        finished_at=timezone.now(), reply_status=Reply.NONE,
    )
    # A failed delivery ends too: its text is about to go, and a retry would play it into a new session. So
    # does one whose turn failed while its fallback reply is still going out (its worker's completion would
    # mark it failed after this; it then finds it no longer running and changes nothing).
    failed = Q(status=Status.FAILED) | (Q(status=Status.RUNNING) & ~Q(error=""))
    cancelled += deliveries.filter(failed).update(
        status=Status.CANCELLED, error=Concat(Value(CANCELLED_FAILED), F("error")), lease_owner="",
        lease_expires_at=None, finished_at=Coalesce(F("finished_at"), Value(timezone.now())))
    redacted = deliveries.update(text="", answer="", payload={}, metadata={}, error=Case(
        When(status=Status.DONE, then=Value(ANSWER_GONE)), default=F("error"), output_field=TextField()))
    # A reply that is unknown or failed can no longer be resent: its answer is gone. (A worker still
    # sending one records how its send ended afterwards.)
    deliveries.filter(reply_status__in=[Reply.SENDING, Reply.FAILED]).update(
        reply_status=Reply.NONE, reply_error=CANCELLED_REPLY)
    return {"deliveries_cancelled": cancelled, "deliveries_redacted": redacted}


def settle_turn(sender: Any, session_id: str, metadata: dict[str, Any], using: str = "default",
                report: TurnReport | None = None, **kwargs: Any) -> None:
    """Record the turn's answer on its delivery, in the commit's transaction, or refuse the commit."""
    marker = metadata.get(MARKER_KEY)
    play = _playing.get(marker) if isinstance(marker, str) else None
    if play is None or play.settled:
        return  # not a delivery's turn here, or a later commit on the session while the delivery ends
    answer = play.answer if report is None or report.response is None else taskqueue.answer_of(report.response)
    text, reply = taskqueue.outcome(answer, play.replies_out)
    if taskqueue.finish(play.delivery, play.owner, text, reply, using):
        # Settled once the commit is: a commit refused after this (a lost session lease) rolls it back too.
        transaction.on_commit(lambda: setattr(play, "settled", True), using=using)
        return
    if taskqueue.status_of(play.delivery, using) == Status.CANCELLED:
        raise SessionDeletedError(session_id)
    raise DeliveryLost(session_id)
