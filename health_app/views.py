"""The health page and its operator actions, the dashboard, and ``/metrics``.

Actions (POST, CSRF, audited by the functions they call, which run in one transaction with their audit
entry): bulk Retry of failed deliveries and bulk Resend of replies (``webhooks_app.ledger``), bulk Resend
of operator replies (``takeover_app.service.resend``, as on the session page), Cancel a running turn and
Release a stale lease (``takeover_app.service.cancel_turn``, audited, over the site store's ``cancel_turn``:
the one place that takes a session's lease away). htmx gets the page's ``health`` partial with a note; a
plain POST is redirected to the page with a message. The page polls its partial, so every open health page
shows the change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from health_app import dashboard, report
from health_app.access import CANCEL
from sessions_app.access import console_required
from sessions_app.actions import ActionError
from takeover_app import service
from takeover_app.access import REPLY
from takeover_app.models import OperatorReply
from webhooks_app import inbox, ledger
from webhooks_app.access import RESEND, RETRY
from webhooks_app.models import InboundDelivery

logger = logging.getLogger("health_app.views")

PAGE = "health_app/health.html"
DASHBOARD = "health_app/dashboard.html"
MAX_BULK = report.PAGE_SIZE


@require_GET
@console_required()
def health_page(request: HttpRequest) -> HttpResponse:
    """Queue, long-running turns, leases and waiters, failures, workers; htmx polls get the partial."""
    ctx = report.context(request)
    return render(request, f"{PAGE}#health" if getattr(request, "htmx", False) else PAGE, ctx)


@require_GET
@console_required()
def dashboard_page(request: HttpRequest) -> HttpResponse:
    """Charts of the turns, latency, failures, cost, handoffs and queue over ``?range=`` (24h, 7d, 30d);
    an unknown range answers 400 with the reason on the page (``django.request`` logs it in one line).
    htmx requests get the ``dashboard`` partial, or the ``range-error`` one with the 400."""
    ctx: dict[str, Any] = {"ranges": [(name, label) for name, (label, _, _) in dashboard.RANGES.items()]}
    try:
        ctx["range"] = dashboard.parse_range(request.GET.get("range"))
    except dashboard.RangeError as err:
        ctx.update(range="", range_error=str(err))
        page = f"{DASHBOARD}#range-error" if getattr(request, "htmx", False) else DASHBOARD
        return render(request, page, ctx, status=400)
    ctx["board"] = dashboard.build(ctx["range"])
    return render(request, f"{DASHBOARD}#dashboard" if getattr(request, "htmx", False) else DASHBOARD, ctx)


def _done(request: HttpRequest, note: str, refused: bool, status: int = 200) -> HttpResponse:
    htmx = getattr(request, "htmx", False)
    if refused and not (htmx and status >= 400):
        # A 4xx answer is logged by django.request in one line; a redirect or a 200 that refused some
        # rows would be logged nowhere.
        logger.info("Health action refused for %s: %s", request.user, note)
    if htmx:
        return render(request, f"{PAGE}#health", report.context(request, note, refused), status=status)
    (messages.error if refused else messages.success)(request, note)
    return redirect("health-show-health")


def _selected(request: HttpRequest, field: str = "delivery") -> list[int] | None:
    """The ids posted as ``field`` (at most MAX_BULK), or None when one is not a number (or is past bigint)."""
    raw = request.POST.getlist(field)
    if not all(v.isascii() and v.isdigit() and int(v) < 2**63 for v in raw):
        return None
    return sorted({int(v) for v in raw})[:MAX_BULK]


@require_POST
@console_required(RETRY)
def retry_deliveries(request: HttpRequest) -> HttpResponse:
    """Queue the selected failed deliveries again (one audited retry each; refusals are named)."""
    ids = _selected(request)
    if not ids:
        return _done(request, "Select at least one failed delivery.", True, 400)
    done, refused = 0, []
    for delivery in InboundDelivery.objects.filter(pk__in=ids):
        try:
            ledger.retry(request.user, delivery)
            done += 1
        except inbox.RetryRefused as err:
            refused.append(f"{delivery.provider_message_id}: {err}")
    note = f"{done} deliver{'y' if done == 1 else 'ies'} queued again." + "".join(f" {r}" for r in refused)
    return _done(request, note, bool(refused), 409 if refused and not done else 200)


#: Seconds a bulk resend keeps starting sends (each is bounded on its own); the rest are named, not tried,
#: so a slow provider cannot hold the request past a proxy's timeout.
BULK_SEND_SECONDS = 20.0


def _send_each(sends: Iterable[tuple[str, Callable[[], str | None]]]) -> tuple[int, list[str]]:
    """Call each ``(label, send)`` in turn — ``send()`` is None when the reply went out, else the problem —
    until ``BULK_SEND_SECONDS`` have passed. Returns (how many were sent, one note per reply not sent)."""
    sent, problems = 0, []
    deadline = time.monotonic() + BULK_SEND_SECONDS
    for label, send in sends:
        if time.monotonic() >= deadline:
            problems.append(f"{label}: not tried (the batch ran out of time); resend it again.")
            continue
        problem = send()
        if problem is None:
            sent += 1
        else:
            problems.append(f"{label}: {problem}")
    return sent, problems


@require_POST
@console_required(RESEND)
def resend_replies(request: HttpRequest) -> HttpResponse:
    """Send the selected replies again (one audited resend each, at most one send per delivery)."""
    ids = _selected(request)
    if not ids:
        return _done(request, "Select at least one reply to resend.", True, 400)

    def resend(delivery: InboundDelivery) -> str | None:
        try:
            result = ledger.resend(request.user, delivery)
        except ledger.ResendRefused as err:
            return str(err)
        return None if result.reply_status == InboundDelivery.Reply.SENT else f"the send failed: {result.reply_error}"

    sent, problems = _send_each((d.provider_message_id, partial(resend, d))
                                for d in InboundDelivery.objects.filter(pk__in=ids))
    note = f"{sent} repl{'y' if sent == 1 else 'ies'} sent again." + "".join(f" {p}" for p in problems)
    return _done(request, note, bool(problems), 409 if problems and not sent else 200)


@require_POST
@console_required(REPLY)
def resend_operator_replies(request: HttpRequest) -> HttpResponse:
    """Send the selected failed or unknown operator replies again, each through the session page's audited
    ``takeover_app.service.resend`` (the sender must own the session; refusals are named)."""
    ids = _selected(request, "reply")
    if not ids:
        return _done(request, "Select at least one operator reply to resend.", True, 400)
    found = dict(OperatorReply.objects.filter(pk__in=ids).values_list("pk", "session_id"))

    def resend(reply_id: int) -> str | None:
        try:
            reply = service.resend(request.user, reply_id)
        except ActionError as err:
            return str(err)
        except Http404:
            return "the session no longer exists."
        return None if reply.status == OperatorReply.Status.SENT else f"the send failed: {reply.error}"

    sent, problems = _send_each((f"Reply {i} on {sid}", partial(resend, i)) for i, sid in found.items())
    problems = [f"Reply {i}: no such reply." for i in ids if i not in found] + problems
    note = f"{sent} operator repl{'y' if sent == 1 else 'ies'} sent again." + "".join(f" {p}" for p in problems)
    return _done(request, note, bool(problems), 409 if problems and not sent else 200)


def _cancel_turn(user: Any, session_id: str, reason: str, only_expired: bool, owner: str) -> bool:
    # audited, over the store's cancel_turn: the one place that takes a session's lease away
    return service.cancel_turn(user, session_id, reason, only_expired=only_expired, owner=owner)


def _take_lease(request: HttpRequest, session_id: str, reason: str, done: str, nothing: str,
                only_expired: bool = False) -> HttpResponse:
    owner = str(request.POST.get("owner", ""))[:200]  # the turn the page showed; "" any
    try:
        taken = _cancel_turn(request.user, session_id, reason, only_expired, owner)
    except ActionError as err:
        return _done(request, str(err), True, err.status)
    except Http404:
        return _done(request, f"No session {session_id!r}.", True, 404)
    return _done(request, done if taken else nothing, not taken, 200 if taken else 409)


@require_POST
@console_required(CANCEL)
def cancel_turn(request: HttpRequest, session_id: str) -> HttpResponse:
    """Cancel the turn running on the session: it is rolled back (history as before), audited."""
    return _take_lease(request, session_id, "Cancelled from the health page",
                       f"The turn running on {session_id} was cancelled and rolled back.",
                       f"The turn shown on {session_id} is not running any more (one that began since is not "
                       "cancelled: it shows here if it runs long).")


@require_POST
@console_required(CANCEL)
def release_lease(request: HttpRequest, session_id: str) -> HttpResponse:
    """Release the session's expired lease (its holder stopped renewing it), audited."""
    return _take_lease(request, session_id, "Stale lease released from the health page",
                       f"The lease on {session_id} was released.",
                       f"{session_id} holds no expired lease (any more): a live turn is cancelled with Cancel turn.",
                       only_expired=True)
