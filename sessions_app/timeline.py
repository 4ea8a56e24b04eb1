"""A session's stored history as the console shows it: SYSTEM messages pinned, then numbered turns.

Turns are numbered over every stored row (1 = oldest), which is what "roll back to turn N" means.
Only the turns on the requested page are read and parsed: the turn boundaries come from the ids of
the USER rows (one narrow query on the (session_id, id) index), so a 10,000-message session opens
by reading one page of rows. Rows are parsed with the runtime's own ``parse_row`` (bad JSON falls
back to the role/content columns; a row unreadable either way is shown flagged, never dropped).

Nothing here renders HTML: templates escape every string (invariant 9).
"""

from __future__ import annotations

import json
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chatflow_agent.core.backend import StoredRow, parse_row
from chatflow_agent.types import Message, Role, ToolCall, ToolResult
from sessions_app.models import ChatMessage, OperatorAction

__all__ = ["TurnPage", "agents_by_turn", "build_page", "handoff_of", "pretty_json", "turn_bounds", "turn_items"]

HANDOFF_STATUS = "HANDOFF_SUCCESS"
TURNS_PER_PAGE = 20


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

    @property
    def call_count(self) -> int:
        return sum(1 for i in self.items if i.kind == "call")

    @property
    def has_problem(self) -> bool:
        return any(i.kind in ("orphan-result", "unreadable") or (i.kind == "call" and (i.result is None
                   or i.result.is_error)) for i in self.items)


def _parse(rows: list[tuple[int, str, str | None, str]]) -> list[tuple[int, Message | None, str]]:
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
        if msg is None:
            items.append(Item("unreadable", rid, text=raw))
        elif msg.role in (Role.USER, Role.SYSTEM):
            items.append(Item(msg.role.value, rid, text=msg.content or ""))
        elif msg.role == Role.MODEL:
            if msg.content:
                items.append(Item("model", rid, text=msg.content, answer=not msg.tool_calls))
            for call in msg.tool_calls or []:
                result = results.get(call.id)
                items.append(Item("call", rid, call=call, result=result,
                                  handoff=handoff_of(result) if result is not None else None))
        else:
            for r in msg.tool_results or []:
                if r.tool_call_id not in called:
                    items.append(Item("orphan-result", rid, result=r, handoff=handoff_of(r)))
    answers = [i for i in items if i.kind == "model" and i.answer]
    for i in answers[:-1]:
        i.answer = False
    return items


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
    return list(qs.values_list("id", "role", "content", "message_json"))


def page_count(turn_count: int, per_page: int = TURNS_PER_PAGE) -> int:
    """How many pages of ``per_page`` turns ``turn_count`` turns fill (at least one)."""
    return max(1, -(-turn_count // per_page))


def build_page(session_id: str, page: int = 1, newest_first: bool = True,
               per_page: int = TURNS_PER_PAGE) -> TurnPage:
    """One page of turns (``per_page`` turns), SYSTEM messages and, on the oldest page, leading rows."""
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
        .order_by("id").values_list("id", "role", "content", "message_json")
    )
    system = turn_items(_parse(system_rows))
    oldest_page = lo_n <= 1
    leading = turn_items(_parse(_rows(session_id, None, bounds[0][0] if bounds else None))) if oldest_page else []
    turns: list[Turn] = []
    if total:
        lo_id = bounds[lo_n - 1][0]
        hi_id = bounds[hi_n][0] if hi_n < total else None
        rows = _rows(session_id, lo_id, hi_id)
        starts = {rid: n for n, (rid, _at) in enumerate(bounds, start=1)}
        chunks: list[tuple[int, list]] = []
        for row in rows:
            if row[0] in starts:
                chunks.append((starts[row[0]], [row]))
            elif chunks:
                chunks[-1][1].append(row)
        for number, chunk in chunks:
            turns.append(Turn(number, turn_items(_parse(chunk)), bounds[number - 1][1], len(chunk),
                              message_ids=[row[0] for row in chunk]))
    result = TurnPage(system, leading, turns, total, page, pages, newest_first)
    _attach_events(result, session_id, bounds)
    if newest_first:
        result.turns.reverse()
    return result


def _attach_events(page: TurnPage, session_id: str, bounds: list[tuple[int, datetime]]) -> None:
    """Operator actions (from the audit log) shown after the turn during which they happened."""
    events = list(OperatorAction.objects.filter(session_id=session_id).order_by("created_at", "id")[:500])
    by_number = {t.number: t for t in page.turns}
    starts = [at for _rid, at in bounds]
    for event in events:
        n = bisect_right(starts, event.created_at)
        if n == 0:
            if not page.turns or 1 in by_number:
                page.early_events.append(event)
        elif n in by_number:
            by_number[n].events.append(event)


def agents_by_turn(handoffs: list[list[dict[str, Any]]], active_agent: str, starting_agent: str) -> list[list[str]]:
    """For each turn (``handoffs[k]``: the handoffs of turn k+1, in order), the agents that handled it.

    The first agent of a turn is the one active when it started, each handoff adds its target, so the
    last one is the agent that answered. The agent before the first handoff is that handoff's ``from``;
    0.3.4 did not record it, and then it is ``starting_agent`` (no handoff before means the session
    started there). With no handoff at all it is ``active_agent``. Handoffs forced by an operator are
    not chat messages and do not show here (the audit log has them).
    """
    flat = [h for turn in handoffs for h in turn]
    current = (flat[0]["from"] or starting_agent) if flat else active_agent
    out: list[list[str]] = []
    for turn in handoffs:
        trail = [current]
        for h in turn:
            current = h["to"]
            trail.append(current)
        out.append(trail)
    return out
