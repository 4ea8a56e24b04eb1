"""What the health page shows, read in a handful of indexed queries.

Sections: the queue per provider (depth and oldest queued age), turns running longer than
``CHATFLOW_HEALTH_LONG_TURN_SECONDS`` (their turn record and their session's lease: the owning process
and until when it holds the session), expired session leases and the turns waiting for a lease, failed
deliveries and replies that failed or whose fate is unknown (``webhooks_app.ledger``'s rule), operator
replies that failed or whose fate is unknown (``OperatorReply.needing_resend``), and the worker
heartbeats. Long lists are paginated (``PAGE_SIZE`` rows, ``?<section>_page=N``).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.utils import timezone

from health_app.access import CANCEL
from health_app.models import WorkerHeartbeat
from sessions_app.access import may
from sessions_app.models import ChatSession, SessionLease, SessionWaiter
from takeover_app.access import REPLY  # the session page's Resend of an operator reply needs the same
from takeover_app.models import OperatorReply
from turns_app.models import TurnRecord
from webhooks_app import ledger, taskqueue
from webhooks_app.access import RESEND, RETRY
from webhooks_app.models import InboundDelivery

__all__ = ["PAGE_SIZE", "long_turns", "context", "process_of"]

PAGE_SIZE = 25
Status = InboundDelivery.Status


def process_of(owner: str) -> str:
    """``host:pid`` of a lease or worker owner (``host:pid:…`` or ``worker:host:pid:…``), else the owner."""
    parts = owner.split(":")
    if parts and parts[0] in ("worker", "resend"):
        parts = parts[1:]
    return ":".join(parts[:2]) if len(parts) >= 2 else owner


def long_turns() -> Any:
    """Turn records still ``running`` that started more than the threshold ago, oldest first."""
    since = timezone.now() - timedelta(seconds=settings.CHATFLOW_HEALTH_LONG_TURN_SECONDS)
    running = TurnRecord.objects.filter(status=TurnRecord.Status.RUNNING, started_at__lt=since)
    return running.order_by("started_at", "id")


def _page(request: Any, name: str, qs: Any) -> Page:
    return Paginator(qs, PAGE_SIZE).get_page(request.GET.get(f"{name}_page"))


def _with_leases(turns: Page) -> list[dict[str, Any]]:
    """Each turn with its session's lease, its process and whether its session exists yet (a first turn's
    session is created when that turn commits)."""
    ids = [t.session_id for t in turns]
    leases = {lease.session_id: lease for lease in SessionLease.objects.filter(session_id__in=ids)}
    existing = set(ChatSession.objects.filter(session_id__in=ids).values_list("session_id", flat=True))
    alive = _alive_processes()
    rows = []
    for turn in turns:
        lease = leases.get(turn.session_id)
        owner = lease.owner if lease is not None else turn.owner
        rows.append({"turn": turn, "lease": lease, "process": process_of(owner),
                     "process_alive": process_of(owner) in alive, "first_turn": turn.session_id not in existing})
    return rows


def _alive_processes() -> set[str]:
    fresh = WorkerHeartbeat.objects.filter(last_beat__gte=WorkerHeartbeat.stale_before())
    return {f"{host}:{pid}" for host, pid in fresh.values_list("host", "pid")}


def context(request: Any, note: str = "", refused: bool = False) -> dict[str, Any]:
    """The page's context (also its live-updated partial's)."""
    user = request.user
    now = time.time()
    turns = _page(request, "turns", long_turns())
    expired = _page(request, "leases", SessionLease.objects.filter(expires_at__lt=now).order_by("expires_at"))
    waiters = _page(request, "waiters", SessionWaiter.objects.order_by("ticket"))
    failed = _page(request, "failed", InboundDelivery.objects.filter(status=Status.FAILED).order_by("-id"))
    replies = _page(request, "replies", ledger.with_reply_state().filter(resendable=True).order_by("-id"))
    operator_replies = _page(request, "operator_replies", OperatorReply.needing_resend().order_by("-id"))
    workers = _page(request, "workers", WorkerHeartbeat.objects.all())
    return {
        "queue": taskqueue.depth(), "turns": turns, "turn_rows": _with_leases(turns), "expired": expired,
        "waiters": waiters, "failed": failed, "replies": replies, "operator_replies": operator_replies,
        "workers": workers, "now": now,
        "long_turn_seconds": settings.CHATFLOW_HEALTH_LONG_TURN_SECONDS,
        "stale_before": WorkerHeartbeat.stale_before(),
        "can_cancel": may(user, CANCEL),
        "can_retry": may(user, RETRY),
        "can_resend": may(user, RESEND),
        "can_resend_operator": may(user, REPLY),
        "health_note": note, "health_refused": refused,
    }
