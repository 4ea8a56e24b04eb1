"""The site's turn gate: before a turn reaches the model, the session's mode decides.

Installed on the site's Runner (``sessions_app.runtime.add_runner_hook``) by the app's ``ready()``:

- a session in ``waiting`` or ``human`` mode: the turn is held (the customer's message is stored, no
  model call, no answer) and the session's unread count goes up;
- a session in ``bot`` mode whose customer asks for a person (``CHATFLOW_HUMAN_PHRASES``, whole words,
  any case, any accents): the turn is held with the holding message (``CHATFLOW_HOLDING_MESSAGE``) as its answer, and
  the session starts ``waiting``;
- a session in ``bot`` mode past its daily budget (``takeover_app.budget``): the turn is held, and the session
  starts ``waiting`` (trigger ``budget``, with the holding message) or, with ``CHATFLOW_BUDGET_ACTION=answer``,
  gets ``CHATFLOW_BUDGET_MESSAGE`` as its answer and stays with the bot;
- a hand-back note not yet given to a model: it becomes the turn's one-turn instructions;
- an agent calling the built-in ``request_human`` tool (``Runner.on_human_request``): ``waiting``.

A message with a fixed answer and no model call (one the bot cannot read: an image, a voice message) is
played with :func:`answered_gate` as its turn's gate: held by the same rule while an operator has the
session, otherwise answered with its fixed text (no phrase, note or failure count applies: no model sees it).
A webhook delivery's turn asks these rules through :class:`TakeoverPolicy`, the queue worker's turn policy
(``webhooks_app.policy``), which the app's ``ready()`` installs: the worker never imports this app.

What a turn changes in the mode row travels with the turn: the gate's decision carries it as its commit
hook (``TurnDecision.on_commit``), and so does what ``on_human_request`` returns (``chatflow_agent.core.hooks``),
and the store runs it inside the turn's own commit transaction, so it is stored if and only if the turn is:
a held message is counted unread exactly once, a note is used up only by a turn that committed. A turn
whose session has no mode row, no hand-back note, no failures to forget and no request carries no hook.
The gate reads the mode row on the store's thread for the session (one statement per turn, on the
driver's cursor: a turn pays for the query, not for building it), under the session's turn lock; with a
daily budget set, a second statement reads the session's usage of the day.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from chatflow_agent.core.gate import TurnDecision, TurnGate
from chatflow_agent.core.hooks import CommitHook, TurnCommit
from sessions_app import runtime
from sessions_app.models import ChatSession
from sessions_app.store import driver_cursor
from takeover_app import budget, service
from takeover_app.models import OperatorReply, SessionMode

__all__ = ["HELD_SESSION_SQL", "POLICY", "ModeChange", "TakeoverPolicy", "answered_gate", "asks_for_human", "fold",
           "install", "on_human_request", "turn_gate"]

Mode, Trigger = SessionMode.Mode, SessionMode.Trigger

_SESSIONS = ChatSession._meta.db_table
#: SQL true for a webhook delivery (its row, alias ``c``) whose session waits for or is owned by an operator:
#: its turn will be held, with no model call. The queue worker gives such deliveries a lane of their own. A
#: mode row without its session is a deleted session's (see :func:`_decide`) and holds nothing.
HELD_SESSION_SQL = (f"EXISTS (SELECT 1 FROM {SessionMode._meta.db_table} m WHERE m.session_id = c.session_id "
                    f"AND m.mode IN ('{Mode.WAITING.value}', '{Mode.HUMAN.value}') "
                    f"AND EXISTS (SELECT 1 FROM {_SESSIONS} s WHERE s.session_id = m.session_id))")


@dataclass
class ModeChange:
    """What one turn writes into its session's mode row when it commits; :meth:`apply` is the turn's commit hook.

    ``using``: the database alias of the store that commits the turn."""

    using: str = "default"
    held: bool = False  # the message was held: counted unread
    note: str = ""  # the hand-back note this turn was given (cleared if still the pending one)
    request: tuple[str, str] | None = None  # (trigger, reason): start waiting
    detail: dict[str, str] | None = None  # what fired, for the audit entry: {"phrase": …} or {"tool": …}
    reset_failures: bool = False
    answered: budget.Crossed | None = None  # answered with CHATFLOW_BUDGET_MESSAGE past this budget

    def apply(self, commit: TurnCommit) -> None:
        """Commit hook (inside the turn's commit transaction, before its rows): write the change into
        ``commit.session_id``'s mode row; starting to wait is ``takeover_app.service.start_waiting``. What
        those writes raise refuses the commit."""
        session_id, using = commit.session_id, self.using
        now = timezone.now()
        modes = SessionMode.objects.using(using).filter(pk=session_id)
        if self.held:
            modes.update(unread=F("unread") + 1, customer_last_at=now, updated_at=now)
            return
        if self.note:
            modes.filter(pending_note=self.note).update(pending_note="", updated_at=now)
        if self.reset_failures:
            modes.filter(mode=Mode.BOT).update(failed_turns=0)
        if self.answered is not None:
            budget.note_answered(session_id, self.answered, using)
        if self.request is not None:
            service.start_waiting(session_id, trigger=self.request[0], reason=self.request[1], using=using,
                                  detail=self.detail)


def fold(text: str) -> str:
    """``text`` as phrases are matched: case folded, accents removed (NFKD without combining marks), so
    "Atenção" and "atencao" are one word."""
    return "".join(c for c in unicodedata.normalize("NFKD", text.casefold()) if not unicodedata.combining(c))


@lru_cache(maxsize=8)
def _phrase_pattern(phrases: tuple[str, ...]) -> tuple[re.Pattern[str], dict[str, str]] | None:
    """One alternation of every phrase (folded, any spacing between its words), and folded phrase → phrase."""
    named = {" ".join(fold(p).split()): p.strip() for p in phrases if p.strip()}
    if not named:
        return None
    words = [r"\s+".join(map(re.escape, p.split())) for p in sorted(named, key=len, reverse=True)]
    return re.compile(r"(?<!\w)(?:" + "|".join(words) + r")(?!\w)"), named


def asks_for_human(text: str) -> str:
    """The ``CHATFLOW_HUMAN_PHRASES`` phrase (as configured) that ``text`` contains, or ''.

    Whole words; case, accents and the spacing between words do not matter. Every language's phrases apply
    to every message: a session's language is rarely known (a webhook says nothing of it, customers switch),
    and phrases of several words that ask for a person in one language do not occur by chance in another,
    while a message checked against the wrong language's list only would escalate nothing."""
    compiled = _phrase_pattern(tuple(settings.CHATFLOW_HUMAN_PHRASES))
    if compiled is None or not text:
        return ""
    pattern, named = compiled
    match = pattern.search(fold(text))
    return named.get(" ".join(match.group(0).split()), match.group(0)) if match else ""


@dataclass(frozen=True)
class _ModeRow:
    mode: str
    failed_turns: int
    pending_note: str


_MODE_ROW = (f"SELECT m.mode, m.failed_turns, m.pending_note, "
             f"EXISTS (SELECT 1 FROM {_SESSIONS} s WHERE s.session_id = m.session_id) "
             f"FROM {SessionMode._meta.db_table} m WHERE m.session_id = ?")


def _mode_row(session_id: str) -> _ModeRow | None:
    """The session's mode row. One found while the session has no row is a leftover: mode rows are written for
    a stored session or in the commit that stores it, so its session was deleted by a process that knows only
    the session store's tables (a chatflow-agent 0.3.4 bot on the same SQLite file). It holds nothing of the
    session this turn starts: it and the operators' replies of that id go now, before they can govern it."""
    with driver_cursor() as (cursor, dialect):
        cursor.execute(dialect.render(_MODE_ROW), (session_id,))
        row = cursor.fetchone()
    if row is None:
        return None
    if not row[3]:
        with transaction.atomic():
            SessionMode.objects.filter(pk=session_id).delete()
            OperatorReply.objects.filter(session_id=session_id).delete()
        return None
    return _ModeRow(*row[:3])


def _held(row: _ModeRow | None) -> bool:
    """True when the session waits for or is owned by an operator: its customer's message is held (stored, no
    model call, no answer) and counted unread when the turn commits (``ModeChange(held=True)``)."""
    return row is not None and row.mode in (Mode.WAITING, Mode.HUMAN)


def _decide(session_id: str, text: str, using: str) -> TurnDecision | None:
    row = _mode_row(session_id)
    if _held(row):
        return TurnDecision(hold=True, on_commit=ModeChange(using, held=True).apply)
    change = ModeChange(using, reset_failures=row is not None and row.failed_turns > 0)
    phrase = asks_for_human(text)
    if phrase:
        change.request, change.detail = (Trigger.PHRASE, f"The customer wrote {phrase!r}."), {"phrase": phrase}
        return TurnDecision(hold=True, reply=settings.CHATFLOW_HOLDING_MESSAGE, human_requested=change.request[1],
                            on_commit=change.apply)
    over = budget.crossed(session_id, using)  # no read when no limit is set
    if over is not None:
        return _over_budget(change, over)
    change.note = row.pending_note if row is not None else ""
    if change.note:
        return TurnDecision(instructions=_instructions(change.note), on_commit=change.apply)
    return TurnDecision(on_commit=change.apply) if change.reset_failures else None


def _over_budget(change: ModeChange, over: budget.Crossed) -> TurnDecision:
    """A turn past the session's daily budget: held, with no model call. ``CHATFLOW_BUDGET_ACTION=wait``: the
    holding message, and the session waits (trigger ``budget``); ``answer``: ``CHATFLOW_BUDGET_MESSAGE``."""
    if settings.CHATFLOW_BUDGET_ACTION == "answer":
        change.answered = over
        return TurnDecision(hold=True, reply=settings.CHATFLOW_BUDGET_MESSAGE, on_commit=change.apply)
    change.request, change.detail = (Trigger.BUDGET, over.reason), over.detail
    return TurnDecision(hold=True, reply=settings.CHATFLOW_HOLDING_MESSAGE,
                        human_requested=f"Daily budget reached: {over.reason}", on_commit=change.apply)


def _instructions(note: str) -> str:
    return ("A note from a human operator who answered this customer before you (private: never quote it or "
            f"mention it to the customer):\n{note}")


async def turn_gate(session: Any, text: str) -> TurnDecision | None:
    """The site Runner's ``turn_gate`` (see the module docstring)."""
    store = runtime.site_store()
    return await store.run_blocking(session.session_id, _decide, session.session_id, text, store.using)


def _decide_answered(session_id: str, answer: str, using: str) -> TurnDecision:
    if _held(_mode_row(session_id)):
        return TurnDecision(hold=True, on_commit=ModeChange(using, held=True).apply)
    return TurnDecision(hold=True, reply=answer)  # no model saw it: nothing to write with the turn


def answered_gate(answer: str) -> TurnGate:
    """A turn gate (``Runner.run_async(..., turn_gate=...)``) for a message whose answer is ``answer`` and that
    reaches no model: held like any message while the session waits for or is owned by an operator (stored,
    counted unread, no answer), otherwise stored with ``answer`` as its reply."""
    async def gate(session: Any, text: str) -> TurnDecision:
        sid, store = session.session_id, runtime.site_store()
        return await store.run_blocking(sid, _decide_answered, sid, answer, store.using)

    return gate


def on_human_request(session: Any, reason: str) -> CommitHook:
    """The site Runner's ``on_human_request``: the session starts waiting when the turn commits (the returned
    commit hook, which the turn carries)."""
    return ModeChange(runtime.site_store().using, request=(Trigger.TOOL, reason),
                      detail={"tool": "request_human", "tool_reason": reason}).apply


class TakeoverPolicy:
    """Takeover's rules for a webhook delivery's turn (``webhooks_app.policy.TurnPolicy``), installed by the app's
    ``ready()``: a session that waits for or is owned by an operator is held (:data:`HELD_SESSION_SQL`,
    :func:`answered_gate`), and enough failed turns in a row make it wait (``service.note_failed_turn``)."""

    held_session_sql = HELD_SESSION_SQL

    def answered_gate(self, answer: str) -> TurnGate:
        """:func:`answered_gate`."""
        return answered_gate(answer)

    def note_failed_turn(self, session_id: str) -> bool:
        """``takeover_app.service.note_failed_turn``."""
        return service.note_failed_turn(session_id)


#: The policy the app installs (``webhooks_app.policy.install``).
POLICY = TakeoverPolicy()


def install(runner: Any) -> None:
    """Runner hook: this gate, the request_human hook and the holding message on the site's Runner."""
    runner.turn_gate = turn_gate
    runner.on_human_request = on_human_request
    runner.human_request_reply = settings.CHATFLOW_HOLDING_MESSAGE
