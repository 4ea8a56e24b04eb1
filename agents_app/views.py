"""Agents page: every registered agent with its instructions, tools (parameter schemas) and handoffs,
and the handoff graph as server-rendered SVG."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents_app import registry
from agents_app.graph import layout
from chatflow_agent.core.agent import handoff_tool_name
from chatflow_agent.jsonsafe import clean_text
from sessions_app.access import console_required
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


@require_GET
@console_required(CHAT)
def chat_page(request: HttpRequest) -> HttpResponse:
    """Live chat test page: pick a starting agent and a new or existing session, chat over ``ws/chat/``."""
    from secrets import token_hex

    from sessions_app.models import ChatSession

    session_id = clean_text(request.GET.get("session", "")).strip()[:200] or f"web-{token_hex(4)}"  # no NUL
    existing = ChatSession.objects.filter(pk=session_id).first()
    names = list(registry.agents())
    ctx = {
        "agent_names": names,
        "session_id": session_id,
        "existing": existing is not None,
        "agent": existing.active_agent_name if existing else request.GET.get("agent", names[0] if names else ""),
        "channel": (existing.metadata or {}).get("channel", "") if existing and isinstance(existing.metadata, dict)
        else request.GET.get("channel", "web")[:100],
    }
    return render(request, "agents_app/chat.html", ctx)
