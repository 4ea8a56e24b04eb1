"""A delivery's turn and its session, settled together: a deleted session's deliveries are never played into a
new session, and a delivery's turn commits with what it answered.

Two hooks:

- :func:`cancel_deliveries` (registered with ``sessions_app.holdings`` in ``WebhooksAppConfig.ready``: run
  inside a session delete's
  transaction; invariant 5): the session's queued deliveries, the running ones whose turn has not
  finished, and the failed ones (no retry can play them any more) become ``cancelled``; every delivery
  of the session loses its text, answer, payload and channel metadata (a done one says so in its error,
  :data:`ANSWER_GONE`). Provider ids, claim keys and the
  claims in ``chatflow_processed_messages`` stay, so a redelivery is still suppressed as a duplicate.
- :meth:`Playing.settle`, the commit hook a delivery's turn carries (``Playing(...).hooks()``, given to
  ``Runner.run_async(..., hooks=...)`` or the store's ``turn``; ``chatflow_agent.core.hooks``), run inside
  that turn's commit transaction: the delivery records the turn's answer and
  its reply status (``taskqueue.finish``) in that transaction, so it is stored if and only if the turn is,
  with no write of its own. Its update takes the delivery's row lock (PostgreSQL) before the session row,
  in the order the delete takes them, so a commit and a delete that race are serialised on it (on SQLite
  the two transactions are serialised anyway). When the update finds the delivery no longer this worker's,
  the commit is refused and nothing is written: ``SessionDeletedError`` if it was cancelled (its session
  deleted: the turn never re-creates it), :class:`DeliveryLost` otherwise (its lease passed to another
  worker, which plays it).

- :func:`settle_unrecorded`: the same record, on its own, for a delivery whose turn's commit did not record it
  (a turn played before a crash, a reset…): the worker calls it after the turn.

Other turns carry no such hook and pay nothing. Nothing else records a turn's answer on its delivery.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Case, F, Q, TextField, Value, When
from django.db.models.functions import Coalesce, Concat
from django.utils import timezone

from chatflow_agent.core.hooks import TurnCommit, TurnHooks
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from webhooks_app import taskqueue
from webhooks_app.models import InboundDelivery

__all__ = ["ANSWER_GONE", "CANCELLED_ERROR", "CANCELLED_FAILED", "CANCELLED_REPLY", "DeliveryLost", "Playing",
           "cancel_deliveries", "settle_unrecorded"]

CANCELLED_ERROR = "The session was deleted before this message was played."
CANCELLED_REPLY = "The session was deleted: the reply is not sent again."
#: The error of a delivery that was done when its session was deleted: its answer went with the session.
ANSWER_GONE = "The session was deleted after this message was answered: the answer is gone."
#: The start of the error of a failed delivery whose session was deleted (its failure's error follows).
CANCELLED_FAILED = "The session was deleted after this message failed; it cannot be retried. It failed with: "

Status, Reply = InboundDelivery.Status, InboundDelivery.Reply


class DeliveryLost(SessionBusyError):
    """The delivery's turn could not commit: its lease passed to another worker, which plays it."""


@dataclass
class Playing:
    """``Playing(delivery, owner, replies_out, answer=None, using="default")``: a delivery whose turn a worker
    plays, and the commit hook that settles it (:meth:`settle`). ``owner``: the worker's lease owner on the
    delivery; ``replies_out``: its channel sends the answer back (WhatsApp, Telegram); ``answer``: the answer
    when the turn gives none of its own (a reset clears the history), else None; ``using``: the database
    alias of the store that commits the turn. ``settled`` turns True once a commit that recorded the answer
    is committed.
    """

    delivery: InboundDelivery
    owner: str
    replies_out: bool
    answer: str | None = None
    using: str = "default"
    settled: bool = False

    def hooks(self) -> TurnHooks:
        """The commit hooks of the delivery's turn: :meth:`settle`, alone."""
        return TurnHooks([self.settle])

    def settle(self, commit: TurnCommit) -> None:
        """Commit hook (inside the turn's commit transaction): record the turn's answer on the delivery, or
        refuse the commit with ``SessionDeletedError`` (the delivery was cancelled: its session deleted) or
        :class:`DeliveryLost` (the delivery is no longer this worker's)."""
        if self.settled:
            return  # recorded by a commit already (nothing commits twice; a guard all the same)
        report = commit.report
        answer = self.answer if report is None or report.response is None else taskqueue.answer_of(report.response)
        text, reply = taskqueue.outcome(answer, self.replies_out)
        if taskqueue.finish(self.delivery, self.owner, text, reply, self.using):
            # Settled once the commit is: a commit refused after this (a lost session lease) rolls it back too.
            transaction.on_commit(lambda: setattr(self, "settled", True), using=self.using)
            return
        if taskqueue.status_of(self.delivery, self.using) == Status.CANCELLED:
            raise SessionDeletedError(commit.session_id)
        raise DeliveryLost(commit.session_id)


def settle_unrecorded(delivery: InboundDelivery, owner: str, text: str, reply: str) -> bool:
    """Record ``text`` (the turn's answer, ``taskqueue.outcome``) and ``reply`` (its reply status) on a delivery
    whose turn's commit did not, in autocommit (``taskqueue.finish``); False when the delivery is no longer
    ``owner``'s (its lease passed on, or it was played again since)."""
    return taskqueue.finish(delivery, owner, text, reply)


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
