"""Agents page: every registered agent with its instructions, tools (parameter schemas) and handoffs,
and the handoff graph as server-rendered SVG."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from agents_app.graph import layout
from chatflow_agent.core.agent import handoff_tool_name
from sessions_app import registry
from sessions_app.access import CHAT, console_required, may
from sessions_app.ids import id_problem
from sessions_app.models import SESSION_ID_MAX_LENGTH, ChatSession
from sessions_app.timeline import build_page, pretty_json
from takeover_app.access import TAKE_OVER
from takeover_app.gate import asks_for_human
from webhooks_app.arrival import arrival_of, customer_channel
from webhooks_app.models import SENDING_PROVIDERS

#: The longest message the live chat plays (characters); the page's box and the consumer hold to it.
MAX_MESSAGE = 4000
AGENT_LIST = "agents_app/agent_list.html"


def _instructions(agent) -> str:
    try:
        return agent.get_instructions()
    except Exception as err:  # noqa: BLE001 - a dynamic instruction callable may fail; show why
        return f"(instructions could not be computed: {type(err).__name__})"


def _takeover_settings(user: Any) -> dict[str, Any]:
    """The takeover settings the agents page shows, and whether ``user`` may use the escalation tester."""
    return {"phrases": settings.CHATFLOW_HUMAN_PHRASES, "holding": settings.CHATFLOW_HOLDING_MESSAGE,
            "after_failed": settings.CHATFLOW_HUMAN_AFTER_FAILED_TURNS,
            "idle_minutes": settings.CHATFLOW_TAKEOVER_IDLE_MINUTES, "can_test": may(user, TAKE_OVER)}


def _agents_ctx(request: HttpRequest) -> dict[str, Any]:
    agents = list(registry.agents().values())
    return {
        "agents": [
            {
                "name": a.name,
                "model": a.model,
                "starting": i == 0,
                "instructions": _instructions(a),
                "tools": [{"name": t.name, "description": t.description, "schema": pretty_json(t.json_schema)}
                          for t in a.tools],
                "handoffs": [{"name": h.name, "tool": handoff_tool_name(h.name)} for h in a.handoffs],
            }
            for i, a in enumerate(agents)
        ],
        "graph": layout(agents),
        "takeover": _takeover_settings(request.user),
    }


@require_GET
@console_required()
def agent_list(request: HttpRequest) -> HttpResponse:
    return render(request, AGENT_LIST, _agents_ctx(request))


@require_GET
@console_required(TAKE_OVER)
def escalation_check(request: HttpRequest) -> HttpResponse:
    """"Would this escalate?": whether a customer's ``text`` would make a bot session wait for a person
    (``takeover_app.gate.asks_for_human`` with the site's ``CHATFLOW_HUMAN_PHRASES``) and which phrase matched.
    htmx: the ``escalation-result`` partial; otherwise the agents page with it. 400 for no text or a text
    longer than a chat message (:data:`MAX_MESSAGE`)."""
    text = request.GET.get("text", "")
    check: dict[str, Any] = {"text": text}
    status = 200
    if not text.strip():
        check["error"], status = "Type a customer's message to check.", 400
    elif len(text) > MAX_MESSAGE:
        check["error"], status = f"At most {MAX_MESSAGE:,} characters (a chat message's limit).", 400
    else:
        check["phrase"] = asks_for_human(text)
    if getattr(request, "htmx", False):
        return render(request, f"{AGENT_LIST}#escalation-result", {"check": check}, status=status)
    return render(request, AGENT_LIST, {**_agents_ctx(request), "check": check}, status=status)


def chat_refusal(session_id: str, metadata: Any) -> str:
    """Why the live chat (and ``chatflow_chat``) may not play a turn on ``session_id`` with ``metadata`` (its
    stored metadata, or the metadata a new session would get); ``""`` when it may. Reads the database only
    for a session a webhook delivered to (``webhooks_app.arrival``).

    Refused: an id the store cannot hold as typed (``sessions_app.ids.id_problem``), and a customer's session
    (``webhooks_app.arrival.customer_channel``): a turn played here would store the operator's text as the
    customer's own message, and the gate would act on it as theirs (a phrase asking for a person puts the
    customer's session into waiting)."""
    if len(session_id) > SESSION_ID_MAX_LENGTH:
        return (f"Session ids have at most {SESSION_ID_MAX_LENGTH} characters; this one has {len(session_id)}.")
    if problem := id_problem(session_id):
        return f"This session id {problem}."
    channel = customer_channel(arrival_of(session_id, metadata), metadata)
    if channel in SENDING_PROVIDERS:
        return (f"Read only: this is a {channel} customer's session. A message sent here would be stored as the "
                f"customer's own and the answer would never reach {channel}, so it is not played. "
                "To answer the customer, take the session over on its console page (Human takeover): your "
                "replies then go out on their channel.")
    if channel:
        return (f"Read only: a customer writes to this session through the {channel} webhook. A message sent here "
                "would be stored as the customer's own, so it is not played. To answer the "
                "customer, take the session over on its console page (Human takeover); to try the agents, "
                "start a new session here.")
    return ""


#: Turns of an existing session the chat page shows when it opens (older ones: the console).
HISTORY_TURNS = 20


def _history(session_id: str) -> dict[str, Any]:
    """The newest ``HISTORY_TURNS`` turns of ``session_id``, oldest first: ``{"turns", "turn_count", "older"}``."""
    page = build_page(session_id, page=1, newest_first=True, per_page=HISTORY_TURNS)
    turns = list(page.turns)  # a page's turns are in reading order
    return {"turns": turns, "turn_count": page.turn_count, "older": page.turn_count - len(turns)}


def _chat_ctx(request: HttpRequest, session_id: str) -> tuple[dict[str, Any], bool]:
    """The chat page's context for ``session_id`` and whether the id is one the store can hold as typed."""
    valid = not id_problem(session_id)
    existing = ChatSession.objects.filter(pk=session_id).first() if valid else None
    names = list(registry.agents())
    metadata = existing.metadata if existing else {"channel": request.GET.get("channel", "web")[:100]}
    refusal = chat_refusal(session_id, metadata)
    ctx = {
        "agent_names": names,
        "session_id": session_id,
        "existing": existing is not None,
        "agent": existing.active_agent_name if existing else request.GET.get("agent", names[0] if names else ""),
        "channel": metadata.get("channel", "") if isinstance(metadata, dict) else "",
        "max_session_id": SESSION_ID_MAX_LENGTH,
        "max_message": MAX_MESSAGE,
        "refusal": refusal,
        # An existing customer's session: the refusal points to its takeover panel.
        "takeover_url": reverse("sessions-show-session", args=[session_id]) + "#takeover-panel"
        if existing and refusal else "",
        "history": _history(session_id) if existing else None,
    }
    return ctx, valid


@require_GET
@console_required(CHAT)
def chat_page(request: HttpRequest) -> HttpResponse:
    """Live chat test page: a new or existing session (``?session=``; its newest turns shown), chat over
    ``ws/chat/``; ``?agent=`` and ``?channel=`` preset a new session's starting agent and channel.

    A session id the store cannot hold as typed (white space at either end included: ids are never
    cleaned) is refused (400, with the reason on the page); a customer's session (:func:`chat_refusal`) is
    shown read only. No id (or a blank one) starts a new session with a generated ``web-…`` id."""
    from secrets import token_hex

    typed = request.GET.get("session", "")
    session_id = typed if typed.strip() else f"web-{token_hex(4)}"
    ctx, valid = _chat_ctx(request, session_id)
    return render(request, "agents_app/chat.html", ctx, status=200 if valid else 400)


@require_POST
@console_required(CHAT)
def chat_without_script(request: HttpRequest) -> HttpResponse:
    """Where the chat form posts when no script took it over (JavaScript off or blocked): nothing is
    played — turns run over the page's websocket — so the page says so (400, logged once by Django's
    request logger) and keeps the text."""
    session_id = str(request.POST.get("session_id", "")).strip()[:SESSION_ID_MAX_LENGTH] or "web"
    ctx, _valid = _chat_ctx(request, session_id)
    ctx.update(not_sent=True, message=str(request.POST.get("message", ""))[:MAX_MESSAGE])
    return render(request, "agents_app/chat.html", ctx, status=400)
