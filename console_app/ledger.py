"""The console's pages of the dedup ledger: a session's deliveries, those that need attention, and the operator's
Retry and Resend (the rules are ``webhooks_app.ledger``'s)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from console_app.views import session_gone
from sessions_app.access import console_required
from sessions_app.models import ChatSession
from webhooks_app import inbox, ledger
from webhooks_app.access import RESEND, RETRY
from webhooks_app.models import InboundDelivery

LEDGER = "webhooks_app/ledger.html"
ATTENTION = "webhooks_app/attention.html"


@require_GET
@console_required()
def session_ledger(request: HttpRequest, session_id: str) -> HttpResponse:
    """The session's deliveries (the ledger partial; the whole page is the session detail). A session that does
    not exist (deleted, or not created yet by its first turn) is a 404 with the message, as its page is."""
    if not ChatSession.objects.filter(pk=session_id).exists():
        return session_gone(request, session_id)
    ctx = ledger.context(request.user, session_id)
    return render(request, f"{LEDGER}#ledger", ctx)


@require_POST
@console_required(RETRY)
def retry_delivery(request: HttpRequest, delivery_id: int) -> HttpResponse:
    """Queue a failed delivery again (audited). htmx gets the ledger; others are redirected."""
    delivery = get_object_or_404(InboundDelivery, pk=delivery_id)
    status, note = 200, ""
    try:
        ledger.retry(request.user, delivery)
        note = f"Delivery {delivery.provider_message_id} queued again."
    except inbox.RetryRefused as err:
        status, note = 409, str(err)
    if getattr(request, "htmx", False):
        ctx = ledger.context(request.user, delivery.session_id, note=note, refused=status == 409)
        return render(request, f"{LEDGER}#ledger", ctx, status=status)
    if status == 409:
        return JsonResponse({"error": "retry_refused", "detail": note}, status=409)
    nxt = request.POST.get("next", "")
    if nxt and url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
        return redirect(nxt)
    return redirect("sessions-show-session", delivery.session_id)



@require_GET
@console_required()
def attention_list(request: HttpRequest) -> HttpResponse:
    """Every session's deliveries whose reply is unknown or failed, newest first, with Resend."""
    return render(request, ATTENTION, ledger.attention_context(request.user))


@require_POST
@console_required(RESEND)
def resend_reply(request: HttpRequest, delivery_id: int) -> HttpResponse:
    """Send a delivery's stored answer again (audited; one send per click, a concurrent click gets 409).

    htmx gets the session's ledger; others are redirected to ``next`` (or the session) with a message.
    """
    delivery = get_object_or_404(InboundDelivery, pk=delivery_id)
    status, failed = 200, False
    try:
        sent = ledger.resend(request.user, delivery)
        failed = sent.reply_status != InboundDelivery.Reply.SENT
        note = (f"Resending the reply to {delivery.provider_message_id} failed: {sent.reply_error}" if failed
                else f"The reply to {delivery.provider_message_id} was sent again.")
    except ledger.ResendRefused as err:
        status, note = 409, str(err)
    if getattr(request, "htmx", False):
        ctx = ledger.context(request.user, delivery.session_id, note=note, refused=status == 409 or failed)
        return render(request, f"{LEDGER}#ledger", ctx, status=status)
    if status == 409:
        return JsonResponse({"error": "resend_refused", "detail": note}, status=409)
    (messages.error if failed else messages.success)(request, note)
    nxt = request.POST.get("next", "")
    if nxt and url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()}):
        return redirect(nxt)
    return redirect("sessions-show-session", delivery.session_id)
