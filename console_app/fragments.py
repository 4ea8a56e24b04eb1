"""htmx out-of-band fragments for the live consumers, rendered from the console's own template partials.

Every function returns HTML whose top-level elements carry ``hx-swap-oob`` (htmx's websocket
extension swaps each one; an element without the attribute replaces the element with its id).
Run events arrive as :func:`sessions_app.live.encode_event` dicts. Functions named ``*_from_db``
read the database and must run through ``database_sync_to_async``; the others touch no database
and run on the event loop. Every string a user or a model wrote goes through the templates'
autoescaping (invariant 9).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.html import format_html

from chatflow_agent.core.memory import turn_number
from chatflow_agent.types import Message, Role, ToolCall, ToolResult
from console_app import export, listing
from console_app.listing import waiting_count
from console_app.templatetags.console_nav import waiting_badge
from console_app.views import counted_session, detail_ctx, pager_ctx
from sessions_app import registry
from sessions_app.access import FORCE_HANDOFF, ROLLBACK, may
from sessions_app.live import dom_id
from sessions_app.models import ChatMessage, ChatSession, OperatorAction, SessionLease
from sessions_app.runtime import site_store
from sessions_app.timeline import (
    Item,
    Turn,
    handoff_of,
    label_items,
    page_count,
    parse_rows,
    row_turns,
    turn_bounds,
    turn_items,
)
from takeover_app import page as takeover_page
from takeover_app.models import OperatorReply
from turns_app.usage import attach_records

DETAIL = "sessions_app/session_detail.html"
LIST = "sessions_app/session_list.html"

__all__ = ["DetailView", "list_row_from_db", "list_removed", "render_event"]


def call_dom_id(prefix: str, call_id: str) -> str:
    """The HTML id of a live tool call (model-chosen ids are any string, so hashed)."""
    return f"{prefix}-call-" + hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def _items(items: list[Item]) -> str:
    return "".join(render_to_string(f"{DETAIL}#item", {"item": item}) for item in items)


def _oob(swap: str, inner: str) -> str:
    return f'<div hx-swap-oob="{swap}">{inner}</div>'


def status(text: str, level: str = "muted") -> str:
    return format_html('<p id="live-status" class="live-status {}" role="status">{}</p>', level, text)


# ---- a running turn (no database) -------------------------------------------------------------
@dataclass
class DetailView:
    """What one detail page shows: its user, order and page, and the last committed message id it has."""

    user: Any
    session_id: str
    cursor: int = 0
    newest_first: bool = True
    tail: bool = True
    page: int = 1
    csrf_token: str = ""
    prefix: str = "live"  # ids of the running turn's regions: <prefix>-items, -stream, -agent
    show_user: bool = True  # the chat page shows the user's message as soon as it is sent

    def __post_init__(self) -> None:
        self.calls: dict[str, ToolCall] = {}
        self.turn_id = ""


def live_turn(event: dict[str, Any], state: str) -> str:
    return render_to_string(f"{DETAIL}#live-turn", {"live": {"state": state, **event}})


def render_event(view: DetailView, event: dict[str, Any]) -> str:
    """Fragments for one run event of a turn in progress (``turn_completed`` is :meth:`committed_from_db`)."""
    kind = event["kind"]
    if kind == "turn_started":
        view.calls.clear()
        view.turn_id = event["turn_id"]
        return live_turn(event, "running")
    if kind != "turn_failed" and view.turn_id != event["turn_id"]:
        # Joined mid-turn (or reconnected): open the running turn before its first fragment.
        view.turn_id = event["turn_id"]
        agent = event.get("agent_name") or event.get("to_agent") or ""
        return live_turn({**event, "agent_name": agent}, "running") + render_event(view, event)
    if kind == "message_appended":
        return _appended(view, Message.model_validate(event["message"]))
    if kind == "tool_call_started":
        call = ToolCall.model_validate(event["call"])
        view.calls[call.id] = call
        return _items([Item("call", call=call, running=True, dom=call_dom_id(view.prefix, call.id))])
    if kind == "tool_call_finished":
        result = ToolResult.model_validate(event["result"])
        call = view.calls.get(result.tool_call_id) or ToolCall(id=result.tool_call_id, name=result.name)
        return _items([Item("call", call=call, result=result, handoff=handoff_of(result),
                            dom=call_dom_id(view.prefix, call.id))])
    if kind == "handoff":
        return format_html('<strong id="{}-agent" hx-swap-oob="true">{}</strong>', view.prefix, event["to_agent"])
    if kind == "text_delta":
        return format_html('<div hx-swap-oob="beforeend:#{}-stream"><span>{}</span></div>', view.prefix, event["text"])
    if kind == "turn_failed":
        view.calls.clear()
        return live_turn(event, "failed")
    return ""


def _appended(view: DetailView, message: Message) -> str:
    if message.role == Role.TOOL or (message.role == Role.USER and not view.show_user):
        return ""  # its results were shown as each tool call finished
    items = turn_items([(0, message, message.content or "")])
    for item in items:
        item.row_id = None
        if item.kind == "call" and item.call is not None:
            view.calls[item.call.id] = item.call
            item.running, item.dom = True, call_dom_id(view.prefix, item.call.id)
    html = _oob(f"beforeend:#{view.prefix}-items", _items(items))
    if message.role == Role.MODEL:
        html += f'<div id="{view.prefix}-stream" class="msg model streaming" hx-swap-oob="true"></div>'
    return html


# ---- committed messages (database) ------------------------------------------------------------
class _S:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id


def committed_from_db(view: DetailView, clear_live: bool = True) -> tuple[str, list[int]]:
    """Fragments for the session's messages with id > ``view.cursor`` (advanced); returns (html, ids sent)."""
    rows = list(ChatMessage.objects.filter(session_id=view.session_id, id__gt=view.cursor).order_by("id")
                .values_list("id", "role", "content", "message_json", "created_at"))
    html = '<div id="live-turn" class="live-turn" aria-live="polite" hx-swap-oob="true"></div>' if clear_live else ""
    if not rows:
        return html, []
    ids = [r[0] for r in rows]
    bounds = turn_bounds(view.session_id)
    had = turn_number([rid for rid, _at in bounds], view.cursor)  # turns the page has
    view.cursor = ids[-1]
    # The new rows continue turn ``had`` until the next USER row starts turn had + 1.
    chunks = list(row_turns(rows, first=had + 1))
    if view.tail:
        ctx = {"s": _S(view.session_id), "history": {"turn_count": len(bounds)},
               "can_rollback": may(view.user, ROLLBACK),
               "window_start": len(bounds) - site_store().default_max_turns}
        turns = [Turn(n, turn_items(parse_rows([r[:4] for r in chunk])), bounds[n - 1][1] if n else None, len(chunk),
                      message_ids=[row[0] for row in chunk])
                 for n, chunk in chunks]
        attach_records(view.session_id, turns, bounds)
        agents = _turn_agents(view.session_id)
        times = {row[0]: row[4] for row in rows}
        for t in turns:
            t.agents = agents[t.number - 1] if 1 <= t.number <= len(agents) else []
            label_items(t.items, t.agents, times)
        _with_takeover(view, ctx, [i for t in turns for i in t.items])
        body = "".join(render_to_string(f"{DETAIL}#turn", {**ctx, "turn": t}) for t in turns)
        html += _oob("beforeend:#turns", body)
        if not had:  # the page says "No turns." (htmx reports an out-of-band swap with no target)
            html += '<p id="no-turns" hx-swap-oob="delete"></p>'
        html += _previous_turn_actions(ctx, had, chunks[0][0])
    else:
        html += ('<div id="live-turn" class="live-turn" hx-swap-oob="true"><p class="note" role="status">'
                 'New messages were saved; they show on the page with the newest turn.</p></div>')
    html += cursor(view) + toolbar(view, len(bounds)) + facts_from_db(view.session_id, view.user)
    html += takeover_from_db(view)
    return html, ids


def takeover_from_db(view: DetailView) -> str:
    """:func:`takeover_from_ctx` for ``view``'s session read now (its unread count after held customer
    messages, its mode); ``""`` when the session is gone."""
    session = ChatSession.objects.filter(pk=view.session_id).first()
    if session is None:
        return ""
    names = list(registry.agents())
    lease = SessionLease.objects.filter(pk=view.session_id).first()
    ctx = {"s": session, "agent_names": names, "live_oob": True,
           "takeover": takeover_page.takeover_ctx(view.user, session, lease, names)}
    return takeover_from_ctx(ctx, _request(view))


def _with_takeover(view: DetailView, ctx: dict[str, Any], items: list[Item]) -> None:
    """Operator replies attached to their messages and the ``takeover`` context (Resend for the owner)."""
    session = ChatSession.objects.filter(pk=view.session_id).first()
    if session is None:
        return
    takeover_page.attach_replies(view.session_id, items)
    ctx["takeover"] = takeover_page.takeover_ctx(view.user, session, None, [])


def _turn_agents(session_id: str) -> list[list[str]]:
    session = ChatSession.objects.filter(pk=session_id).first()
    return export.turn_agents(session) if session is not None else []


def _previous_turn_actions(ctx: dict[str, Any], had: int, first_new: int) -> str:
    """The actions of turn ``had``, the page's last turn until now: with newer turns it may be rolled back to."""
    if not ctx["can_rollback"] or not 1 <= had < first_new:
        return ""
    return render_to_string(f"{DETAIL}#turn-actions", {**ctx, "turn": {"number": had}, "actions_oob": True})


def toolbar(view: DetailView, turn_count: int) -> str:
    """The history toolbar (turn count, page, links) for ``view`` once the session has ``turn_count`` turns."""
    pages = page_count(turn_count)
    page = min(view.page, pages)
    return render_to_string(f"{DETAIL}#history-toolbar", {
        "history": {"turn_count": turn_count, "page": page, "pages": pages}, "toolbar_oob": True,
        **pager_ctx(view.session_id, page, pages, view.newest_first)})


def facts_from_db(session_id: str, user: Any = None) -> str:
    """The session header's facts (active agent, counts, updated), same partial as the page, and for a
    ``user`` who may force a handoff the handoff select (every agent but the active one)."""
    try:
        session = counted_session(session_id)
    except Exception:  # Http404: deleted meanwhile
        return ""
    ctx = {"s": session, "live_oob": True, "lease": SessionLease.objects.filter(pk=session_id).first(),
           "agent_registered": registry.get_agent(session.active_agent_name) is not None,
           "agent_names": list(registry.agents())}
    html = render_to_string(f"{DETAIL}#session-facts", ctx)
    if user is not None and may(user, FORCE_HANDOFF):
        html += render_to_string(f"{DETAIL}#handoff-select", ctx)
    return html


def cursor(view: DetailView) -> str:
    return format_html('<span id="live-cursor" hidden data-last-id="{}" data-order="{}" data-tail="{}" '
                       'data-page="{}" hx-swap-oob="true"></span>', view.cursor,
                       "newest" if view.newest_first else "oldest", int(view.tail), view.page)


def history_from_db(view: DetailView, note: str) -> str | None:
    """After another operator's handoff or rollback: the history and header facts re-rendered for
    ``view`` (same partials as the page) and a note; None if the session is gone. The actions form
    and the dialog are left alone, so what an operator is typing there survives."""
    try:
        session = counted_session(view.session_id)
    except Exception:  # Http404
        return None
    ctx = detail_ctx(view.user, session, view.newest_first, view.page, live_oob=True)
    view.cursor = ctx["last_id"]
    view.tail = ctx["live_tail"]
    request = _request(view)
    history = render_to_string(f"{DETAIL}#history", ctx, request=request)
    history = history.replace('<section id="history"', '<section hx-swap-oob="true" id="history"', 1)
    facts = render_to_string(f"{DETAIL}#session-facts", ctx, request=request)
    if ctx["can_handoff"]:
        facts += render_to_string(f"{DETAIL}#handoff-select", ctx, request=request)
    return history + facts + takeover_from_ctx(ctx, request) + status(note, "note")


def takeover_from_ctx(ctx: dict[str, Any], request: HttpRequest | None = None) -> str:
    """The session page's takeover regions for a detail context (``live_oob``): the mode badge, the
    takeover panel, the reply box (its textarea is ``hx-preserve``: a swap keeps the live one with what is
    typed in it) and the navigation's badge of waiting sessions."""
    return ("".join(render_to_string(f"{DETAIL}#{name}", ctx, request=request)
                    for name in ("mode-badge", "takeover-panel", "reply-box")) + nav_waiting_from_db())


def nav_waiting_from_db() -> str:
    """The navigation's badge of waiting sessions, for an out-of-band swap."""
    return waiting_badge(waiting_count(), oob=True)


def reply_from_db(view: DetailView, reply_id: int) -> str:
    """One operator reply's message re-rendered where the page shows it (its delivery status changed:
    sending → sent / failed); ``""`` when the reply or its message is not stored."""
    reply = OperatorReply.objects.filter(pk=reply_id, session_id=view.session_id).first()
    if reply is None or reply.message_row_id is None:
        return ""
    row = ChatMessage.objects.filter(pk=reply.message_row_id).values_list("id", "role", "content", "message_json",
                                                                          "created_at").first()
    if row is None:
        return ""
    items = [i for i in turn_items(parse_rows([row[:4]])) if i.kind == "model" and i.author]
    if not items:
        return ""
    try:
        session = counted_session(view.session_id)
    except Exception:  # Http404: deleted meanwhile
        return ""
    item = items[0]
    item.at, item.reply = row[4], reply
    ctx = {"s": session, "item": item, "reply_oob": True,
           "takeover": takeover_page.takeover_ctx(view.user, session, None, [])}
    return render_to_string(f"{DETAIL}#operator-message", ctx, request=_request(view))


def _request(view: DetailView) -> HttpRequest:
    """A stand-in request for partials that read ``request`` (its user, the page's CSRF cookie)."""
    request = HttpRequest()
    request.method = "GET"
    request.user = view.user
    if view.csrf_token:
        request.META["CSRF_COOKIE"] = view.csrf_token
    return request


def action_note(action: dict[str, Any]) -> str:
    who = action.get("actor") or "system"
    after, before = action.get("after") or {}, action.get("before") or {}
    if action["kind"] == "force_handoff":
        return f"{who} handed the session off from {before.get('active_agent')} to {after.get('active_agent')}."
    if action["kind"] == "rollback":
        return f"{who} rolled the session back to turn {after.get('turn')}."
    if action["kind"] == "resend_reply":
        return f"{who} resent the reply to webhook message {before.get('provider_message_id')}."
    if action["kind"] == "delete":
        return f"{who} deleted this session."
    # Other apps' actions (takeover: take over, hand back, operator replies, a customer asking for a person).
    return f"{who}: {OperatorAction.label_of(action['kind']).lower()}."


def deleted(action: dict[str, Any]) -> str:
    return format_html(
        '<p id="live-status" class="live-status card alert error" role="alert" data-gone="1">'
        '<strong>Deleted:</strong> {} '
        'What this page shows is no longer stored; its actions are disabled.</p>'
        '<div id="live-turn" class="live-turn" hx-swap-oob="true"></div>', action_note(action))


# ---- the session list -------------------------------------------------------------------------
def list_row_from_db(session_id: str, top: bool, running: bool | None = None,
                     query: listing.ListQuery | None = None) -> list[str]:
    """Frames that show the list row of ``session_id`` (same partial as the list view): moved to the top,
    or replaced where it is. For a list with a search or filters (``query``), a session that does not
    match them (any more) leaves it: its row is deleted.

    ``running`` is what the event said (a turn started / ended), which the row's lease may not show
    any more (or yet) when the row is read. Moving takes two frames: HTML parsing drops a ``<tbody>``
    that follows a top-level ``<tr>``, so the old row is deleted in a frame of its own. The row at the
    top comes with the emptied ``#no-sessions`` body ("No sessions match."), which every list page has,
    rows or not: an out-of-band swap without a target is an htmx error.
    """
    row = listing.one(session_id, query)
    if row is None:
        return [list_removed(session_id)] if query is not None else []
    if running is not None:
        row.running = running
    html = render_to_string(f"{LIST}#session-row", {"row": row}).strip()
    if not top:
        return [html]  # replaces the row with its id, if the page shows it
    old = html.split(">", 1)[0].replace("<tr ", '<tr hx-swap-oob="delete" ', 1) + "></tr>"
    return [old, _tbody("afterbegin:#session-rows", html) + '<tbody id="no-sessions" hx-swap-oob="innerHTML"></tbody>']


def _tbody(swap: str, rows: str) -> str:
    return f'<tbody hx-swap-oob="{swap}">{rows}</tbody>'


def list_removed(session_id: str) -> str:
    return f'<tr id="row-{dom_id(session_id)}" hx-swap-oob="delete"></tr>'

