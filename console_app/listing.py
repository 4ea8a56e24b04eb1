"""The session list query: search, filters, sort and keyset pagination, without loading any history.

Each page is one query with ``LIMIT per_page + 1`` (the extra row says whether there is a next page):
no COUNT, no OFFSET. The cursor is the last row's (sort timestamp, session_id), so a deep page costs
what the first one costs on the ``(updated_at, session_id)`` index. Per-row numbers (messages, turns,
last message preview, whether a turn holds the lease, the flags other apps register with
:func:`register_flag`) are correlated subqueries the database evaluates only for the rows of the page.
The previous page is the same query run backwards from the first row (``before``). The result count is
bounded: one ``COUNT`` over at most ``COUNT_LIMIT + 1`` rows, shown as "500+" beyond.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from datetime import time as dtime
from decimal import Decimal
from typing import Any

from django.db.models import Count, Exists, IntegerField, OuterRef, Q, Subquery, TextField, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from chatflow_agent.jsonsafe import clean_text
from chatflow_agent.types import Role
from search_app import search
from search_app.query import parse as parse_search
from sessions_app.models import ChatMessage, ChatSession, SessionLease
from takeover_app.models import SessionMode
from turns_app.usage import usage_columns, usage_sort_key

__all__ = ["CHANNELS", "COUNT_LIMIT", "MODES", "ListQuery", "Page", "SORTS", "after_cursor", "attach_hits",
           "bounded_count",
           "FILTERS", "customer_name", "decode_cursor", "encode_cursor", "fetch_page", "fetch_window", "filtered",
           "filters_of", "one",
           "parse_query", "register_flag", "valid_day", "waiting_count"]

#: ``sort`` parameter → (column, descending). Every sort ends with ``session_id`` (the keyset's tie-break).
SORTS = {
    "-updated": ("updated_at", True),
    "updated": ("updated_at", False),
    "-created": ("created_at", True),
    "created": ("created_at", False),
    "session": ("session_id", False),
    "-session": ("session_id", True),
    "agent": ("active_agent_name", False),
    "-agent": ("active_agent_name", True),
    # Pre-aggregated per session (turns_app SessionTotals, kept in the commit's transaction).
    "tokens": ("sort_tokens", False),
    "-tokens": ("sort_tokens", True),
    "cost": ("sort_cost", False),
    "-cost": ("sort_cost", True),
    # Time waiting: longest waiting first ("waiting"); sessions not waiting for a person come last either way.
    "waiting": ("waiting_key", False),
    "-waiting": ("waiting_key", True),
}
_TIME_COLUMNS = {"updated_at", "created_at", "waiting_key"}
_USAGE_SORTS = {"sort_tokens", "sort_cost"}
#: The session modes the ``mode`` filter takes (takeover: who answers the session).
MODES = tuple(SessionMode.Mode.values)
#: Modes in which a person, not the bot, answers (the session waits for one or has one).
_PERSON_MODES = (SessionMode.Mode.WAITING.value, SessionMode.Mode.HUMAN.value)
#: What a session that is not waiting sorts by under the waiting sorts (after every real time).
_NOT_WAITING = {False: datetime(9999, 1, 1, tzinfo=UTC), True: datetime(1970, 1, 2, tzinfo=UTC)}
PER_PAGE = 50
COUNT_LIMIT = 500
#: The channels the list's select offers (``metadata.channel``, matched case-insensitively).
CHANNELS = ("whatsapp", "telegram", "web", "generic")
#: Metadata keys holding the customer's name, first found wins.
NAME_KEYS = ("display_name", "profile_name", "name", "username")

_flags: dict[str, Callable[[], Any]] = {}


def register_flag(name: str, expression: Callable[[], Any]) -> None:
    """Add a boolean per-row flag ``name`` to the list's rows (and :func:`one`).

    ``expression()`` returns a Django expression over the session row (``OuterRef("pk")`` is its
    session_id), e.g. ``Exists(...)``; it is called per query, so it may read the clock. Apps register
    their flags in ``AppConfig.ready`` (the webhook inbox adds ``failed_delivery`` and ``turn_failed``).
    """
    _flags[name] = expression


def customer_name(metadata: Any) -> str:
    """The customer's display name from session metadata (``display_name``, ``profile_name``…), or ``""``."""
    if not isinstance(metadata, dict):
        return ""
    for key in NAME_KEYS:
        value = metadata.get(key)
        if isinstance(value, str) and value.strip():
            return clean_text(value).strip()[:80]
    return ""


@dataclass
class ListQuery:
    q: str = ""
    agent: str = ""
    channel: str = ""
    mode: str = ""
    updated_from: str = ""
    updated_to: str = ""
    sort: str = "-updated"
    after: str = ""
    before: str = ""
    #: parameter → why its value was refused (the refused filter is not applied: the view answers 400).
    errors: dict[str, str] = field(default_factory=dict)

    def params(self, **override: str) -> dict[str, str]:
        """Non-empty query parameters (for links), with ``override`` applied; refused values are left out."""
        values = {k: v for k, v in self.__dict__.items() if k != "errors" and k not in self.errors}
        values.update(override)
        return {k: v for k, v in values.items() if v and not (k == "sort" and v == "-updated")}


def parse_query(get: Any) -> ListQuery:
    """The list query from request parameters (NUL and lone surrogates removed: PostgreSQL rejects them).

    A date that is not YYYY-MM-DD, a range that ends before it starts, an unknown sort or a page cursor
    (``after``, ``before``) that is not one this list made for the sort is recorded in ``errors`` (parameter →
    message) and not applied. The channel is lower-cased (``Telegram`` finds telegram).
    """

    def text(name: str, limit: int) -> str:
        return clean_text(str(get.get(name, "") or "")).strip()[:limit]

    errors: dict[str, str] = {}
    sort = text("sort", 20) or "-updated"
    if sort not in SORTS:
        errors["sort"] = f"Unknown sort {sort!r}; choose one of the column headers."
        sort = "-updated"
    days = {}
    for name, label in (("updated_from", "Updated from"), ("updated_to", "Updated to")):
        days[name] = text(name, 32)
        if days[name] and not valid_day(days[name]):
            errors[name] = f"{label}: {days[name]!r} is not a date (YYYY-MM-DD)."
    if ("updated_from" not in errors and "updated_to" not in errors and days["updated_from"] and days["updated_to"]
            and days["updated_from"] > days["updated_to"]):
        errors["updated_to"] = "Updated to is before Updated from."
    mode = text("mode", 20).lower()
    if mode and mode not in MODES:
        errors["mode"] = f"Unknown mode {mode!r}; choose one of {', '.join(MODES)}."
    cursors = {name: text(name, 2000) for name in ("after", "before")}
    for name, cursor in cursors.items():
        if cursor and "sort" not in errors and decode_cursor(cursor, SORTS[sort][0]) is None:
            errors[name] = (f"{name}: {cursor[:40]!r} is not a page cursor of this list; use the Previous and Next "
                            "page links, which carry one.")
    return ListQuery(
        q=text("q", 200),
        mode=mode if "mode" not in errors else "",
        agent=text("agent", 200),
        channel=text("channel", 200).lower(),
        updated_from=days["updated_from"],
        updated_to=days["updated_to"],
        sort=sort,
        after=cursors["after"],
        before=cursors["before"],
        errors=errors,
    )


def encode_cursor(value: datetime | str, session_id: str) -> str:
    """The cursor of a row: its sort column's ``value`` (a timestamp or a text) and its session_id."""
    raw = json.dumps([value.isoformat() if isinstance(value, datetime) else value, session_id],
                     ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, column: str = "updated_at") -> tuple[datetime | Decimal | str, str] | None:
    """The (sort value, session_id) of a cursor for ``column``, or None when it is malformed (:func:`parse_query`
    refuses it). The value is an aware datetime for the time columns, a finite Decimal for the usage sorts
    (tokens, cost), a text otherwise."""
    try:
        value, session_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError, RecursionError):  # RecursionError: nested too deep for the parser
        return None
    if not isinstance(value, str) or not isinstance(session_id, str) or "\x00" in session_id + value:
        return None
    if column in _USAGE_SORTS:  # a number (tokens, cost): anything else is a forged cursor
        try:
            number = Decimal(value)
        except ArithmeticError:
            return None
        return (number, session_id) if number.is_finite() and abs(number) < 10**18 else None
    if column not in _TIME_COLUMNS:
        return value, session_id
    try:
        moment = parse_datetime(value)
    except ValueError:
        return None
    if moment is None or moment.tzinfo is None:
        return None
    return moment, session_id


def _bound(day: str, end: bool) -> datetime | None:
    try:
        parsed = parse_date(day) if day else None
    except ValueError:  # well-formed but impossible, e.g. 2026-02-30
        return None
    if parsed is None:
        return None
    moment = datetime.combine(parsed, dtime.max if end else dtime.min)
    return timezone.make_aware(moment, timezone.get_current_timezone())


def valid_day(day: str) -> bool:
    """True when ``day`` is a YYYY-MM-DD date the filters accept."""
    return _bound(day, False) is not None


def filtered(query: ListQuery):
    """Sessions matching the query's search and filters (unordered, not paged)."""
    qs = ChatSession.objects.all()
    if query.q:  # the full-text index (search_app): words, "phrases", tool:, agent:, channel:
        qs = qs.filter(search.session_filter(parse_search(query.q)))
    if query.agent:
        qs = qs.filter(active_agent_name=query.agent)
    if query.channel:
        qs = qs.filter(metadata__channel__iexact=query.channel)
    if query.mode == SessionMode.Mode.BOT:
        qs = qs.filter(~Exists(_person_mode()))
    elif query.mode:
        qs = qs.filter(Exists(SessionMode.objects.filter(session_id=OuterRef("pk"), mode=query.mode)))
    start = _bound(query.updated_from, False) if "updated_from" not in query.errors else None
    end = _bound(query.updated_to, True) if "updated_to" not in query.errors else None
    if start:
        qs = qs.filter(updated_at__gte=start)
    if end:
        qs = qs.filter(updated_at__lte=end)
    return qs


def _person_mode():
    """The session's mode row when a person answers it (``waiting`` or ``human``); none for ``bot``."""
    return SessionMode.objects.filter(session_id=OuterRef("pk"), mode__in=_PERSON_MODES)


def _mode_columns() -> dict[str, Any]:
    """Per-row takeover state: ``mode`` (bot without a row), ``mode_owner``, ``unread``, ``waiting_since``."""
    row = _person_mode()
    return {
        "mode": Coalesce(Subquery(row.values("mode")[:1]), Value(SessionMode.Mode.BOT.value),
                         output_field=TextField()),
        "mode_owner": Subquery(row.values("owner_username")[:1]),
        "mode_since": Subquery(row.values("since")[:1]),
        "unread": Coalesce(Subquery(row.values("unread")[:1]), Value(0), output_field=IntegerField()),
        "waiting_since": Subquery(row.values("waiting_since")[:1]),
    }


def waiting_count() -> int:
    """How many sessions wait for a person right now (mode ``waiting``): the navigation's badge."""
    return SessionMode.objects.filter(mode=SessionMode.Mode.WAITING).count()


def _sortable(qs, sort: str):
    """``qs`` with the sort's column when it is computed (the waiting sorts' ``waiting_key``)."""
    column, desc = SORTS[sort]
    if column != "waiting_key":
        return qs
    return qs.annotate(waiting_key=Coalesce(Subquery(_person_mode().values("waiting_since")[:1]),
                                            Value(_NOT_WAITING[desc])))


def counted(qs):
    """``qs`` with ``message_count`` and ``turn_count`` (USER messages) per session, as subqueries (one query)."""
    per_session = ChatMessage.objects.filter(session_id=OuterRef("pk")).order_by().values("session_id")
    return qs.annotate(
        message_count=Coalesce(Subquery(per_session.annotate(c=Count("id")).values("c")), Value(0),
                               output_field=IntegerField()),
        turn_count=Coalesce(
            Subquery(per_session.filter(role=Role.USER.value).annotate(c=Count("id")).values("c")),
            Value(0), output_field=IntegerField(),
        ),
    )


def _annotated(qs):
    last = (
        ChatMessage.objects.filter(session_id=OuterRef("pk"), role__in=[Role.USER.value, Role.MODEL.value])
        .exclude(content__isnull=True).exclude(content="")
        .order_by("-id")
    )
    return counted(qs).annotate(
        last_role=Subquery(last.values("role")[:1]),
        last_text=Subquery(last.values("content")[:1]),
        running=Exists(SessionLease.objects.filter(session_id=OuterRef("pk"), expires_at__gt=time.time())),
        **usage_columns(),
        **_mode_columns(),
        **{name: expression() for name, expression in _flags.items()},
    )


def one(session_id: str, query: ListQuery | None = None) -> ChatSession | None:
    """One session with the list's per-row numbers (counts, last message, running), or None; with ``query``,
    None also when the session does not match its search and filters."""
    qs = filtered(query) if query is not None else ChatSession.objects.all()
    return _annotated(qs.filter(pk=session_id)).first()


#: The list's parameters that choose which sessions it shows (not their order or page).
FILTERS = ("q", "agent", "channel", "mode", "updated_from", "updated_to")


def filters_of(query: ListQuery) -> dict[str, str]:
    """The search and filters of ``query`` that apply (refused values left out): empty for the whole list."""
    return {k: v for k, v in query.params().items() if k in FILTERS}


def after_cursor(qs, sort: str, cursor: tuple[datetime | str, str] | None, *, backwards: bool = False):
    """``qs`` ordered by ``sort`` (then session_id), from the row after ``cursor`` on (keyset).

    ``backwards``: the rows before ``cursor``, nearest first (the previous page, reversed)."""
    column, desc = SORTS[sort]
    qs = _sortable(qs, sort)
    if column in _USAGE_SORTS:  # (unknown totals last in the sort's own direction, as the waiting sorts)
        qs = qs.annotate(**{column: usage_sort_key(column, desc)})
    desc = desc != backwards
    if cursor is not None:
        stamp, sid = cursor
        # (t, id) < (stamp, sid), written with a sargable first conjunct so the index range is used.
        if desc:
            qs = qs.filter(Q(**{f"{column}__lte": stamp}),
                           Q(**{f"{column}__lt": stamp}) | Q(session_id__lt=sid))
        else:
            qs = qs.filter(Q(**{f"{column}__gte": stamp}),
                           Q(**{f"{column}__gt": stamp}) | Q(session_id__gt=sid))
    return qs.order_by(*([f"-{column}", "-session_id"] if desc else [column, "session_id"]))


def fetch_page(query: ListQuery, per_page: int = PER_PAGE) -> tuple[list[ChatSession], str | None]:
    """The page after ``query.after`` and the cursor of the next page (None on the last page)."""
    page = fetch_window(query, per_page)
    return page.rows, page.next_cursor


@dataclass
class Page:
    """One page of the list: its rows and the cursors of the pages around it (None where there is none)."""

    rows: list[ChatSession]
    next_cursor: str | None
    prev_cursor: str | None


def fetch_window(query: ListQuery, per_page: int = PER_PAGE) -> Page:
    """The page after ``query.after`` (or before ``query.before``), with the next and previous cursors.

    A malformed cursor (which :func:`parse_query` refuses) is read as no cursor (the first page)."""
    column = SORTS[query.sort][0]
    if query.before and (cursor := decode_cursor(query.before, column)) is not None:
        rows = list(_annotated(after_cursor(filtered(query), query.sort, cursor, backwards=True))[: per_page + 1])
        earlier = len(rows) > per_page
        rows = rows[:per_page][::-1]
        return Page(rows, _cursor(rows[-1], column) if rows else None,
                    _cursor(rows[0], column) if earlier and rows else None)
    cursor = decode_cursor(query.after, column) if query.after else None
    rows = list(_annotated(after_cursor(filtered(query), query.sort, cursor))[: per_page + 1])
    more = len(rows) > per_page
    rows = rows[:per_page]
    return Page(rows, _cursor(rows[-1], column) if more and rows else None,
                _cursor(rows[0], column) if cursor is not None and rows else None)


def attach_hits(query: ListQuery, rows: list[ChatSession], per_session: int = 3) -> None:
    """Set ``search`` on each row of a searched page: its :class:`search_app.search.SessionHits` (the newest
    ``per_session`` matching messages with snippet, turn, agent and time), or None (no search, or filters only)."""
    found = search.hits(parse_search(query.q), [row.session_id for row in rows], per_session) if query.q else {}
    for row in rows:
        row.search = found.get(row.session_id)


def _cursor(row: ChatSession, column: str) -> str:
    value = getattr(row, column)
    return encode_cursor(value if isinstance(value, (datetime, str)) else str(value), row.session_id)


def bounded_count(query: ListQuery, limit: int = COUNT_LIMIT) -> tuple[int, bool]:
    """How many sessions match, counted up to ``limit`` (one query over at most ``limit + 1`` rows):
    ``(count, more)`` where ``more`` means there are more than ``limit``."""
    qs = filtered(query)
    # A search walks the sessions in the list's order: its per-session checks then read the index in step with
    # the message ids (as the page did), several times faster than in primary-key order.
    qs = after_cursor(qs, query.sort, None) if query.q else qs.order_by()
    found = qs[: limit + 1].count()
    return min(found, limit), found > limit
