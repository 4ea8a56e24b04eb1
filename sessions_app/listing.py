"""The session list query: search, filters, sort and keyset pagination, without loading any history.

Each page is one query with ``LIMIT per_page + 1`` (the extra row says whether there is a next page):
no COUNT, no OFFSET. The cursor is the last row's (sort timestamp, session_id), so a deep page costs
what the first one costs on the ``(updated_at, session_id)`` index. Per-row numbers (messages, turns,
last message preview, whether a turn holds the lease) are correlated subqueries the database evaluates
only for the rows of the page.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from datetime import datetime
from datetime import time as dtime
from typing import Any

from django.db.models import Count, Exists, IntegerField, OuterRef, Q, Subquery, TextField, Value
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from chatflow_agent.jsonsafe import clean_text
from chatflow_agent.types import Role
from sessions_app.models import ChatMessage, ChatSession, SessionLease

__all__ = ["ListQuery", "SORTS", "after_cursor", "decode_cursor", "encode_cursor", "fetch_page", "filtered",
           "one", "parse_query", "valid_day"]

SORTS = {
    "-updated": ("updated_at", True),
    "updated": ("updated_at", False),
    "-created": ("created_at", True),
    "created": ("created_at", False),
}
PER_PAGE = 50


@dataclass
class ListQuery:
    q: str = ""
    agent: str = ""
    channel: str = ""
    updated_from: str = ""
    updated_to: str = ""
    sort: str = "-updated"
    after: str = ""

    def params(self, **override: str) -> dict[str, str]:
        """Non-empty query parameters (for links), with ``override`` applied."""
        values = {**self.__dict__, **override}
        return {k: v for k, v in values.items() if v and not (k == "sort" and v == "-updated")}


def parse_query(get: Any) -> ListQuery:
    """The list query from request parameters (NUL and lone surrogates removed: PostgreSQL rejects them)."""

    def text(name: str, limit: int) -> str:
        return clean_text(str(get.get(name, "") or "")).strip()[:limit]

    sort = text("sort", 20) or "-updated"
    return ListQuery(
        q=text("q", 200),
        agent=text("agent", 200),
        channel=text("channel", 200),
        updated_from=text("updated_from", 32),
        updated_to=text("updated_to", 32),
        sort=sort if sort in SORTS else "-updated",
        after=text("after", 2000),
    )


def encode_cursor(stamp: datetime, session_id: str) -> str:
    raw = json.dumps([stamp.isoformat(), session_id], ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str] | None:
    """The (timestamp, session_id) of a cursor, or None when it is malformed (then page 1 is shown)."""
    try:
        stamp, session_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        moment = parse_datetime(stamp)
    except (ValueError, TypeError):
        return None
    if moment is None or moment.tzinfo is None or not isinstance(session_id, str) or "\x00" in session_id:
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
    if query.q:
        text = ChatMessage.objects.filter(session_id=OuterRef("pk"), content__icontains=query.q)
        qs = qs.annotate(_meta=Cast("metadata", TextField())).filter(
            Q(session_id__icontains=query.q) | Q(_meta__icontains=query.q) | Exists(text)
        )
    if query.agent:
        qs = qs.filter(active_agent_name=query.agent)
    if query.channel:
        qs = qs.filter(metadata__channel=query.channel)
    start, end = _bound(query.updated_from, False), _bound(query.updated_to, True)
    if start:
        qs = qs.filter(updated_at__gte=start)
    if end:
        qs = qs.filter(updated_at__lte=end)
    return qs


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
    )


def one(session_id: str) -> ChatSession | None:
    """One session with the list's per-row numbers (counts, last message, running), or None."""
    return _annotated(ChatSession.objects.filter(pk=session_id)).first()


def after_cursor(qs, sort: str, cursor: tuple[datetime, str] | None):
    """``qs`` ordered by ``sort`` (then session_id), from the row after ``cursor`` on (keyset)."""
    column, desc = SORTS[sort]
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
    column = SORTS[query.sort][0]
    cursor = decode_cursor(query.after) if query.after else None
    rows = list(_annotated(after_cursor(filtered(query), query.sort, cursor))[: per_page + 1])
    more = len(rows) > per_page
    rows = rows[:per_page]
    nxt = encode_cursor(getattr(rows[-1], column), rows[-1].session_id) if more and rows else None
    return rows, nxt
