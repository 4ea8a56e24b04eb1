"""A session's stored history as the console shows it: SYSTEM messages pinned, then numbered turns.

Turns are numbered over every stored row (1 = oldest) by :func:`row_turns` (the runtime's
``numbered_turns`` over the rows' role column): what "turn N" means on the page, in every export and
for a rollback.
Only the turns on the requested page are read and parsed: the turn boundaries come from the ids of
the USER rows (one narrow query on the (session_id, id) index), so a 10,000-message session opens
by reading one page of rows. Rows are parsed with the runtime's own ``parse_row`` (bad JSON falls
back to the role/content columns; a row unreadable either way is shown flagged, never dropped).

Nothing here renders HTML: templates escape every string (invariant 9).
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any, TypeVar

from chatflow_agent.core.backend import StoredRow, parse_row
from chatflow_agent.core.memory import numbered_turns
from chatflow_agent.types import Message, Role, ToolCall, ToolResult
from sessions_app.models import ChatMessage, OperatorAction
from turns_app.usage import attach_records

__all__ = [
    "NOT_IN_TIMELINE", "AgentChange", "TurnPage", "agent_actions", "agent_changes", "agents_by_turn", "build_page",
    "handoff_of", "label_items", "message_agents", "parse_rows", "pretty_json", "row_turns", "turn_bounds",
    "turn_items", "turns_before",
]

HANDOFF_STATUS = "HANDOFF_SUCCESS"
TURNS_PER_PAGE = 20
LONG_CHARS, LONG_LINES = 2000, 40  # a message text above either is collapsed with "show all"
PREVIEW_CHARS, PREVIEW_LINES = 1200, 12
#: Audit log actions not shown in the conversation (the inspector lists the session's exports).
NOT_IN_TIMELINE = ("export",)


_R = TypeVar("_R", bound=Sequence[Any])
_row_role = itemgetter(1)


def row_turns(rows: Iterable[_R], first: int = 1) -> Iterator[tuple[int, list[_R]]]:
    """``chatflow_messages`` rows (tuples ``(id, role, …)`` in id order) as ``(turn number, rows)``: the
    runtime's ``numbered_turns`` over the role column, the one rule for what "turn N" means.

    Turns are numbered from ``first`` (1 for a whole session; for a slice that starts at turn k's USER
    row, k); rows before the first USER row come first as ``first - 1`` (0: the rows before turn 1).
    SYSTEM rows stay where they are: the page pins them, the exports keep them in place, a rollback
    keeps them. Lazy, so a streamed export holds one turn at a time.
    """
    return numbered_turns(rows, _row_role, first)


def pretty_json(value: Any) -> str:
    """Indented JSON for display (strings stay strings: the template escapes them)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def handoff_of(result: ToolResult) -> dict[str, Any] | None:
    """``{"from", "to", "reason"}`` when ``result`` is the Runner's handoff result, else None.

    ``from`` is None for results written by chatflow-agent 0.3.4, which did not record it.
    """
    content = result.content
    if isinstance(content, dict) and content.get("status") == HANDOFF_STATUS and content.get("transferred_to"):
        return {
            "from": str(content["transferred_from"]) if content.get("transferred_from") else None,  # 0.3.4 omits it
            "to": str(content["transferred_to"]),
            "reason": str(content.get("reason") or ""),
        }
    return None


@dataclass
class Item:
    """One thing shown in a turn, in order. ``kind``: user, model, call, orphan-result, unreadable, system."""

    kind: str
    row_id: int | None = None
    text: str | None = None
    call: ToolCall | None = None
    result: ToolResult | None = None
    handoff: dict[str, Any] | None = None
    answer: bool = False
    running: bool = False  # live: a tool call whose result has not arrived yet
    dom: str = ""  # live: the HTML id a later fragment replaces (a running tool call)
    at: datetime | None = None  # when it was written (None while a turn runs): see label_items
    written: datetime | None = None  # its message's own timestamp (None for an unreadable row)
    agent: str | None = None  # the agent active when it was written (see label_items; None for SYSTEM)
    author: str | None = None  # a MODEL message an operator wrote (takeover): their username
    reply: Any = None  # its delivery (takeover_app's OperatorReply), attached by takeover_app.page

    @property
    def long(self) -> bool:
        """True when its text is collapsed on the page (more than LONG_CHARS characters or LONG_LINES lines)."""
        text = self.text or ""
        return len(text) > LONG_CHARS or text.count("\n") >= LONG_LINES

    @property
    def preview(self) -> str:
        """The start of a long text, shown until the reader asks for all of it."""
        return "\n".join((self.text or "")[:PREVIEW_CHARS].split("\n")[:PREVIEW_LINES]) + "…"

    @property
    def args_json(self) -> str:
        return pretty_json(self.call.args) if self.call else ""

    @property
    def result_json(self) -> str:
        return pretty_json(self.result.content) if self.result is not None else ""


@dataclass
class Turn:
    number: int
    items: list[Item]
    started_at: datetime | None
    message_count: int
    events: list[OperatorAction] = field(default_factory=list)
    message_ids: list[int] = field(default_factory=list)  # its rows' ids (live updates resume after them)
    agents: list[str] = field(default_factory=list)  # the agent that started it, then each handoff's target
    record: Any = None  # its turns_app TurnRecord (None when none was kept)
    ended: list[Any] = field(default_factory=list)  # records of turns after it that left no messages

    @property
    def call_count(self) -> int:
        return sum(1 for i in self.items if i.kind == "call")

    @property
    def has_problem(self) -> bool:
        return any(i.kind in ("orphan-result", "unreadable") or (i.kind == "call" and (i.result is None
                   or i.result.is_error)) for i in self.items)


def parse_rows(rows: list[tuple[int, str, str | None, str]]) -> list[tuple[int, Message | None, str]]:
    """``(id, role, content, message_json)`` rows of ``chatflow_messages`` → ``(id, message, content)``; a row
    that does not parse gives None as its message (shown as it is stored)."""
    out = []
    for rid, role, content, message_json in rows:
        out.append((rid, parse_row(StoredRow(rid, role, content, message_json)), content or ""))
    return out


def turn_items(parsed: list[tuple[int, Message | None, str]]) -> list[Item]:
    """A turn's messages as items: each tool call paired with its result, orphans and errors flagged."""
    results: dict[str, ToolResult] = {}
    called: set[str] = set()
    for _rid, msg, _raw in parsed:
        if msg is not None and msg.role == Role.TOOL:
            for r in msg.tool_results or []:
                results.setdefault(r.tool_call_id, r)
        if msg is not None and msg.role == Role.MODEL:
            called.update(c.id for c in msg.tool_calls or [])
    items: list[Item] = []
    for rid, msg, raw in parsed:
        first = len(items)
        if msg is None:
            items.append(Item("unreadable", rid, text=raw))
        elif msg.role in (Role.USER, Role.SYSTEM):
            items.append(Item(msg.role.value, rid, text=msg.content or ""))
        elif msg.role == Role.MODEL:
            if msg.content:
                items.append(Item("model", rid, text=msg.content, answer=not msg.tool_calls and not msg.author,
                                  author=msg.author))
            for call in msg.tool_calls or []:
                result = results.get(call.id)
                items.append(Item("call", rid, call=call, result=result,
                                  handoff=handoff_of(result) if result is not None else None))
        else:
            for r in msg.tool_results or []:
                if r.tool_call_id not in called:
                    items.append(Item("orphan-result", rid, result=r, handoff=handoff_of(r)))
        for item in items[first:]:
            item.written = msg.timestamp if msg is not None else None
    answers = [i for i in items if i.kind == "model" and i.answer]
    for i in answers[:-1]:
        i.answer = False
    return items


def label_items(items: list[Item], agents: Sequence[str], times: dict[int, datetime] | None = None) -> None:
    """Set each item's ``agent``: the agent active when it was written, walking the turn's ``agents`` trail
    (the customer's message goes to the agent the turn started with; a handoff call is its caller's, and
    the items after it are the target's). A handoff without its ``from`` (chatflow-agent 0.3.4 did not
    record it) gets that caller. With ``times`` (row id → created_at), also set its ``at``: when its message
    was written (its own timestamp, as the transcript export gives it: a customer's message when it came,
    not when its turn committed), or when its row was stored where that is earlier (a message rebuilt from
    an unreadable row is dated now). The page and the exports label messages with this one rule."""
    trail = list(agents)
    current = trail[0] if trail else None
    for item in items:
        if times is not None and item.row_id is not None:
            stored = times.get(item.row_id)
            item.at = min(item.written, stored) if item.written and stored else stored
        if item.kind != "system":
            item.agent = current
        handoff = item.handoff
        if handoff is not None:
            if handoff["from"] is None and current is not None:
                handoff["from"] = current
            current = handoff["to"]


def message_agents(parsed: list[tuple[int, Message | None, str]], agents: Sequence[str]) -> dict[int, str | None]:
    """The agent of each of a turn's rows (``parsed`` as :func:`turn_items` takes them; ``agents`` the turn's
    trail), by :func:`label_items`: a row's first item's agent; a TOOL row (its results are shown with their
    calls) the agent of the call its first result answers; a row with neither the agent of the row before."""
    items = turn_items(parsed)
    label_items(items, agents)
    by_row: dict[int | None, str | None] = {}
    by_call: dict[str, str | None] = {}
    for item in items:
        by_row.setdefault(item.row_id, item.agent)
        if item.call is not None:
            by_call.setdefault(item.call.id, item.agent)
    out: dict[int, str | None] = {}
    previous = agents[0] if agents else None
    for rid, msg, _raw in parsed:
        if rid in by_row:
            agent = by_row[rid]
        elif msg is not None and msg.tool_results and msg.tool_results[0].tool_call_id in by_call:
            agent = by_call[msg.tool_results[0].tool_call_id]
        else:
            agent = previous
        out[rid] = previous = agent
    return out


def turn_bounds(session_id: str) -> list[tuple[int, datetime]]:
    """(row id, created_at) of every USER row of the session, oldest first: turn k starts at bounds[k-1]."""
    return list(
        ChatMessage.objects.filter(session_id=session_id, role=Role.USER.value)
        .order_by("id")
        .values_list("id", "created_at")
    )


@dataclass
class TurnPage:
    system: list[Item]
    leading: list[Item]
    turns: list[Turn]
    turn_count: int
    page: int
    pages: int
    newest_first: bool
    early_events: list[OperatorAction] = field(default_factory=list)
    times: dict[int, datetime] = field(default_factory=dict)  # row id → created_at of the rows shown
    early_ended: list[Any] = field(default_factory=list)  # turn records before the first turn (oldest page)

    @property
    def has_next(self) -> bool:
        return self.page < self.pages

    @property
    def has_previous(self) -> bool:
        return self.page > 1


def _rows(session_id: str, lo: int | None, hi: int | None):
    qs = ChatMessage.objects.filter(session_id=session_id).exclude(role=Role.SYSTEM.value).order_by("id")
    if lo is not None:
        qs = qs.filter(id__gte=lo)
    if hi is not None:
        qs = qs.filter(id__lt=hi)
    return list(qs.values_list("id", "role", "content", "message_json", "created_at"))


def page_count(turn_count: int, per_page: int = TURNS_PER_PAGE) -> int:
    """How many pages of ``per_page`` turns ``turn_count`` turns fill (at least one)."""
    return max(1, -(-turn_count // per_page))


def build_page(session_id: str, page: int = 1, newest_first: bool = True,
               per_page: int = TURNS_PER_PAGE) -> TurnPage:
    """One page of turns (``per_page`` turns), SYSTEM messages and, on the oldest page, leading rows.

    ``newest_first`` says where the pages start (page 1 holds the newest turns, else the oldest); the
    page's turns are always in chronological order (oldest first), as the conversation reads.
    """
    bounds = turn_bounds(session_id)
    total = len(bounds)
    pages = page_count(total, per_page)
    page = min(max(1, page), pages)
    if newest_first:
        hi_n = total - (page - 1) * per_page  # turn numbers [lo_n, hi_n]
        lo_n = max(1, hi_n - per_page + 1)
    else:
        lo_n = (page - 1) * per_page + 1
        hi_n = min(total, lo_n + per_page - 1)
    system_rows = list(
        ChatMessage.objects.filter(session_id=session_id, role=Role.SYSTEM.value)
        .order_by("id").values_list("id", "role", "content", "message_json", "created_at")
    )
    times = {r[0]: r[4] for r in system_rows}
    system = turn_items(parse_rows([r[:4] for r in system_rows]))
    oldest_page = lo_n <= 1
    leading_rows = _rows(session_id, None, bounds[0][0] if bounds else None) if oldest_page else []
    times.update((r[0], r[4]) for r in leading_rows)
    leading = turn_items(parse_rows([r[:4] for r in leading_rows]))
    turns: list[Turn] = []
    if total:
        lo_id = bounds[lo_n - 1][0]
        hi_id = bounds[hi_n][0] if hi_n < total else None
        rows = _rows(session_id, lo_id, hi_id)
        times.update((r[0], r[4]) for r in rows)
        for number, chunk in row_turns([r[:4] for r in rows], first=lo_n):
            if number > hi_n:  # a turn committed since the bounds were read: the next read shows it
                break
            turns.append(Turn(number, turn_items(parse_rows(chunk)), bounds[number - 1][1], len(chunk),
                              message_ids=[row[0] for row in chunk]))
    result = TurnPage(system, leading, turns, total, page, pages, newest_first, times=times)
    _attach_events(result, session_id, bounds)
    attach_records(session_id, turns, bounds, result.early_ended if oldest_page else None)
    return result


def turns_before(bounds: list[tuple[int, datetime]], at: datetime) -> int:
    """How many of the turns (``turn_bounds``) were stored by ``at``: an operator action at ``at`` happened
    after that turn (0: before the first). Actions need the session's lease, so none falls inside a turn."""
    return bisect_right([created for _rid, created in bounds], at)


def _attach_events(page: TurnPage, session_id: str, bounds: list[tuple[int, datetime]]) -> None:
    """Operator actions (from the audit log, exports left out) shown after the turn during which they happened."""
    events = list(OperatorAction.objects.filter(session_id=session_id).exclude(action__in=NOT_IN_TIMELINE)
                  .order_by("created_at", "id")[:500])
    by_number = {t.number: t for t in page.turns}
    for event in events:
        n = turns_before(bounds, event.created_at)
        if n == 0:
            if not page.turns or 1 in by_number:
                page.early_events.append(event)
        elif n in by_number:
            by_number[n].events.append(event)


@dataclass(frozen=True)
class AgentChange:
    """An operator action that set the active agent between turns (a forced handoff or a rollback).

    ``after_turn`` turns were stored before it (:func:`turns_before`); ``agent`` is active from then on.
    ``before`` is the agent that ended turn ``after_turn``, or None when that is not known: a later
    rollback removed the turns the action followed.
    """

    after_turn: int
    before: str | None
    agent: str


def agent_actions(session_ids: list[str]) -> dict[str, list[OperatorAction]]:
    """The forced handoffs and rollbacks of each session, oldest first (one query)."""
    kinds = [OperatorAction.Kind.FORCE_HANDOFF, OperatorAction.Kind.ROLLBACK]
    out: dict[str, list[OperatorAction]] = {sid: [] for sid in session_ids}
    for entry in (OperatorAction.objects.filter(session_id__in=session_ids, action__in=kinds)
                  .order_by("created_at", "id")):
        out[entry.session_id].append(entry)
    return out


def agent_changes(entries: list[OperatorAction], bounds: list[tuple[int, datetime]],
                  since: datetime) -> list[AgentChange]:
    """The agent changes recorded by ``entries`` (:func:`agent_actions`) at or after ``since`` (the session's
    ``created_at``: entries of an earlier session with the same id do not count), placed among ``bounds``."""
    changes: list[AgentChange] = []
    for entry in entries:
        after = entry.after if isinstance(entry.after, dict) else {}
        agent = after.get("active_agent")
        if entry.created_at < since or not isinstance(agent, str) or not agent:
            continue
        n = turns_before(bounds, entry.created_at)
        if entry.action == OperatorAction.Kind.ROLLBACK:
            # The turns it removed came after turn n and before it: what earlier entries at n or later
            # followed is gone.
            changes = [c if c.after_turn < n else AgentChange(c.after_turn, None, c.agent) for c in changes]
            before = after.get("agent_after")  # the agent that ended the turn rolled back to
        else:
            before = (entry.before if isinstance(entry.before, dict) else {}).get("active_agent")
        changes.append(AgentChange(n, str(before) if before else None, agent))
    return changes


def agents_by_turn(handoffs: list[list[dict[str, Any]]], active_agent: str, starting_agent: str,
                   changes: Sequence[AgentChange] = ()) -> list[list[str]]:
    """For each turn (``handoffs[k]``: the handoffs of turn k+1, in order), the agents that handled it.

    The first agent of a turn is the one active when it started, each handoff adds its target, so the
    last one is the agent that answered. ``changes`` (:func:`agent_changes`, oldest first) are the agents
    operators set between turns: the next turn starts with that agent. The agent before the first
    recorded change is that change's ``before`` or that handoff's ``from``; 0.3.4 did not record the
    ``from``, and then (or when ``before`` is unknown) it is ``starting_agent`` (no handoff before means
    the session started there). With nothing recorded at all it is ``active_agent``.
    """
    at: dict[int, list[AgentChange]] = {}
    for change in changes:
        at.setdefault(change.after_turn, []).append(change)
    current = _first_agent(handoffs, at, active_agent, starting_agent)
    out: list[list[str]] = []
    for k, turn in enumerate(handoffs):
        for change in at.get(k, ()):
            current = change.agent
        trail = [current]
        for h in turn:
            current = h["to"]
            trail.append(current)
        out.append(trail)
    return out


def _first_agent(handoffs: list[list[dict[str, Any]]], changes: dict[int, list[AgentChange]],
                 active_agent: str, starting_agent: str) -> str:
    """The agent active before the first recorded handoff or change (see :func:`agents_by_turn`)."""
    for k in range(len(handoffs) + 1):
        if changes.get(k):
            return changes[k][0].before or starting_agent
        if k < len(handoffs) and handoffs[k]:
            return handoffs[k][0]["from"] or starting_agent
    return active_agent
