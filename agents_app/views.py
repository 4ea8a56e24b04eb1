"""Agents page: every registered agent with its instructions, tools (parameter schemas) and handoffs,
and the handoff graph as server-rendered SVG."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents_app import registry
from agents_app.graph import layout
from chatflow_agent.core.agent import handoff_tool_name
from sessions_app.access import console_required
from sessions_app.ids import id_problem
from sessions_app.models import SESSION_ID_MAX_LENGTH, ChatSession
from sessions_app.timeline import pretty_json


def _instructions(agent) -> str:
    try:
        return agent.get_instructions()
    except Exception as err:  # noqa: BLE001 - a dynamic instruction callable may fail; show why
        return f"(instructions could not be computed: {type(err).__name__})"


@require_GET
@console_required()
def agent_list(request: HttpRequest) -> HttpResponse:
    agents = list(registry.agents().values())
    ctx = {
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
    }
    return render(request, "agents_app/agent_list.html", ctx)


#: Playing turns from the live chat page writes sessions: operators, not read-only viewers.
CHAT = "sessions_app.add_chatmessage"

#: Channels whose sessions are real customers' conversations: the live chat page would store the
#: operator's text as the customer's message and its answer would never reach the customer.
CUSTOMER_CHANNELS = frozenset({"whatsapp", "telegram"})


def chat_refusal(session_id: str, metadata: Any) -> str:
    """Why the live chat may not play a turn on ``session_id`` with ``metadata`` (its stored metadata, or
    the metadata a new session would get); ``""`` when it may."""
    if len(session_id) > SESSION_ID_MAX_LENGTH:
        return (f"Session ids have at most {SESSION_ID_MAX_LENGTH} characters; this one has {len(session_id)}.")
    if problem := id_problem(session_id):
        return f"This session id {problem}."
    channel = str(metadata.get("channel") or "").lower() if isinstance(metadata, dict) else ""
    if channel in CUSTOMER_CHANNELS:
        return (f"Read only: this is a {channel} customer's session. A message sent here would be stored as the "
                f"customer's own and the answer would never reach {channel}, so the live chat does not send on it.")
    return ""


@require_GET
@console_required(CHAT)
def chat_page(request: HttpRequest) -> HttpResponse:
    """Live chat test page: pick a starting agent and a new or existing session, chat over ``ws/chat/``.

    A session id longer than ``SESSION_ID_MAX_LENGTH`` is refused (400, with the reason on the page);
    a session of a customer channel (:data:`CUSTOMER_CHANNELS`) is shown read only."""
    from secrets import token_hex

    session_id = request.GET.get("session", "").strip() or f"web-{token_hex(4)}"
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
        "refusal": refusal,
    }
    return render(request, "agents_app/chat.html", ctx,
                  status=200 if valid else 400)
