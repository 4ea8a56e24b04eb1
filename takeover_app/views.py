"""Takeover's operator actions: take over, hand back, reply, resend a reply, cancel a running turn, mark an
escalation not needed.

POST only, CSRF-protected, ``console_required`` with the takeover permissions (Viewers get 403). An htmx
request gets the session's takeover panel (``takeover_app/panel.html#takeover-panel``) or, refused, the
error fragment with the action's status (400 with the message; 409 naming who owns the session); a plain
POST is redirected back to the session page (a refusal renders the panel page with its status).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh, reswap, retarget

from sessions_app.access import console_required
from sessions_app.actions import ActionError, InvalidAction
from takeover_app import escalations, held, service
from takeover_app.access import REPLY, TAKE_OVER
from takeover_app.models import OperatorReply

PANEL = "takeover_app/panel.html"
MAX_REPLY = 32 * 1024  # characters: far more than any channel takes in one message; split as bot replies are


def panel_ctx(session_id: str, **extra: Any) -> dict[str, Any]:
    """What the takeover panel shows: the mode row, the operator replies (newest last), the channel (the
    webhook the session's messages arrive through, '' for none)."""
    arrived = service.arrival(session_id)
    return {"session_id": session_id, "mode": service.mode_of(session_id),
            "channel": arrived.provider if arrived is not None else "",
            "replies": list(OperatorReply.objects.filter(session_id=session_id).order_by("-id")[:20])[::-1],
            **extra}


def _done(request: HttpRequest, session_id: str, note: str) -> HttpResponse:
    if getattr(request, "htmx", False):
        response = render(request, f"{PANEL}#takeover-panel", panel_ctx(session_id, note=note))
        return reswap(retarget(response, "#takeover-panel"), "outerHTML")
    messages.success(request, note)
    return redirect(reverse("sessions-show-session", args=[session_id]))


def _refused(request: HttpRequest, session_id: str, err: ActionError) -> HttpResponse:
    # Answered with err.status (a 4xx): django.request logs it in one line.
    ctx = {"error": str(err), "owner": getattr(err, "owner", "")}
    if getattr(request, "htmx", False):
        response = render(request, f"{PANEL}#takeover-error", ctx, status=err.status)
        return reswap(retarget(response, "#takeover-error"), "innerHTML")
    return render(request, PANEL, {**panel_ctx(session_id), **ctx}, status=err.status)


def _gone(request: HttpRequest, session_id: str) -> HttpResponse:
    return _refused(request, session_id, _NotFound(f"Session {session_id!r} does not exist (any more)."))


class _NotFound(ActionError):
    status = 404


def _text(request: HttpRequest, name: str, limit: int) -> str:
    value = request.POST.get(name, "")
    if len(value) > limit:
        raise InvalidAction(f"The {name} is too long: at most {limit:,} characters.")
    return value


@require_POST
@console_required(TAKE_OVER)
def take_over(request: HttpRequest, session_id: str) -> HttpResponse:
    try:
        service.take_over(request.user, session_id, when=request.POST.get("when") or "after_turn")
    except ActionError as err:
        return _refused(request, session_id, err)
    except Http404:
        return _gone(request, session_id)
    return _done(request, session_id, "You have taken this session over: the bot no longer answers it.")


@require_POST
@console_required(TAKE_OVER)
def hand_back(request: HttpRequest, session_id: str) -> HttpResponse:
    try:
        done = held.hand_back(request.user, session_id, agent_name=request.POST.get("agent") or None,
                              note=_text(request, "note", 8000), held=request.POST.get("held") or None)
    except ActionError as err:
        return _refused(request, session_id, err)
    except Http404:
        return _gone(request, session_id)
    if done.replaced and getattr(request, "htmx", False):
        # The held rows on the page were replaced by the bot's turn: the page is read again, not patched.
        messages.success(request, _handed_back(done))
        return HttpResponseClientRefresh()
    return _done(request, session_id, _handed_back(done))


def _handed_back(done: held.HandBack) -> str:
    said = f"Handed back to the bot{' with a note' if done.row.pending_note else ''}."
    if done.error:
        return f"{said} The bot's answer to the held messages failed ({done.error}); the list flags them."
    if done.reply is not None:
        return f"{said} The bot answered the held messages: reply {done.reply.shown_status_text}."
    if done.held and done.row.held_unanswered:
        return f"{said} {len(done.held)} held message{'s' if len(done.held) != 1 else ''} left unanswered."
    return said


@require_POST
@console_required(REPLY)
def reply(request: HttpRequest, session_id: str) -> HttpResponse:
    try:
        sent = service.send_reply(request.user, session_id, _text(request, "text", MAX_REPLY))
    except ActionError as err:
        return _refused(request, session_id, err)
    except Http404:
        return _gone(request, session_id)
    return _done(request, session_id, f"Reply {sent.shown_status_text}" + (f": {sent.error}" if sent.error else "."))


@require_POST
@console_required(REPLY)
def resend(request: HttpRequest, reply_id: int) -> HttpResponse:
    found = None
    if reply_id < 2**63:  # a bigger id is no row (and no query: PostgreSQL's bigint ends there)
        found = OperatorReply.objects.filter(pk=reply_id).values_list("session_id", flat=True).first()
    if found is None:
        if getattr(request, "htmx", False):
            return _refused(request, "", _NotFound("No such reply."))
        raise Http404("No such reply.")  # the site's 404 page (handler404, or SiteNotFoundPage with DEBUG on)
    try:
        sent = service.resend(request.user, reply_id)
    except ActionError as err:
        return _refused(request, found, err)
    except Http404:
        return _gone(request, found)
    return _done(request, found, f"Reply {sent.shown_status_text}" + (f": {sent.error}" if sent.error else "."))


@require_POST
@console_required(TAKE_OVER)
def cancel_turn(request: HttpRequest, session_id: str) -> HttpResponse:
    try:
        stopped = service.cancel_turn(request.user, session_id, _text(request, "reason", 2000)
                                      or "Cancelled by an operator.")
    except ActionError as err:
        return _refused(request, session_id, err)
    return _done(request, session_id, "The running turn was stopped and rolled back." if stopped
                 else "No turn was running on this session.")


@require_POST
@console_required(TAKE_OVER)
def mark_not_needed(request: HttpRequest, session_id: str) -> HttpResponse:
    """The session's latest escalation was not needed (``takeover_app.escalations.mark_not_needed``)."""
    try:
        escalations.mark_not_needed(request.user, session_id, _text(request, "reason", 2000))
    except ActionError as err:
        return _refused(request, session_id, err)
    except Http404:
        return _gone(request, session_id)
    return _done(request, session_id, "Marked not needed: the dashboard counts it against its trigger.")
