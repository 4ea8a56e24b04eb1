"""Nothing held is forgotten: at hand-back, the customer messages held since the last reply are answered by the
bot in one turn, marked answered, or flagged in the session list (issue 39, item 3).

:func:`hand_back` is the hand-back with that choice (``takeover_app.service.hand_back`` records it, audited,
under the session's turn lock). With ``"bot_answers"`` the held messages are played as one turn of the site's
Runner on the site's store, like every turn (the turn gate, the hand-back note, run events, the turn record):
its USER message holds them all in order, one per line, as a burst of the customer's lines would be, and its
one answer is the one reply. That turn *replaces* the held turns (each a USER row with no answer): its gate
(:class:`HeldGate`, run before the site's own) drops them from the session inside the turn
(``SessionContext.arollback_to``), so its commit removes their rows and writes the joined USER message and the
answer in one transaction, and marks their turn records ``rolled_back`` as a console rollback does
(``turns_app.usage.mark_rolled_back``; their webhook deliveries stay ``held`` in the ledger, as a rollback
leaves them). The customer's words are stored, and seen by the model, once. A turn that fails (the model
call, the commit, a crash) leaves the held rows exactly as they were (invariant 3); a session whose trailing
messages are no longer the held ones (a message arrived meanwhile and was answered) is refused the same way.
The reply goes out the way an operator's does (``takeover_app.service.deliver``): its ``OperatorReply`` row
(``sending``) is written by the turn's commit hook, inside the turn's commit, so a reply row exists if and only
if the turn is stored; it is sent once after the commit, and a sender that dies leaves it ``sending`` (shown
unknown), never sent again by itself. A channel without a send API (the live chat, a generic webhook) has the
answer in the transcript only, as for any reply there.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from django.db.models import Exists, OuterRef
from django.utils import timezone

from chatflow_agent.core.gate import TurnDecision
from chatflow_agent.core.hooks import TurnCommit, TurnHooks
from chatflow_agent.types import Role
from sessions_app import runtime
from takeover_app import service
from takeover_app.models import OperatorReply, SessionMode
from turns_app.usage import mark_rolled_back

__all__ = ["BotAnswer", "HandBack", "HeldChanged", "HeldGate", "hand_back", "unanswered_flag"]

logger = logging.getLogger("takeover_app")


@dataclass(frozen=True)
class HandBack:
    """A hand-back's outcome: the mode row, the held messages (row id, text), the bot's reply to them (None when
    none was played or answered), whether their turn was stored (``replaced``: their rows are gone, replaced by
    it) and, when it failed, why (``error``; they are then flagged)."""

    row: SessionMode
    held: list[tuple[int, str]]
    reply: OperatorReply | None = None
    error: str = ""
    replaced: bool = False


class HeldChanged(Exception):
    """The session's last messages are no longer the held ones the hand-back listed: nothing is replaced."""


class HeldGate:
    """The held messages' turn gate: inside the turn, before its USER message is appended, check that the
    session ends with the held USER rows (``held_ids``, oldest first) and drop them from it (the turn's commit
    removes their rows); then the site Runner's own gate decides the turn as for any message (the hand-back
    note, a request for a person). :class:`HeldChanged` (the turn fails, nothing is written) otherwise."""

    def __init__(self, held_ids: list[int], inner: Any) -> None:
        self.held_ids, self.inner = list(held_ids), inner

    async def __call__(self, session: Any, text: str) -> TurnDecision | None:
        history = session.history
        start = len(history) - len(self.held_ids)
        row_id = runtime.site_store().message_row_id
        tail = history[max(start, 0):]
        if start < 0 or [m.role for m in tail] != [Role.USER] * len(tail) or [
                row_id(session, m) for m in tail] != self.held_ids:
            raise HeldChanged("The session changed since the hand-back: its last messages are not the held ones.")
        await session.arollback_to(start)
        if self.inner is None:
            return None
        decision = self.inner(session, text)
        return await decision if inspect.isawaitable(decision) else decision


class BotAnswer:
    """The held messages' turn: its commit hook records the reply to send (:attr:`reply`, None until a commit
    with an answer) and marks the replaced held turns' records ``rolled_back``."""

    def __init__(self, session_id: str, provider: str, using: str, held_ids: list[int] | None = None) -> None:
        self.session_id, self.provider, self.using = session_id, provider, using
        self.held_ids = list(held_ids or [])
        self.reply: OperatorReply | None = None

    def record(self, commit: TurnCommit) -> None:
        """Commit hook: the replaced held turns' records marked ``rolled_back`` (as a console rollback marks the
        turns it removes) and the ``sending`` reply row of the turn's answer (none for a held turn: the session
        went back to waiting, say a held message asked for a person and the holding message was the answer
        sent)."""
        if self.held_ids:
            mark_rolled_back(commit.session_id, self.held_ids)
        response = commit.report.response if commit.report is not None else None
        if response is None or not response.content:
            return
        self.reply = OperatorReply.objects.using(self.using).create(
            session_id=commit.session_id, text=response.content, author_username="", provider=self.provider,
            status=OperatorReply.Status.SENDING, attempts=1, attempted_at=timezone.now())


def hand_back(user: Any, session_id: str, *, agent_name: str | None = None, note: str = "",
              held: str | None = None) -> HandBack:
    """``takeover_app.service.hand_back`` with the held messages' fate (its errors); with ``held="bot_answers"``
    and messages held, their one turn is played and its reply sent (once). A turn that fails flags the messages
    unanswered in the session list (``held_unanswered``) and says why in ``error``: the session is back with
    the bot whatever the turn did."""
    row = service.hand_back(user, session_id, agent_name=agent_name, note=note, held=held)
    waiting: list[tuple[int, str]] = row.held  # type: ignore[attr-defined]
    if held != "bot_answers" or not waiting:
        return HandBack(row, waiting)
    arrived = service.arrival(session_id)
    ids = [pk for pk, _ in waiting]
    answer = BotAnswer(session_id, arrived.provider if arrived is not None else "", runtime.site_store().using, ids)
    text = "\n".join(content for _, content in waiting)
    runner = runtime.site_runner()
    try:
        async_to_sync(runner.run_async)(session_id, text, hooks=TurnHooks([answer.record]),
                                        turn_gate=HeldGate(ids, runner.turn_gate))
    except Exception as err:  # noqa: BLE001 - the operator is told; the list flags the messages
        logger.warning("The bot's turn for the held messages of %r failed: %s", session_id, err)
        SessionMode.objects.filter(pk=session_id, mode=SessionMode.Mode.BOT).update(held_unanswered=len(waiting))
        return HandBack(row, waiting, error=f"{type(err).__name__}: {err}"[:500])
    return HandBack(row, waiting, service.deliver(answer.reply) if answer.reply is not None else None,
                    replaced=True)


def unanswered_flag() -> Exists:
    """For the session list (``console_app.listing.register_flag``): the session was handed back to the bot with
    customer messages held for an operator that no one answered (``SessionMode.held_unanswered``, until the
    next takeover or hand-back)."""
    return Exists(SessionMode.objects.filter(session_id=OuterRef("pk"), mode=SessionMode.Mode.BOT,
                                             held_unanswered__gt=0))
