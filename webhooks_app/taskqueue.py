"""The durable queue on ``InboundDelivery``: claim with a visibility timeout, renew, finish, fail, release.

Blocking ORM functions (workers call them on their own threads). A claim is one short transaction:
on PostgreSQL the candidate row is locked with ``SELECT … FOR UPDATE SKIP LOCKED``, so several
worker processes never block on, or take, the same delivery; on SQLite the transaction is
``BEGIN IMMEDIATE`` (settings), which serialises claims. A delivery is claimable when queued, or
running with an expired lease (its worker died: the visibility timeout), and only when no earlier
delivery of the same session is still queued or running, so one sender's messages are played in
the order they arrived even with many workers. Every later write is guarded by the lease owner:
a worker that lost its lease changes nothing.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from chatflow_agent.jsonsafe import json_object
from sessions_app.models import ChatMessage, ChatSession
from webhooks_app.inbox import release_claim
from webhooks_app.models import InboundDelivery

__all__ = ["MARKER_KEY", "claim_next", "claim", "renew", "finish", "fail", "complete", "release",
           "turn_committed", "last_answer", "pending"]

Status = InboundDelivery.Status
MARKER_KEY = "webhook_delivery"  # session metadata: the marker of the last delivery whose turn committed


def _unblocked(qs: Any) -> Any:
    """``qs`` without the deliveries that wait behind an earlier open one of the same session."""
    earlier = InboundDelivery.objects.filter(
        session_id=OuterRef("session_id"), id__lt=OuterRef("id"), status__in=[Status.QUEUED, Status.RUNNING]
    )
    return qs.filter(~Exists(earlier)).order_by("id")


def _claimable(now: Any):
    return _unblocked(InboundDelivery.objects.filter(
        Q(status=Status.QUEUED) | Q(status=Status.RUNNING, lease_expires_at__lt=now)
    ))


def _candidates(now: Any) -> list[Any]:
    """The two ways to be claimable, each as its own query in id order.

    One query with ``queued OR (running AND expired)`` cannot walk an index in id order: SQLite
    (and PostgreSQL) then test every queued row of a backlog and sort them, inside the claim's
    write transaction (measured: ~60 ms per claim with 5,000 queued, 14 turns/s). Each of these walks
    ``(status, id)`` and stops at its first unblocked row; the older of the two is the claim.
    """
    return [
        _unblocked(InboundDelivery.objects.filter(status=Status.RUNNING, lease_expires_at__lt=now)),
        _unblocked(InboundDelivery.objects.filter(status=Status.QUEUED)),
    ]


def _take(candidates: list[Any], owner: str, visibility: float, now: Any) -> InboundDelivery | None:
    found = []
    for qs in candidates:
        if connection.vendor == "postgresql":
            qs = qs.select_for_update(skip_locked=True, of=("self",))
        if (first := qs.first()) is not None:
            found.append(first)
    if not found:
        return None
    delivery = min(found, key=lambda d: d.pk)
    delivery.status = Status.RUNNING
    delivery.attempts += 1
    delivery.lease_owner = owner
    delivery.lease_expires_at = now + timedelta(seconds=visibility)
    delivery.save(update_fields=["status", "attempts", "lease_owner", "lease_expires_at"])
    return delivery


def claim_next(owner: str, visibility: float) -> InboundDelivery | None:
    """Claim the oldest claimable delivery for ``owner`` for ``visibility`` seconds, or None.

    An idle poll is reads outside any transaction: on SQLite a write transaction (BEGIN
    IMMEDIATE) per poll would take the write lock from the webhooks many times a second.
    """
    now = timezone.now()
    if not any(qs.exists() for qs in _candidates(now)):
        return None
    with transaction.atomic():
        return _take(_candidates(now), owner, visibility, now)


def claim(delivery_id: int, owner: str, visibility: float) -> InboundDelivery | None:
    """Claim this delivery if it is claimable now (``?wait=true`` plays it in the request)."""
    now = timezone.now()
    with transaction.atomic():
        return _take([_claimable(now).filter(pk=delivery_id)], owner, visibility, now)


def _mine(delivery: InboundDelivery, owner: str):
    return InboundDelivery.objects.filter(pk=delivery.pk, lease_owner=owner, status=Status.RUNNING)


def renew(delivery: InboundDelivery, owner: str, visibility: float) -> bool:
    """Extend the lease; False when it was lost (expired and taken by another worker)."""
    until = timezone.now() + timedelta(seconds=visibility)
    return _mine(delivery, owner).update(lease_expires_at=until) == 1


def finish(delivery: InboundDelivery, owner: str, answer: str, reply: str) -> bool:
    """Record the turn's ``answer``. ``reply`` NONE or HELD (held for an operator): done. SENDING: the reply
    goes out next and the delivery stays running (the sender's next delivery waits) until :func:`complete`.
    False if the lease was lost."""
    fields: dict[str, Any] = {"answer": answer, "reply_status": reply, "error": ""}
    if reply in (InboundDelivery.Reply.NONE, InboundDelivery.Reply.HELD):
        fields.update(status=Status.DONE, finished_at=timezone.now())
    return _mine(delivery, owner).update(**fields) == 1


def fail(delivery: InboundDelivery, owner: str, error: str, fallback: str, reply: str) -> bool:
    """Record a failed turn. ``reply`` NONE: failed now, and the id's claim released (invariant 6) in the
    same transaction. SENDING: the fallback goes out next, then :func:`complete` marks it failed."""
    with transaction.atomic():
        fields: dict[str, Any] = {"error": error[:4000] or "failed", "answer": fallback, "reply_status": reply}
        if reply == InboundDelivery.Reply.NONE:
            fields.update(status=Status.FAILED, finished_at=timezone.now())
        ok = _mine(delivery, owner).update(**fields) == 1
        if ok and reply == InboundDelivery.Reply.NONE:
            release_claim(delivery.claim_key)
    return ok


def complete(delivery: InboundDelivery, owner: str, reply: str, reply_error: str = "") -> None:
    """After the reply (or the fallback) was sent, or not: done, or failed with the claim released."""
    with transaction.atomic():
        mine = _mine(delivery, owner)
        common = {"reply_status": reply, "reply_error": reply_error[:4000], "finished_at": timezone.now()}
        mine.filter(error="").update(status=Status.DONE, **common)
        if mine.exclude(error="").update(status=Status.FAILED, **common):
            release_claim(delivery.claim_key)


def release(delivery: InboundDelivery, owner: str) -> None:
    """Give an unfinished delivery back to the queue (the worker is stopping)."""
    _mine(delivery, owner).update(status=Status.QUEUED, lease_owner="", lease_expires_at=None,
                                  attempts=F("attempts") - 1)


def turn_committed(delivery: InboundDelivery) -> bool:
    """True when this delivery's turn is in the session: its marker was committed with the turn's rows."""
    row = ChatSession.objects.filter(pk=delivery.session_id).values_list("metadata", flat=True).first()
    return row is not None and json_object(row).get(MARKER_KEY) == delivery.marker


def last_answer(session_id: str) -> str:
    """The newest model answer of the session (the turn of a delivery recovered after a crash)."""
    answers = ChatMessage.objects.filter(session_id=session_id, role="model").order_by("-id")
    content = answers.values_list("content", flat=True).first()
    return content or ""


def pending() -> int:
    """Deliveries queued or running."""
    return InboundDelivery.objects.filter(status__in=[Status.QUEUED, Status.RUNNING]).count()
