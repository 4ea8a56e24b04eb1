"""Search over the index (search_app.schema) with the syntax of search_app.query: which sessions match, and the
messages that matched in each (hits) with a snippet, turn number, agent and time.

One function per question, each one query or two on the database's own full-text index (SQLite FTS5,
PostgreSQL tsvector/GIN): :func:`session_filter` (a ``Q`` for ``ChatSession``, so the list's filters, sort and
keyset pages apply unchanged), :func:`hits` (the hits of the sessions of one page), :func:`find_in_session`
(every hit of one session). Words and phrases are matched as phrases of the index's tokens, accents and case
folded ("acao" finds "Ação"); a session also matches when its id or a metadata value holds every term (as a
word, or, for terms of 3+ characters, as a substring: a phone-number or id fragment).
"""

from __future__ import annotations

import json
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from chatflow_agent.core.memory import turn_number
from chatflow_agent.types import Role
from search_app.query import SearchQuery
from sessions_app.models import ChatMessage, ChatSession
from turns_app.models import TurnRecord

__all__ = ["FIND_LIMIT", "Hit", "SessionHits", "find_in_session", "hits", "session_filter", "snippet"]

#: Hits :func:`find_in_session` returns at most (newest first).
FIND_LIMIT = 200
#: Characters of a snippet around its first match.
SNIPPET = 180
#: A session whose message ids span at most this many times its message count is read as one rowid range.
DENSE = 4
#: Substring (trigram) matches need terms this long.
_TRIGRAM = 3


@dataclass
class Hit:
    """One matching message: ``turn`` as sessions_app.timeline numbers turns (0: before the first turn),
    ``agent`` the agent that answered that turn (its turn record; else the session's active agent),
    ``snippet`` escaped HTML with each match in ``<mark>``."""

    session_id: str
    message_id: int
    turn: int
    role: str
    agent: str
    at: datetime | None
    snippet: SafeString
    url: str = ""  # where the page that shows it links (set by that page)


@dataclass
class SessionHits:
    """A session's hits, newest first (at most the number asked for), and how many messages matched in all.
    ``session_match``: the session's id or metadata matched (it may have no message hit)."""

    session_id: str
    hits: list[Hit] = field(default_factory=list)
    total: int = 0
    session_match: bool = False


def _sqlite() -> bool:
    return connection.vendor == "sqlite"


def _fts_phrase(term: str) -> str:
    """``term`` as an FTS5 string: its tokens as a phrase, whatever characters it holds."""
    return '"' + term.replace('"', '""') + '"'


def _like(term: str) -> str:
    return term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _pg_tsquery(terms: tuple[str, ...]) -> tuple[str, list[str]]:
    sql = " && ".join("phraseto_tsquery('simple', chatflow_search_fold(%s))" for _ in terms)
    return f"({sql})", list(terms)


def _message_match(query: SearchQuery) -> tuple[str, list[str]]:
    """The condition on the message index for the query's text (else its tools), over alias ``s``."""
    if _sqlite():
        if query.text:
            return "search_messages MATCH %s", ["body : (" + " AND ".join(map(_fts_phrase, query.text)) + ")"]
        return "search_messages MATCH %s", ["tools : (" + " AND ".join(map(_fts_phrase, query.tools)) + ")"]
    if query.text:
        sql, params = _pg_tsquery(query.text)
        return f"s.tsv @@ {sql}", params
    return "s.tools @> %s::text[]", [list(query.tools)]


#: A part of the match with at most this many index rows gives its list of session ids (one read; the list's query
#: then looks those sessions up by id); a part with more is checked per session in the list's order instead (an
#: ``EXISTS`` on the session's own rows), so the page fills from the first sessions it walks.
FEW = 5000
_SESSION = '"chatflow_sessions"."session_id"'


def _parts(terms: tuple[str, ...]) -> list[tuple[str, str, list]]:
    """The ways a session matches ``terms``: (SQL selecting session ids, the same as an EXISTS per session,
    params): its messages, its id and metadata as words, and (terms of 3+ characters) as substrings."""
    long_terms = all(len(t) >= _TRIGRAM for t in terms)
    if _sqlite():
        match = " AND ".join(map(_fts_phrase, terms))
        parts = [("SELECT m.session_id FROM search_messages s JOIN chatflow_messages m ON m.id = s.rowid "
                  "WHERE s.search_messages MATCH %s",
                  "EXISTS (SELECT 1 FROM chatflow_messages m CROSS JOIN search_messages s ON s.rowid = m.id "
                  f"WHERE m.session_id = {_SESSION} AND s.search_messages MATCH %s)", ["body : (" + match + ")"])]
        for table in ("search_sessions", *(("search_sessions_trigram",) if long_terms else ())):
            parts.append((f"SELECT d.session_id FROM {table} f JOIN search_session_docs d ON d.id = f.rowid "
                          f"WHERE f.{table} MATCH %s",
                          f"EXISTS (SELECT 1 FROM search_session_docs d CROSS JOIN {table} f ON f.rowid = d.id "
                          f"WHERE d.session_id = {_SESSION} AND f.{table} MATCH %s)", [match]))
        return parts
    tsquery, params = _pg_tsquery(terms)
    doc, doc_params = f"d.tsv @@ {tsquery}", list(params)
    if long_terms:
        likes = " AND ".join("d.doc LIKE '%%' || chatflow_search_fold(%s) || '%%'" for _ in terms)
        doc = f"({doc} OR ({likes}))"
        doc_params += [_like(t) for t in terms]
    return [(f"SELECT s.session_id FROM search_messages s WHERE s.tsv @@ {tsquery}",
             f"EXISTS (SELECT 1 FROM search_messages s WHERE s.session_id = {_SESSION} AND s.tsv @@ {tsquery})",
             params),
            (f"SELECT d.session_id FROM search_session_docs d WHERE {doc}",
             f"EXISTS (SELECT 1 FROM search_session_docs d WHERE d.session_id = {_SESSION} AND {doc})", doc_params)]


def _few_sessions(sql: str, params: list) -> list[str] | None:
    """The session ids ``sql`` selects when it selects at most :data:`FEW` rows, else None.

    PostgreSQL asks its planner first (a GIN scan reads a common word's whole posting list before any LIMIT):
    an estimate above :data:`FEW` rows is taken as many."""
    with connection.cursor() as cursor:
        if not _sqlite():
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            if plan[0]["Plan"]["Plan Rows"] > FEW:
                return None
        cursor.execute(f"{sql} LIMIT {FEW + 1}", params)
        rows = cursor.fetchall()
    return None if len(rows) > FEW else list(dict.fromkeys(row[0] for row in rows))


def _text_condition(terms: tuple[str, ...]) -> Q:
    """A ``Q`` for the sessions whose messages, or whose id and metadata, hold every term."""
    condition = Q(pk__in=[])
    for listed, exists, params in _parts(terms):
        ids = _few_sessions(listed, params)
        if ids is not None:
            condition |= Q(pk__in=ids)
        else:
            condition |= Q(RawSQL(exists, params, output_field=BooleanField()))
    return condition


def _tool_sessions(tool: str) -> tuple[str, list]:
    if _sqlite():
        return ("SELECT m.session_id FROM search_messages s JOIN chatflow_messages m ON m.id = s.rowid "
                "WHERE search_messages MATCH %s", [f"tools : {_fts_phrase(tool)}"])
    return "SELECT s.session_id FROM search_messages s WHERE s.tools @> %s::text[]", [[tool]]


def session_filter(query: SearchQuery) -> Q:
    """A ``Q`` over ``ChatSession`` for the sessions that match ``query`` (all its terms, tools, agents and
    channels), or whose id is the query as typed; a query with terms but nothing the index can match, and no
    filter, matches only that id."""
    exact = Q(pk=query.raw) if query.raw else Q(pk__in=[])
    if query.empty or (not query.searches and not query.agents and not query.channels):
        return exact
    condition = Q()
    if query.text:
        condition &= _text_condition(query.text)
    for tool in query.tools:
        condition &= Q(pk__in=RawSQL(*_tool_sessions(tool)))
    if query.agents:
        agents = Q()
        for agent in query.agents:
            agents |= Q(active_agent_name__iexact=agent)
        condition &= agents
    if query.channels:
        channels = Q()
        for channel in query.channels:
            channels |= Q(metadata__channel__iexact=channel)
        condition &= channels
    return condition | exact


def _marks(values: list) -> str:
    return ", ".join(["%s"] * len(values))


def _sqlite_matched(match: str, params: list, session_ids: list[str]) -> tuple[str, list]:
    """SQLite's (message id, session id) of the sessions' matching messages. A session whose messages lie close
    together (ids spanning at most :data:`DENSE` × its message count) is read as one FTS5 rowid range; the others
    message by message (each an FTS5 lookup by rowid, which visits every index segment)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT session_id, max(id) - min(id), count(*) FROM chatflow_messages "
                       f"WHERE session_id IN ({_marks(session_ids)}) GROUP BY session_id", session_ids)
        dense = [sid for sid, span, n in cursor.fetchall() if span <= DENSE * n + 64]
    sparse = [sid for sid in session_ids if sid not in set(dense)]
    parts, args = [], []
    if dense:
        parts.append("SELECT m.id AS mid, m.session_id AS sid FROM (SELECT session_id AS rs, min(id) AS lo, "
                     f"max(id) AS hi FROM chatflow_messages WHERE session_id IN ({_marks(dense)}) GROUP BY session_id)"
                     " AS r CROSS JOIN search_messages s CROSS JOIN chatflow_messages m WHERE "
                     f"{match} AND s.rowid >= r.lo AND s.rowid <= r.hi AND m.id = s.rowid AND m.session_id = r.rs")
        args += [*dense, *params]
    if sparse:
        parts.append("SELECT m.id AS mid, m.session_id AS sid FROM chatflow_messages m CROSS JOIN search_messages s "
                     f"ON s.rowid = m.id WHERE m.session_id IN ({_marks(sparse)}) AND {match}")
        args += [*sparse, *params]
    return " UNION ALL ".join(parts), args


def _ranked(query: SearchQuery, session_ids: list[str], per_session: int) -> list[tuple[int, str, int]]:
    """(message id, session id, matches in that session) of the newest ``per_session`` hits of each session."""
    match, params = _message_match(query)
    if _sqlite():
        inner, args = _sqlite_matched(match.replace("search_messages MATCH", "s.search_messages MATCH"), params,
                                      session_ids)
    else:
        inner = (f"SELECT s.message_id AS mid, s.session_id AS sid FROM search_messages s "
                 f"WHERE s.session_id IN ({_marks(session_ids)}) AND {match}")
        args = [*session_ids, *params]
    sql = (f"SELECT mid, sid, total FROM (SELECT mid, sid, row_number() OVER (PARTITION BY sid ORDER BY mid DESC) "
           f"AS n, count(*) OVER (PARTITION BY sid) AS total FROM ({inner}) AS matched) AS ranked WHERE n <= %s "
           "ORDER BY mid DESC")
    with connection.cursor() as cursor:
        cursor.execute(sql, [*args, per_session])
        return [(int(mid), sid, int(total)) for mid, sid, total in cursor.fetchall()]


def _bodies(ids: list[int]) -> dict[int, str]:
    if not ids:
        return {}
    marks = ", ".join(["%s"] * len(ids))
    sql = (f"SELECT rowid, body FROM search_messages WHERE rowid IN ({marks})" if _sqlite()
           else f"SELECT message_id, body FROM search_messages WHERE message_id IN ({marks})")
    with connection.cursor() as cursor:
        cursor.execute(sql, ids)
        return {int(mid): body or "" for mid, body in cursor.fetchall()}


def _terms_to_mark(query: SearchQuery) -> list[str]:
    return [*query.text, *query.tools]


def _build(query: SearchQuery, ranked: list[tuple[int, str, int]]) -> dict[str, SessionHits]:
    """The hits of ``ranked`` rows with their snippet, turn, agent and time (three queries)."""
    ids = [mid for mid, _sid, _n in ranked]
    sids = list(dict.fromkeys(sid for _mid, sid, _n in ranked))
    rows = {mid: (role, at) for mid, role, at in
            ChatMessage.objects.filter(id__in=ids).values_list("id", "role", "created_at")}
    starts: dict[str, list[int]] = defaultdict(list)
    if ids:
        for sid, rid in (ChatMessage.objects.filter(session_id__in=sids, role=Role.USER.value, id__lte=max(ids))
                         .order_by("id").values_list("session_id", "id")):
            starts[sid].append(rid)
    agents = {(r.session_id, r.first_message_id): r.agents for r in
              TurnRecord.objects.filter(session_id__in=sids, first_message_id__in=[s for v in starts.values()
                                                                                   for s in v])
              .only("session_id", "first_message_id", "agents")}
    active = dict(ChatSession.objects.filter(pk__in=sids).values_list("session_id", "active_agent_name"))
    bodies = _bodies(ids)
    terms = _terms_to_mark(query)
    out: dict[str, SessionHits] = {}
    for mid, sid, total in ranked:
        if mid not in rows:  # deleted since the index was read (another transaction)
            continue
        role, at = rows[mid]
        turn = turn_number(starts[sid], mid)
        trail = agents.get((sid, starts[sid][turn - 1])) if turn else None
        agent = str(trail[-1]) if isinstance(trail, list) and trail else active.get(sid, "")
        group = out.setdefault(sid, SessionHits(sid, total=total))
        group.hits.append(Hit(sid, mid, turn, role, agent, at, snippet(bodies.get(mid, ""), terms)))
    return out


def hits(query: SearchQuery, session_ids: list[str], per_session: int = 3) -> dict[str, SessionHits]:
    """The newest ``per_session`` hits of each of ``session_ids`` (one page of the list), by session id; a session
    that matched by its id or metadata only has a :class:`SessionHits` with no hit and ``session_match``."""
    if not session_ids or not query.searches:
        return {}
    out = _build(query, _ranked(query, session_ids, per_session))
    if query.text:
        for sid in _session_matches(query, [s for s in session_ids if s not in out]):
            out[sid] = SessionHits(sid, session_match=True)
    return out


def _session_matches(query: SearchQuery, session_ids: list[str]) -> list[str]:
    if not session_ids:
        return []
    return list(ChatSession.objects.filter(pk__in=session_ids).filter(_text_condition(query.text))
                .values_list("pk", flat=True))


def find_in_session(query: SearchQuery, session_id: str, limit: int = FIND_LIMIT) -> SessionHits:
    """Every hit of one session (all its pages), newest first, up to ``limit``: *Find in session*."""
    if not query.searches:
        return SessionHits(session_id)
    return _build(query, _ranked(query, [session_id], limit)).get(session_id, SessionHits(session_id))


# --- Snippets ----------------------------------------------------------------------------------------------------
def _folded(text: str) -> tuple[str, list[int]]:
    """``text`` case- and accent-folded, with the index in ``text`` of each folded character."""
    chars: list[str] = []
    where: list[int] = []
    for i, ch in enumerate(text):
        for part in unicodedata.normalize("NFKD", ch):
            if unicodedata.combining(part):
                continue
            for folded in part.casefold():
                chars.append(folded)
                where.append(i)
    return "".join(chars), where


def _spans(text: str, terms: list[str]) -> list[tuple[int, int]]:
    """Where the terms occur in ``text`` (case and accents folded), merged, in order: (start, end) of ``text``."""
    folded, where = _folded(text)
    found: list[tuple[int, int]] = []
    for term in terms:
        needles = [_folded(term)[0]]
        if " " in needles[0] and needles[0] not in folded:  # a phrase across punctuation: mark its words
            needles = needles[0].split()
        for needle in needles:
            start = folded.find(needle) if needle else -1
            while start >= 0 and len(found) < 100:
                end = start + len(needle) - 1
                found.append((where[start], where[end] + 1))
                start = folded.find(needle, start + len(needle))
    found.sort()
    merged: list[tuple[int, int]] = []
    for start, end in found:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def snippet(text: str, terms: list[str], width: int = SNIPPET) -> SafeString:
    """Up to ``width`` characters of ``text`` around the first match of ``terms``, HTML-escaped, each match in
    ``<mark>`` (invariant 9: the text is escaped, only the marks are markup)."""
    text = " ".join(text.split())
    spans = _spans(text, terms)
    start = max(0, spans[0][0] - width // 3) if spans else 0
    end = min(len(text), start + width)
    out = ["…" if start else ""]
    at = start
    for s, e in spans:
        if e <= start or s >= end:
            continue
        s, e = max(s, start), min(e, end)
        out += [escape(text[at:s]), "<mark>", escape(text[s:e]), "</mark>"]
        at = e
    out += [escape(text[at:end]), "…" if end < len(text) else ""]
    return mark_safe("".join(out))  # noqa: S308 - every piece of text above is escaped
