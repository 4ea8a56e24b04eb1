"""Transcript export: one session as JSON (turn-grouped), JSONL, Markdown or CSV, and every matching session as JSONL.

Rows are read in keyset batches of ``BATCH`` ids and parsed with the runtime's ``parse_row``; turns are
grouped, tool calls paired with their results and handoffs found by the console's own functions
(``sessions_app.timeline``), so an export says what the console shows; each turn's agents also
follow the agents operators set between turns (forced handoffs and rollbacks, from the audit log).
Streamed formats hold one turn (md) or one batch of rows (jsonl, csv) at a time; the bulk export one
batch of sessions.

What users and models wrote never becomes Markdown markup or HTML (:func:`md_text`); a redacted
export masks contacts everywhere, the session id and the download's file name included (:func:`shown_id`).

Every byte written is valid UTF-8: text is cleaned where it is read (``parse_row``, ``json_safe``) and
what is written goes through :func:`utf8` once more (lone surrogates → U+FFFD, NUL removed), so no stored
value can make an export fail half way. Datetimes are ISO-8601 with their offset (UTC).

JSON shape (``FORMAT_VERSION`` 1; ``manage.py chatflow_import_transcript`` reads it back)::

    {"format": "chatflow-transcript", "version": 1,
     "session": {session_id, active_agent, metadata, created_at, updated_at, message_count, turn_count},
     "preamble": [message, …],             # rows before the first USER message (usually SYSTEM)
     "turns": [{"number", "agent", "agents", "started_at", "ended_at", "messages": [message, …],
                "tool_calls": [{id, name, args, result: {content, is_error} | null, handoff | null}],
                "handoffs": [{from, to, reason}], "orphan_results": [tool result, …],
                "usage": {status, tokens, cost, model_calls, tool_calls, …} | null}],
     "usage": {turns, input_tokens, output_tokens, total_tokens, cost, cost_known, …} | null}

``usage`` (per turn: ``turns_app.usage.usage_block``; per session: ``session_usage``) is what the turn
records say; null for turns played before records were kept. The other formats carry it too: JSONL as
``usage`` on the first line of each turn (its USER message; the other lines unchanged), CSV as ``turn_*``
columns on each of the turn's rows, Markdown as a usage line under each turn's heading and the session's
totals in its facts.

A message is ``chatflow_agent.types.Message`` as JSON (role, content, tool_calls, tool_results,
timestamp, and ``author`` on a MODEL message an operator wrote during a takeover); a row that cannot be
read at all is ``{"role", "content", "unreadable": true}``. The operator view of the JSON transcript adds
``"operator_view"`` (:func:`operator_view`: mode, owner, the private hand-back note, reply deliveries);
the customer-facing transcript never holds the private note.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Any
from urllib.parse import quote

from chatflow_agent.core.backend import StoredRow, parse_row
from chatflow_agent.core.memory import turn_number
from chatflow_agent.jsonsafe import clean_text, json_safe
from chatflow_agent.types import Message, Role
from console_app import listing
from sessions_app import registry
from sessions_app.models import ChatMessage, ChatSession
from sessions_app.timeline import (
    agent_actions,
    agent_changes,
    agents_by_turn,
    handoff_of,
    label_items,
    message_agents,
    row_turns,
    turn_bounds,
    turn_items,
)
from takeover_app.models import OperatorReply, SessionMode
from turns_app.models import SessionTotals
from turns_app.templatetags.turns import cost_spent, duration, tokens, tokens_spent, usd
from turns_app.usage import (
    session_usage,
    totals_for,
    totals_of,
    usage_by_first_message,
    usage_by_first_message_for,
)

__all__ = [
    "BATCH", "FORMATS", "FORMAT_VERSION", "STABLE_SORTS", "bulk_jsonl", "content_disposition", "md_text",
    "operator_view", "redact", "session_record",
    "shown_id", "transcript", "transcript_csv", "transcript_jsonl", "transcript_md", "turn_agents", "utf8",
]

FORMAT_VERSION = 1
BATCH = 2000  # message rows per query
SESSION_BATCH = 200  # sessions per query in the bulk export
TURN_BATCH = 500  # turns whose records are read per query by the streamed formats
CHUNK = 64 * 1024  # bytes per streamed chunk
#: format → (content type, file extension)
FORMATS = {
    "json": ("application/json; charset=utf-8", "json"),
    "jsonl": ("application/x-ndjson; charset=utf-8", "jsonl"),
    "md": ("text/markdown; charset=utf-8", "md"),
    "csv": ("text/csv; charset=utf-8", "csv"),
}
_ROW = ("id", "role", "content", "message_json")


# ---- text -----------------------------------------------------------------------------------
def utf8(text: str) -> bytes:
    """``text`` as UTF-8; lone surrogates become U+FFFD and NUL is dropped instead of failing."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return clean_text(text).encode("utf-8")


def dumps(value: Any, indent: int | None = None) -> str:
    """JSON with real UTF-8 characters (not \\u escapes); anything not JSON-native through json_safe."""
    separators = (",", ": ") if indent else (",", ":")
    try:
        return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators)
    except (TypeError, ValueError):
        return json.dumps(json_safe(value), ensure_ascii=False, indent=indent, separators=separators)


_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}")
_PHONE = re.compile(r"(?<![\w+])\+?\(?\d[\d \t().\-]{5,}\d(?!\w)")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _mask_phone(match: re.Match[str]) -> str:
    text = match.group(0)
    digits = sum(c.isdigit() for c in text)
    # International form (+ and 7+ digits) or 9+ digits; dates (2026-01-10 09:00) and amounts are kept.
    if _DATE.search(text) or not (digits >= 9 or (text.startswith("+") and digits >= 7)):
        return text
    return "[phone]"


def redact(value: Any) -> Any:
    """``value`` with e-mail addresses → ``[email]`` and phone numbers → ``[phone]`` in every string (keys kept)."""
    if isinstance(value, str):
        return _PHONE.sub(_mask_phone, _EMAIL.sub("[email]", value))
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


def shown_id(session_id: str, redacted: bool) -> str:
    """The session id as an export writes it: a redacted export masks the contact in it (``+1555…`` →
    ``[phone]``) in its content and its file name alike."""
    return redact(session_id) if redacted else session_id


def content_disposition(session_id: str, ext: str, stem: str = "transcript", *, redacted: bool = False) -> str:
    """``attachment`` with an ASCII ``filename`` and the exact name as RFC 5987 ``filename*``, for any id
    (``redacted``: named by :func:`shown_id`)."""
    name = re.sub(r"[\x00-\x1f\x7f/\\]", "_", clean_text(shown_id(session_id, redacted)))[:120]
    ascii_name = re.sub(r"[^A-Za-z0-9._+\-]", "_", name).strip("._") or "session"
    full = f"{stem}-{name}.{ext}"
    return f'attachment; filename="{stem}-{ascii_name}.{ext}"; filename*=UTF-8\'\'{quote(full, safe="")}'


# ---- reading --------------------------------------------------------------------------------
Row = tuple[int, str, str | None, str]


def iter_rows(session_id: str, batch: int = BATCH) -> Iterator[Row]:
    """The session's message rows in id order, ``batch`` rows per query (keyset on id)."""
    last = 0
    while True:
        rows = list(ChatMessage.objects.filter(session_id=session_id, id__gt=last)
                    .order_by("id").values_list(*_ROW)[:batch])
        yield from rows
        if len(rows) < batch:
            return
        last = rows[-1][0]


@dataclass
class Segment:
    """Turn ``number`` (0: the rows before the first USER message) with its rows parsed."""

    number: int
    parsed: list[tuple[Row, Message | None]] = field(default_factory=list)

    def triples(self) -> list[tuple[int, Message | None, str]]:
        return [(row[0], msg, row[2] or "") for row, msg in self.parsed]

    def items(self, trail: list[str] | None = None):
        """The turn's items (``sessions_app.timeline.turn_items``), labelled with the agents of ``trail``
        when given (``label_items``, the page's rule)."""
        items = turn_items(self.triples())
        if trail is not None:
            label_items(items, trail)
        return items

    def agents(self, trail: list[str]) -> dict[int, str | None]:
        """Each row's agent (``sessions_app.timeline.message_agents``: the rule the page labels with)."""
        return message_agents(self.triples(), trail)


def parse(row: Row, started: datetime) -> Message | None:
    """``parse_row``; a message rebuilt from the role/content columns (its JSON unreadable) is dated by the
    row's ``created_at`` rather than by the time of reading, so exporting it twice gives the same output."""
    msg = parse_row(StoredRow(*row))
    if msg is not None and msg.timestamp >= started:  # rare: one query for such a row only
        created = ChatMessage.objects.filter(id=row[0]).values_list("created_at", flat=True).first()
        if created is not None:
            msg = msg.model_copy(update={"timestamp": created.astimezone(UTC)})
    return msg


def segments(rows: Iterable[Row]) -> Iterator[Segment]:
    """Rows grouped into turns as the console numbers them (``sessions_app.timeline.row_turns``), one at a time."""
    started = datetime.now(UTC)
    for number, chunk in row_turns(rows):
        yield Segment(number, [(row, parse(row, started)) for row in chunk])


def with_usage(session_id: str, segs: Iterable[Segment]) -> Iterator[tuple[Segment, dict[str, Any] | None]]:
    """Each segment with its turn's ``usage`` block (None for turn 0 and turns without a record); the records
    are read ``TURN_BATCH`` turns at a time, so a streamed export holds at most that many turns."""
    it = iter(segs)
    while chunk := list(islice(it, TURN_BATCH)):
        firsts = [seg.parsed[0][0][0] for seg in chunk if seg.number and seg.parsed]
        usage = usage_by_first_message(session_id, firsts) if firsts else {}
        for seg in chunk:
            yield seg, usage.get(seg.parsed[0][0][0]) if seg.number and seg.parsed else None


def message_record(row: Row, msg: Message | None) -> dict[str, Any]:
    if msg is None:
        return {"role": row[1], "content": row[2], "unreadable": True}
    record = msg.model_dump(mode="json")
    record["timestamp"] = msg.timestamp.isoformat()
    return record


def session_record(session: ChatSession, message_count: int, turn_count: int) -> dict[str, Any]:
    return {
        "session_id": session.session_id,
        "active_agent": session.active_agent_name,
        "metadata": json_safe(session.metadata if isinstance(session.metadata, dict) else {}),
        "created_at": session.created_at.isoformat(),
        "updated_at": session.updated_at.isoformat(),
        "message_count": message_count,
        "turn_count": turn_count,
    }


def _starting_agent() -> str:
    return registry.starting_agent().name


def _turn_record(seg: Segment, items: list, agents: list[str],
                 usage: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    stamps = [msg.timestamp.isoformat() for _row, msg in seg.parsed if msg is not None]
    calls = [{
        "id": i.call.id, "name": i.call.name, "args": i.call.args,
        "result": None if i.result is None else {"content": i.result.content, "is_error": i.result.is_error},
        "handoff": i.handoff,
    } for i in items if i.kind == "call"]
    return {
        "number": seg.number,
        "agent": agents[-1],
        "agents": agents,
        "started_at": stamps[0] if stamps else None,
        "ended_at": stamps[-1] if stamps else None,
        "messages": [message_record(row, msg) for row, msg in seg.parsed],
        "tool_calls": calls,
        "handoffs": [i.handoff for i in items if i.handoff],
        "orphan_results": [i.result.model_dump(mode="json") for i in items if i.kind == "orphan-result"],
        "usage": (usage or {}).get(seg.parsed[0][0][0]) if seg.parsed else None,
    }


def _agents(session: ChatSession, handoffs: list[list[dict]], bounds: list[tuple[int, datetime]],
            entries: list | None = None, starting_agent: str | None = None) -> list[list[str]]:
    """Each turn's agents: the handoffs in its messages plus the agents operators set between turns
    (``entries``: the session's :func:`~sessions_app.timeline.agent_actions`, read when None)."""
    if entries is None:
        entries = agent_actions([session.session_id])[session.session_id]
    changes = agent_changes(entries, bounds, session.created_at)
    if (changes or any(handoffs)) and starting_agent is None:
        starting_agent = _starting_agent()
    return agents_by_turn(handoffs, session.active_agent_name, starting_agent or session.active_agent_name, changes)


def transcript(session: ChatSession, rows: Iterable[Row] | None = None, *, redacted: bool = False,
               starting_agent: str | None = None, bounds: list[tuple[int, datetime]] | None = None,
               entries: list | None = None,
               records: tuple[dict[int, dict[str, Any]], SessionTotals | None] | None = None) -> dict[str, Any]:
    """The whole turn-grouped transcript (the JSON format) of ``session``, built in memory.

    ``rows``, ``bounds`` (``turn_bounds``), ``entries`` (``agent_actions``) and ``records`` (the turns'
    ``usage`` blocks by first message id, as ``usage_by_first_message``, and the session's totals row)
    are read when not given.
    """
    segs = list(segments(iter_rows(session.session_id) if rows is None else rows))
    preamble = segs[0] if segs and segs[0].number == 0 else Segment(0)
    turns = [s for s in segs if s.number]
    items = [t.items() for t in turns]
    handoffs = [[i.handoff for i in its if i.handoff] for its in items]
    bounds = turn_bounds(session.session_id) if bounds is None else bounds
    agents = _agents(session, handoffs, bounds, entries, starting_agent)
    for its, trail in zip(items, agents, strict=True):
        label_items(its, trail)  # (a handoff 0.3.4 stored without its "from" gets its caller, as on the page)
    usage, totals = records or (usage_by_first_message(session.session_id), totals_of(session.session_id))
    out = {
        "format": "chatflow-transcript",
        "version": FORMAT_VERSION,
        "session": session_record(session, sum(len(s.parsed) for s in segs), len(turns)),
        "preamble": [message_record(row, msg) for row, msg in preamble.parsed],
        "turns": [_turn_record(t, its, a, usage) for t, its, a in zip(turns, items, agents, strict=True)],
        "usage": session_usage(totals),
    }
    # A redacted transcript says so: it is a report, not a backup (its contacts, perhaps its id, are masked).
    return {**redact(out), "redacted": True} if redacted else out


def operator_view(session_id: str) -> dict[str, Any]:
    """What only operators see of a session's takeover (the transcript's ``operator_view``)::

        {"mode": "bot" | "waiting" | "human", "owner": str | None, "waiting_since": iso | None,
         "private_note": str,            # the latest hand-back note for the agent (never shown to the customer)
         "replies": [{"message_id", "author", "status", "error", "attempts", "created_at", "sent_at"}]}

    ``replies`` are the operator-written messages' deliveries (``status``: sending, sent, failed, unknown,
    in_transcript).
    """
    row = SessionMode.objects.filter(pk=session_id).first()

    def iso(moment: datetime | None) -> str | None:
        return moment.isoformat() if moment is not None else None

    return {
        "mode": row.mode if row else SessionMode.Mode.BOT.value,
        "owner": row.owner_username or None if row and row.mode == SessionMode.Mode.HUMAN else None,
        "waiting_since": iso(row.waiting_since) if row and row.mode != SessionMode.Mode.BOT else None,
        "private_note": row.last_note if row else "",
        "replies": [{"message_id": r.message_row_id, "author": r.author_username, "status": r.shown_status,
                     "error": r.error, "attempts": r.attempts, "created_at": iso(r.created_at),
                     "sent_at": iso(r.sent_at)}
                    for r in OperatorReply.objects.filter(session_id=session_id).order_by("id")],
    }


def turn_agents(session: ChatSession) -> list[list[str]]:
    """Each turn's agents (the ``agents`` of the JSON format: the one active when it started, then each
    handoff's target), from one narrow query for the handoff results and one for the audit log."""
    bounds = turn_bounds(session.session_id)
    starts = [rid for rid, _at in bounds]
    handoffs: list[list[dict]] = [[] for _ in starts]
    rows = (ChatMessage.objects.filter(session_id=session.session_id, role=Role.TOOL.value,
                                       message_json__contains="HANDOFF_SUCCESS")
            .order_by("id").values_list(*_ROW))
    for row in rows:
        msg = parse_row(StoredRow(*row))
        n = turn_number(starts, row[0])
        if msg is None or n == 0:
            continue
        handoffs[n - 1].extend(h for r in msg.tool_results or [] if (h := handoff_of(r)))
    return _agents(session, handoffs, bounds)


def _chunked(parts: Iterable[str]) -> Iterator[bytes]:
    """Strings joined into UTF-8 chunks of about ``CHUNK`` bytes."""
    buf: list[bytes] = []
    size = 0
    for part in parts:
        data = utf8(part)
        buf.append(data)
        size += len(data)
        if size >= CHUNK:
            yield b"".join(buf)
            buf, size = [], 0
    if buf:
        yield b"".join(buf)


# ---- writers --------------------------------------------------------------------------------
def transcript_jsonl(session: ChatSession, *, redacted: bool = False) -> Iterator[bytes]:
    """One JSON object per message: session_id, turn (0 before the first), seq, agent (the agent active when
    it was written, as the session page labels it: ``Segment.agents``; null before the first turn), then the
    message; the first line of each turn (its USER message) also has ``usage``: the turn's usage block
    (``turns_app.usage.usage_block``), null for a turn played before records were kept."""
    agents = turn_agents(session)

    def lines() -> Iterator[str]:
        seq = 0
        for seg, usage in with_usage(session.session_id, segments(iter_rows(session.session_id))):
            by_row = seg.agents(agents[seg.number - 1]) if seg.number else {}
            for row, msg in seg.parsed:
                seq += 1
                record = {"session_id": session.session_id, "turn": seg.number, "seq": seq,
                          "agent": by_row.get(row[0]), **message_record(row, msg)}
                if seg.number and row is seg.parsed[0][0]:
                    record["usage"] = usage
                yield dumps(redact(record) if redacted else record) + "\n"

    return _chunked(lines())


#: ``author``: the operator who wrote a MODEL message instead of the model (human takeover), else empty.
#: ``turn_*``: the turn's record (status, tokens, cost in US dollars: empty when unknown or before records were
#: kept), repeated on each of its rows.
CSV_COLUMNS = ["session_id", "turn", "seq", "role", "agent", "timestamp", "content", "tool_calls", "tool_results",
               "author", "turn_status", "turn_input_tokens", "turn_output_tokens", "turn_total_tokens", "turn_cost"]


def _csv_usage(block: dict[str, Any] | None) -> list[Any]:
    """The ``turn_*`` cells of a turn with usage block ``block`` (all empty for None)."""
    if block is None:
        return [""] * 5
    fields = ("status", "input_tokens", "output_tokens", "total_tokens", "cost")
    return ["" if block[f] is None else block[f] for f in fields]


def _cell(value: Any) -> Any:
    """Text a spreadsheet would run as a formula (=, +, -, @, tab, CR first) is prefixed with an apostrophe."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def transcript_csv(session: ChatSession, *, redacted: bool = False) -> Iterator[bytes]:
    """One row per message (UTF-8 with a BOM, for spreadsheets); ``agent`` as in :func:`transcript_jsonl`; tool
    calls and results as JSON cells; the turn's record in the ``turn_*`` columns of each of its rows."""
    agents = turn_agents(session)
    sid = shown_id(session.session_id, redacted)

    def lines() -> Iterator[str]:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\r\n")
        writer.writerow(CSV_COLUMNS)
        yield "\ufeff" + buf.getvalue()
        seq = 0
        for seg, usage in with_usage(session.session_id, segments(iter_rows(session.session_id))):
            by_row = seg.agents(agents[seg.number - 1]) if seg.number else {}
            turn_cells = _csv_usage(usage)
            buf.seek(0)
            buf.truncate()
            for row, msg in seg.parsed:
                seq += 1
                rec = message_record(row, msg)
                if redacted:
                    rec = redact(rec)
                writer.writerow([_cell(v) for v in (
                    sid, seg.number, seq, rec["role"], by_row.get(row[0]) or "", rec.get("timestamp", ""),
                    rec.get("content") or "",
                    dumps(rec["tool_calls"]) if rec.get("tool_calls") else "",
                    dumps(rec["tool_results"]) if rec.get("tool_results") else "",
                    rec.get("author") or "", *turn_cells,
                )])
            yield buf.getvalue()

    return _chunked(lines())


#: The sorts a bulk export keeps: on what never changes, so a keyset batch cannot pass over a session.
STABLE_SORTS = frozenset({"created", "-created", "session", "-session"})


def bulk_jsonl(query: listing.ListQuery, *, redacted: bool = False, batch: int | None = None) -> Iterator[bytes]:
    """Every session matching ``query`` (the console's filters) as one JSON transcript per line, each once.

    Sessions come in keyset batches of ``batch`` (default ``SESSION_BATCH``, read at call time) and
    their rows, audit entries, turn records and totals in one query each per batch, so memory holds one
    batch, whatever the number of sessions. The batches follow ``query.sort`` when it is one of
    :data:`STABLE_SORTS`, else oldest session first: a session whose turn moves it up an order on what
    changes (last update, tokens, cost, agent) while the export runs would otherwise be left out.
    """
    if query.sort not in STABLE_SORTS:
        query = dataclasses.replace(query, sort="created")
    column = listing.SORTS[query.sort][0]
    size = batch or SESSION_BATCH

    def lines() -> Iterator[str]:
        cursor, start = None, None
        while True:
            page = list(listing.after_cursor(listing.filtered(query), query.sort, cursor)[:size])
            if not page:
                return
            rows: dict[str, list[Row]] = {s.session_id: [] for s in page}
            bounds: dict[str, list[tuple[int, datetime]]] = {sid: [] for sid in rows}
            entries = agent_actions(list(rows))
            usage, totals = usage_by_first_message_for(list(rows)), totals_for(list(rows))
            for sid, *row, created in (ChatMessage.objects.filter(session_id__in=list(rows))
                                       .order_by("session_id", "id")
                                       .values_list("session_id", *_ROW, "created_at").iterator(chunk_size=BATCH)):
                rows[sid].append(tuple(row))
                if row[1] == Role.USER.value:
                    bounds[sid].append((row[0], created))
            for s in page:
                mine = rows.pop(s.session_id)
                if start is None and (entries[s.session_id] or any(
                        r[1] == Role.TOOL.value and "HANDOFF_SUCCESS" in r[3] for r in mine)):
                    start = _starting_agent()
                records = (usage.get(s.session_id, {}), totals.get(s.session_id))
                yield dumps(transcript(s, mine, redacted=redacted, starting_agent=start, bounds=bounds[s.session_id],
                                       entries=entries[s.session_id], records=records)) + "\n"
            cursor = (getattr(page[-1], column), page[-1].session_id)

    return _chunked(lines())


# ---- Markdown -------------------------------------------------------------------------------
def _fence(text: str, lang: str = "") -> str:
    """``text`` in a code fence longer than any backtick run inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}\n"


def _line(text: str) -> str:
    """Text fit for a heading or list item: one line."""
    return " ".join(str(text).split())


_MD_INLINE = re.compile(r"[\\`*_\[\]]")  # escapes, code spans, emphasis, links and images
# What opens a block at a line's start: a heading (# or a setext = underline), a list item (-, +, 1. or 1)),
# a ~~~ fence.
_MD_BLOCK = re.compile(r"^( {0,3}(?:\d{1,9}(?=[.)]))?)([#=+\-~.)])", re.MULTILINE)


def md_text(text: str) -> str:
    """``text`` (written by a user, a model or an operator) as Markdown that renders as that very text.

    ``&``, ``<`` and ``>`` become entities, so no renderer makes HTML (or an autolink) of it, with raw HTML
    enabled or not; Markdown's inline syntax (``\\``, backticks, ``*``, ``_``, ``[``, ``]``: code spans,
    emphasis, links, images) and what would open a block at a line's start (``#``, ``=``, ``+``, ``-``,
    ``~``, ``1.``) are backslash-escaped. CR and CRLF become LF, so a quote's prefix starts every line a renderer sees.
    A line followed by another inside a paragraph ends with a backslash, CommonMark's hard line break: a
    renderer would otherwise join the lines of a message into one (a blank line still parts paragraphs).
    """
    text = str(text).replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_BLOCK.sub(r"\1\\\2", _MD_INLINE.sub(r"\\\g<0>", text))
    lines = text.split("\n")
    for i in range(len(lines) - 1):
        if lines[i].strip() and lines[i + 1].strip():
            lines[i] += "\\"
    return "\n".join(lines)


def _code(text: str) -> str:
    """``text`` on one line as an inline code span whose backtick run is longer than any inside it
    (renderers show a code span's content as it is, HTML included)."""
    text = _line(text)
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    return f"{ticks} {text} {ticks}"


def _quote(text: str) -> str:
    return "\n".join("> " + line if line else ">" for line in md_text(text or "").split("\n")) + "\n"


def _md_items(seg: Segment, trail: list[str]) -> Iterator[str]:
    stamps = {row[0]: msg.timestamp.isoformat() for row, msg in seg.parsed if msg is not None}
    for item in seg.items(trail):
        agent = item.agent or trail[0]
        at = stamps.get(item.row_id, "")
        if item.kind == "user":
            yield f"**User** · {at}\n\n{_quote(item.text or '')}\n"
        elif item.kind == "system":
            yield f"**System** · {at}\n\n{_quote(item.text or '')}\n"
        elif item.kind == "model" and item.author:
            yield f"**Operator · {md_text(_line(item.author))}** · {at}\n\n{md_text(item.text or '')}\n\n"
        elif item.kind == "model":
            yield f"**{md_text(_line(agent)) or 'Agent'}** · {at}\n\n{md_text(item.text or '')}\n\n"
        elif item.kind == "call":
            yield f"**Tool call** {_code(item.call.name)} (id {_code(item.call.id)}) · {at}\n\n"
            yield _fence(dumps(item.call.args, indent=2), "json") + "\n"
            if item.handoff:
                h = item.handoff
                yield (f"**Handoff** {md_text(_line(h['from'] or agent))} → {md_text(_line(h['to']))}: "
                       f"{md_text(_line(h['reason']))}\n\n")
            elif item.result is None:
                yield "_No result was stored for this call._\n\n"
            else:
                label = "Error" if item.result.is_error else "Result"
                yield f"{label}:\n\n" + _fence(dumps(item.result.content, indent=2), "json") + "\n"
        elif item.kind == "orphan-result":
            yield f"**Tool result without its call** {_code(item.result.name)}\n\n"
            yield _fence(dumps(item.result.content, indent=2), "json") + "\n"
        else:
            yield f"**Unreadable message** · row {item.row_id} (its text as a JSON string)\n\n"
            yield _fence(dumps(item.text or ""), "json") + "\n"


def _md_usage(block: dict[str, Any]) -> str:
    """A turn's usage line: status, duration, tokens (in, out, cached; "tokens unknown" when not reported),
    cost ("unknown" likewise), model calls."""
    cached = f", {tokens(block['cached_tokens'])} cached" if block["cached_tokens"] else ""
    spent = tokens_spent(block["total_tokens"])
    if block["total_tokens"] is not None:
        spent += f" ({tokens(block['input_tokens'])} in, {tokens(block['output_tokens'])} out{cached})"
    calls = len(block["model_calls"] or [])
    return (f"Usage: {block['status']} · {duration(block['duration_ms'])} · {spent} · {usd(block['cost'])}"
            + (f" · {calls} model call{'s' if calls != 1 else ''}" if calls else "") + "\n\n")


def _md_totals(totals: dict[str, Any] | None) -> str:
    """The facts list's usage item (empty before the session's first recorded turn)."""
    if totals is None:
        return ""
    spent = tokens_spent(totals["total_tokens"], totals["tokens_known"])
    if totals["total_tokens"] is not None:
        spent += f" ({tokens(totals['input_tokens'])} in, {tokens(totals['output_tokens'])} out)"
    cost = cost_spent(totals["cost"], totals["cost_known"])
    if not totals["cost_known"] and cost.startswith("at least"):
        cost += " (some prices unknown)"
    return f"- Usage: {spent} · {cost} · {totals['turns']} recorded turn{'s' if totals['turns'] != 1 else ''}\n"


def transcript_md(session: ChatSession, *, redacted: bool = False) -> Iterator[bytes]:
    """A transcript for people: the session's facts (usage totals included), then a heading per turn with
    its usage line; tool calls as fenced JSON."""
    agents = turn_agents(session)
    totals = session_usage(totals_of(session.session_id))
    metadata = session.metadata if isinstance(session.metadata, dict) else {}

    def parts() -> Iterator[str]:
        yield f"# Transcript: {md_text(_line(shown_id(session.session_id, redacted)))}\n\n"
        yield f"- Active agent: {md_text(_line(session.active_agent_name))}\n"
        yield f"- Created: {session.created_at.isoformat()}\n- Updated: {session.updated_at.isoformat()}\n"
        yield f"- Turns: {len(agents)}\n" + _md_totals(totals) + "\n"
        if metadata:
            yield "Metadata:\n\n" + _fence(dumps(redact(metadata) if redacted else metadata, indent=2), "json") + "\n"
        for seg, usage in with_usage(session.session_id, segments(iter_rows(session.session_id))):
            if redacted:
                seg = Segment(seg.number, [(row[:2] + (redact(row[2]),) + row[3:], _redact_message(msg))
                                           for row, msg in seg.parsed])
            if seg.number == 0:
                yield "## Before the first turn\n\n"
                trail = [session.active_agent_name]
            else:
                trail = agents[seg.number - 1]
                first = next((m.timestamp.isoformat() for _r, m in seg.parsed if m is not None), "")
                via = f" (from {' → '.join(md_text(_line(a)) for a in trail[:-1])})" if len(trail) > 1 else ""
                yield f"## Turn {seg.number} · {md_text(_line(trail[-1]))}{via} · {first}\n\n"
                if usage is not None:
                    yield _md_usage(usage)
            yield from _md_items(seg, trail)

    return _chunked(parts())


def _redact_message(msg: Message | None) -> Message | None:
    if msg is None:
        return None
    return Message.model_validate(redact(msg.model_dump(mode="json")))
