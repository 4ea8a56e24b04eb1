"""Console views: session list, session detail, operator actions (handoff / rollback / delete), audit log.

An htmx request gets the named partial of the screen's template (``session_list.html#session-table``);
the same URL without htmx renders the whole page. Action POSTs return the updated session panel to
htmx and redirect otherwise; refusals render the action-error partial with their status (400/409).
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import quote, urlencode

from django.contrib import messages
from django.db.models import Max
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect, reselect, reswap, retarget

from chatflow_agent.jsonsafe import clean_text
from console_app import export, listing
from search_app.query import parse as parse_search
from search_app.search import find_in_session
from sessions_app import actions, registry
from sessions_app.access import CHAT, DELETE, EXPORT, FORCE_HANDOFF, ROLLBACK, console_required, may
from sessions_app.models import ChatMessage, ChatSession, OperatorAction, SessionLease
from sessions_app.timeline import TURNS_PER_PAGE, build_page, label_items, pretty_json
from takeover_app import page as takeover_page
from takeover_app import service as takeover_service
from takeover_app.access import TAKE_OVER
from takeover_app.models import SessionMode
from turns_app.models import TurnRecord

LIST = "sessions_app/session_list.html"
DETAIL = "sessions_app/session_detail.html"
GONE = "sessions_app/session_gone.html"
FIND = "sessions_app/session_find.html"
REFUSED = "400.html"
AUDIT = "sessions_app/audit_list.html"
AUDIT_PAGE = 100


def _fragment_wanted(request: HttpRequest) -> bool:
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.history_restore_request


def _render(request: HttpRequest, template: str, partial: str, ctx: dict, status: int = 200) -> HttpResponse:
    name = f"{template}#{partial}" if _fragment_wanted(request) else template
    response = render(request, name, ctx, status=status)
    patch_vary_headers(response, ["HX-Request"])
    return response


def _url(name: str, params: dict, *args: str) -> str:
    query = urlencode(params)
    return reverse(name, args=args) + (f"?{query}" if query else "")


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    return redirect("sessions-list-sessions")


# ---- list ------------------------------------------------------------------------------------
#: The list's columns: (label, sort key or None, CSS class).
COLUMNS = [("Session", "session", "sid"), ("Channel", None, "chan"), ("Active agent", "agent", "agent"),
           ("Turns", None, "num"), ("Last message", None, "last-msg"), ("Created", "created", "ts"),
           ("Updated", "updated", "ts"), ("Waiting", "waiting", "ts waiting"), ("Tokens", "tokens", "num tokens"),
           ("Cost", "cost", "num cost"), ("Status", None, "status")]


def _headers(query: listing.ListQuery) -> list[dict]:
    """Column headers with sort links that keep the other filters (a click on the sorted column reverses it)."""
    out = []
    for label, key, css in COLUMNS:
        head = {"label": label, "css": css, "url": None, "aria_sort": None}
        if key:
            current = query.sort.lstrip("-") == key
            descending = query.sort.startswith("-")
            if current:
                head["aria_sort"] = "descending" if descending else "ascending"
                target = key if descending else f"-{key}"
            else:
                target = f"-{key}" if key in ("updated", "created", "tokens", "cost") else key
            head["url"] = _url("sessions-list-sessions", query.params(sort=target, after="", before=""))
        out.append(head)
    return out


@require_GET
@console_required()
def session_list(request: HttpRequest) -> HttpResponse:
    """The list; refused filter values (bad dates, unknown sort) answer 400 with the reasons on the page."""
    query = listing.parse_query(request.GET)
    page = listing.fetch_window(query) if not query.errors else listing.Page([], None, None)
    listing.attach_hits(query, page.rows)
    for row in page.rows:
        for hit in row.search.hits if row.search else ():
            hit.url = hit_url(hit.session_id, hit.turn, hit.message_id)
    count, more = listing.bounded_count(query) if not query.errors else (0, False)
    channels = list(listing.CHANNELS)
    if query.channel and query.channel not in channels:
        channels.append(query.channel)
    agent_names = list(registry.agents())
    if query.agent and query.agent not in agent_names:
        agent_names.append(query.agent)
    ctx = {
        "query": query,
        "rows": page.rows,
        "count": count, "count_more": more,
        "next_url": _url("sessions-list-sessions", query.params(after=page.next_cursor, before=""))
        if page.next_cursor else None,
        "prev_url": _url("sessions-list-sessions", query.params(before=page.prev_cursor, after=""))
        if page.prev_cursor else None,
        "first_url": _url("sessions-list-sessions", query.params(after="", before="")) if page.prev_cursor else None,
        "agent_names": agent_names,
        "channels": channels,
        "modes": [(m, SessionMode.Mode(m).label) for m in listing.MODES],
        "headers": _headers(query),
        "ws_url": _list_live_url(query),
    }
    return _render(request, LIST, "session-table", ctx, status=400 if query.errors else 200)


def hit_url(session_id: str, turn: int, message_id: int) -> str:
    """The session page at ``turn`` (oldest-first pages: its page does not move as turns are added) with the
    message ``message_id`` highlighted (``hit``) and the turn in view."""
    page = max(0, turn - 1) // TURNS_PER_PAGE + 1
    params = urlencode({"order": "oldest", "page": page, "hit": message_id})
    return f"{reverse('sessions-show-session', args=[session_id])}?{params}#turn-{turn}"


def _list_live_url(query: listing.ListQuery) -> str:
    """The list's websocket: a changed session moves to the top only where the newest sessions are shown
    (the first page, newest first); with a search or filters, only sessions that match them are shown."""
    params = {}
    if query.sort == "-updated" and not query.after and not query.before:
        params["mode"] = "top"
    if filters := listing.filters_of(query):
        params["filters"] = urlencode(filters)
    return live_url() + (f"?{urlencode(params)}" if params else "")


# ---- detail ----------------------------------------------------------------------------------
class SessionGone(Http404):
    """The session does not exist (any more): answered by :func:`session_gone`, never Django's 404 page."""


def counted_session(session_id: str) -> ChatSession:
    """The session with its message and turn counts (one query), or :class:`SessionGone`."""
    session = listing.counted(ChatSession.objects.all()).filter(pk=session_id).first()
    if session is None:
        raise SessionGone(f"No session {session_id!r}.")
    return session


def _exists(session_id: str) -> None:
    if not ChatSession.objects.filter(pk=session_id).exists():
        raise SessionGone(f"No session {session_id!r}.")


def _when(at: Any) -> str:
    return timezone.localtime(at).strftime("%Y-%m-%d %H:%M")


def gone_reason(session_id: str) -> str:
    """Why no session has ``session_id``, as a sentence: its first turn is running or ended without committing
    (the turn that would have created it), it was deleted (by whom, when), or nothing ever had the id.

    Only the turn records since the id's last delete count (a delete takes the id off its session's records)."""
    deleted = OperatorAction.objects.filter(session_id=session_id, action=OperatorAction.Kind.DELETE).order_by(
        "-created_at", "-id").first()
    records = TurnRecord.objects.filter(session_id=session_id)
    if deleted is not None:
        records = records.filter(started_at__gt=deleted.created_at)
    first = records.order_by("-started_at", "-id").first()
    earlier = (f" An earlier session of this id was deleted by {deleted.actor_username or 'the system'} "
               f"at {_when(deleted.created_at)}." if deleted is not None else "")
    if first is None and deleted is not None:
        return (f"It was deleted by {deleted.actor_username or 'the system'} at {_when(deleted.created_at)} "
                "(the audit log has the entry).")
    if first is None:
        return "No session ever had this id here: the address may be wrong."
    if first.status == TurnRecord.Status.RUNNING:
        return (f"Its first turn is running (since {_when(first.started_at)}): the session is created when that "
                "turn commits." + earlier)
    if first.status == TurnRecord.Status.COMPLETED:
        return "It had turns and was deleted outside the console (no audit entry)." + earlier
    error = f" ({first.error[:300]})" if first.error else ""
    return (f"It never got its first turn: that turn ended {first.get_status_display().lower()}{error} at "
            f"{_when(first.finished_at or first.started_at)} without being stored, and nothing created the "
            "session." + earlier)


def session_gone(request: HttpRequest, session_id: str) -> HttpResponse:
    """404 for a session that does not exist (deleted, perhaps by another operator meanwhile, or never created:
    its first turn did not commit), saying which (:func:`gone_reason`): an htmx request gets the message as a
    fragment for the page's dialog (``static/js/live.js`` swaps it), a full request the message in the site's
    layout."""
    ctx = {"session_id": session_id, "reason": gone_reason(session_id)}
    if _fragment_wanted(request):
        response = render(request, f"{DETAIL}#session-gone", ctx, status=404)
        reselect(reswap(retarget(response, "#dialog"), "innerHTML"), "unset")
    else:
        response = render(request, GONE, ctx, status=404)
    patch_vary_headers(response, ["HX-Request"])
    return response


def _or_gone(view):
    """View decorator: a :class:`SessionGone` (or an action's 404: the session went meanwhile) is answered
    by :func:`session_gone`."""
    @functools.wraps(view)
    def wrapper(request: HttpRequest, session_id: str) -> HttpResponse:
        try:
            return view(request, session_id)
        except Http404:
            return session_gone(request, session_id)

    return wrapper


def _int(value: str | None, default: int) -> int:
    try:
        return int(value or default)
    except ValueError:
        return default


def _turn(value: str | None) -> int:
    """The ``turn`` parameter of a rollback preview or confirmation; :class:`actions.InvalidAction` if not a number."""
    try:
        return int(value or "")
    except ValueError:
        shown = clean_text(value or "")[:40]
        raise actions.InvalidAction(f"turn must be a number (0 removes every turn); got {shown!r}.") from None


def _history_position(get: Any) -> tuple[bool, int]:
    """The session page's ``order`` (``newest``, the default, or ``oldest``) and ``page`` (a whole number from 1;
    one past the last page shows the last, as a link made before a rollback may ask); empty is the default.
    :class:`actions.InvalidAction` (400) naming a malformed one."""
    order = get.get("order") or "newest"
    if order not in ("newest", "oldest"):
        raise actions.InvalidAction(f"order must be newest or oldest; got {clean_text(order)[:40]!r}.")
    page = get.get("page") or "1"
    try:
        number = int(page) if page.isascii() and page.isdigit() else 0
    except ValueError:  # more digits than int() reads
        number = 0
    if number < 1:
        raise actions.InvalidAction(f"page must be a whole number from 1 (a page past the last shows the last); "
                                    f"got {clean_text(page)[:40]!r}.")
    return order == "newest", number


def _detail_ctx(request: HttpRequest, session: ChatSession, **extra: object) -> dict:
    """The context of an action's page or panel: the session page's first page (action URLs carry no position)."""
    return detail_ctx(request.user, session, **extra)


def detail_ctx(user: Any, session: ChatSession, newest_first: bool = True, page_number: int = 1,
               **extra: object) -> dict:
    """The detail screen's context for ``user`` (also what the live consumer renders its partials with)."""
    before = ChatMessage.objects.filter(session_id=session.session_id).aggregate(m=Max("id"))["m"] or 0
    page = build_page(session.session_id, page_number, newest_first)
    sid = session.session_id
    agents = export.turn_agents(session)
    for turn in page.turns:
        turn.agents = agents[turn.number - 1] if turn.number <= len(agents) else []
        label_items(turn.items, turn.agents, page.times)
    label_items([*page.system, *page.leading], [], page.times)
    takeover_page.attach_replies(sid, (i for t in page.turns for i in t.items))
    can_export = may(user, EXPORT)
    lease = SessionLease.objects.filter(pk=sid).first()
    agent_names = list(registry.agents())
    return {
        "s": session,
        "metadata": [(k, v if isinstance(v, str) else pretty_json(v)) for k, v in session.metadata.items()]
        if isinstance(session.metadata, dict) else [],
        "history": page,
        **pager_ctx(sid, page.page, page.pages, newest_first),
        "agent_names": agent_names,
        "window_start": page.turn_count - actions.site_store().default_max_turns,
        "agent_registered": registry.get_agent(session.active_agent_name) is not None,
        "can_handoff": may(user, FORCE_HANDOFF),
        "can_rollback": may(user, ROLLBACK),
        "can_delete": may(user, DELETE),
        "can_export": can_export,
        "export_url": reverse("api-v1:api-export-transcript", kwargs={"session_id": sid}) if can_export else "",
        "export_formats": [("json", "JSON"), ("jsonl", "JSONL"), ("csv", "CSV"), ("md", "Markdown")],
        "exports": list(OperatorAction.objects.filter(session_id=sid, action=OperatorAction.Kind.EXPORT)
                        .order_by("-created_at", "-id")[:5]),
        "lease": lease,
        "takeover": takeover_page.takeover_ctx(user, session, lease, agent_names),
        "can_chat": may(user, CHAT),  # the live chat page (agents_app)
        # Live updates: the page has every message up to last_id; new turns are inserted only on the
        # page that shows the newest turn (tail).
        "ws_url": live_url(sid),
        "live_tail": page.page == (1 if newest_first else page.pages),
        "last_id": max([before, *_row_ids(page)]),
        **extra,
    }


def _row_ids(page: Any) -> list[int]:
    items = [*page.system, *page.leading, *(i for t in page.turns for i in t.items)]
    return [i.row_id for i in items if i.row_id]


def live_url(session_id: str | None = None) -> str:
    """The websocket path of a session's live updates (the list's when None)."""
    if session_id is None:
        return "/ws/sessions/"
    return "/ws/sessions/" + quote(session_id, safe="") + "/"


@require_GET
@never_cache
@console_required()
@_or_gone
def session_detail(request: HttpRequest, session_id: str) -> HttpResponse:
    """The session page; for htmx its history, or with ``panel=1`` the whole workspace (conversation and
    inspector: what the page re-reads after a takeover action, ``static/js/takeover.js``).

    Never cached (``Cache-Control: no-store``): the browser's Back loads it again, so a session deleted
    meanwhile shows as gone, not as it was."""
    session = counted_session(session_id)
    try:
        newest_first, page = _history_position(request.GET)
    except actions.InvalidAction as err:
        ctx = {"reason": str(err), "back_url": reverse("sessions-show-session", args=[session_id]),
               "back_label": "Open the session at its newest turns"}
        return _render(request, REFUSED, "refusal", ctx, status=err.status)
    partial = "session-panel" if request.GET.get("panel") == "1" else "history"
    return _render(request, DETAIL, partial, detail_ctx(request.user, session, newest_first, page))


@require_GET
@console_required()
@_or_gone
def session_find(request: HttpRequest, session_id: str) -> HttpResponse:
    """*Find in session*: every message of the session (all its pages) that matches ``q`` (the list's search
    syntax), newest first, each with its turn and a link to it; for htmx the results' fragment."""
    session = counted_session(session_id)
    q = clean_text(str(request.GET.get("q", "") or "")).strip()[:200]
    found = find_in_session(parse_search(q), session_id) if q else None
    for hit in found.hits if found else ():
        hit.url = hit_url(session_id, hit.turn, hit.message_id)
    return _render(request, FIND, "find-results", {"s": session, "q": q, "found": found})


def _action_error(request: HttpRequest, session_id: str, err: actions.ActionError,
                  target: str = "#dialog") -> HttpResponse:
    """A refusal: for htmx into ``target`` (the page's dialog, or the slot beside the form), else the page."""
    if _fragment_wanted(request):
        response = render(request, f"{DETAIL}#action-error", {"error": str(err)}, status=err.status)
        reselect(reswap(retarget(response, target), "innerHTML"), "unset")
        return response
    session = counted_session(session_id)
    return render(request, DETAIL, _detail_ctx(request, session, error=str(err)), status=err.status)


def _dialog(request: HttpRequest, partial: str, ctx: dict) -> HttpResponse:
    """A dialog's content: into the page's ``#dialog`` for htmx, else the whole page with the dialog open."""
    response = _render(request, DETAIL, partial, ctx)
    if _fragment_wanted(request):
        reswap(retarget(response, "#dialog"), "innerHTML")
    return response


def _after_action(request: HttpRequest, session_id: str, note: str) -> HttpResponse:
    if _fragment_wanted(request):
        session = counted_session(session_id)
        response = render(request, f"{DETAIL}#session-panel", _detail_ctx(request, session, note=note))
        reswap(retarget(response, "#session-panel"), "outerHTML")
        return response
    messages.success(request, note)
    return redirect("sessions-show-session", session_id=session_id)


# ---- actions ---------------------------------------------------------------------------------
@require_POST
@console_required(FORCE_HANDOFF)
@_or_gone
def session_handoff(request: HttpRequest, session_id: str) -> HttpResponse:
    _exists(session_id)
    agent, reason = request.POST.get("agent", "").strip(), request.POST.get("reason", "").strip()[:500]
    try:
        entry = actions.force_handoff(request.user, session_id, agent, reason)
    except actions.ActionError as err:
        return _action_error(request, session_id, err, target="#handoff-error")
    return _after_action(request, session_id, f"Handed off from {entry.before['active_agent']} to {agent}.")


@require_GET
@console_required(ROLLBACK)
@_or_gone
def session_rollback_preview(request: HttpRequest, session_id: str) -> HttpResponse:
    """The rollback's plan (``actions.plan_rollback``: the rollback itself, not committed) in the dialog; for
    htmx the dialog alone, from the plan and the session's id, else the whole page with it open."""
    try:
        plan = actions.plan_rollback(session_id, _turn(request.GET.get("turn")))
    except actions.ActionError as err:
        return _action_error(request, session_id, err)
    if _fragment_wanted(request):
        return _dialog(request, "rollback-preview", {"s": {"session_id": session_id}, "plan": plan})
    return _dialog(request, "rollback-preview", _detail_ctx(request, counted_session(session_id), plan=plan))


@require_POST
@console_required(ROLLBACK)
@_or_gone
def session_rollback(request: HttpRequest, session_id: str) -> HttpResponse:
    _exists(session_id)
    try:
        turn = _turn(request.POST.get("turn"))
        plan, _entry = actions.rollback(request.user, session_id, turn, request.POST.get("fingerprint", ""))
    except actions.ActionError as err:
        return _action_error(request, session_id, err)
    removed = len(plan.removed_ids)
    return _after_action(request, session_id,
                         f"Rolled back to turn {turn}: {removed} message{'s' if removed != 1 else ''} removed; "
                         f"active agent {plan.agent_after}.")


@require_GET
@console_required(DELETE)
@_or_gone
def session_delete_confirm(request: HttpRequest, session_id: str) -> HttpResponse:
    session = counted_session(session_id)
    return _dialog(request, "delete-confirm", _detail_ctx(request, session, confirm_delete=True))


@require_POST
@console_required(DELETE)
@_or_gone
def session_delete(request: HttpRequest, session_id: str) -> HttpResponse:
    _exists(session_id)
    try:
        actions.delete_session(request.user, session_id)
    except actions.ActionError as err:
        return _action_error(request, session_id, err)
    messages.success(request, f"Deleted session {session_id}.")
    target = reverse("sessions-list-sessions")
    if _fragment_wanted(request):
        return HttpResponseClientRedirect(target)
    return redirect(target)


@require_GET
@console_required(TAKE_OVER)
@_or_gone
def session_handback_confirm(request: HttpRequest, session_id: str) -> HttpResponse:
    """The hand-back dialog (agent select, private note, the customer messages held since the last reply with
    "let the bot answer these now" or "answered, hand back"); its form posts to takeover_app's hand-back."""
    session = counted_session(session_id)
    held = takeover_service.held_messages(session_id)
    return _dialog(request, "handback-dialog", _detail_ctx(request, session, confirm_handback=True, held=held))


# ---- audit log -------------------------------------------------------------------------------
@require_GET
@console_required()
def audit_list(request: HttpRequest) -> HttpResponse:
    # clean_text: NUL (which PostgreSQL text cannot hold: a 500) and lone surrogates never reach a filter.
    actor = clean_text(request.GET.get("actor", "")).strip()[:150]
    action = clean_text(request.GET.get("action", "")).strip()[:32]
    session_id = clean_text(request.GET.get("session", ""))[:1000]
    before = _int(request.GET.get("before"), 0)
    qs = OperatorAction.objects.order_by("-id")
    if actor:
        qs = qs.filter(actor_username=actor)
    if action:
        qs = qs.filter(action=action)
    if session_id:
        qs = qs.filter(session_id=session_id)
    if before:
        qs = qs.filter(id__lt=before)
    entries = list(qs[: AUDIT_PAGE + 1])
    more = len(entries) > AUDIT_PAGE
    entries = entries[:AUDIT_PAGE]
    filters = {k: v for k, v in {"actor": actor, "action": action, "session": session_id}.items() if v}
    ctx = {
        "entries": [(e, pretty_json(e.before), pretty_json(e.after)) for e in entries],
        "actor": actor, "action": action, "session_filter": session_id,
        "actions": OperatorAction.action_choices(),
        "next_url": _url("sessions-list-actions", {**filters, "before": entries[-1].id}) if more and entries else None,
    }
    return _render(request, AUDIT, "audit-table", ctx)


def pager_ctx(session_id: str, page: int, pages: int, newest_first: bool) -> dict[str, str | None]:
    """The history toolbar's order and links (``order``, ``prev_url``, ``next_url``, ``older_url``,
    ``newer_url``, ``toggle_url``) for page ``page`` of ``pages``."""
    order = "newest" if newest_first else "oldest"

    def page_url(n: int, order: str = order) -> str:
        return reverse("sessions-show-session", args=[session_id]) + "?" + urlencode({"order": order, "page": n})

    prev_url = page_url(page - 1) if page > 1 else None
    next_url = page_url(page + 1) if page < pages else None
    return {
        "order": order,
        "prev_url": prev_url,
        "next_url": next_url,
        # The conversation reads oldest first whatever the order: older turns load above, newer below.
        "older_url": next_url if newest_first else prev_url,
        "newer_url": prev_url if newest_first else next_url,
        "toggle_url": page_url(1, "oldest" if newest_first else "newest"),
    }
