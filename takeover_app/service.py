"""Human takeover's rules: a session's mode, taking over, replying as an operator, handing back.

Public functions (the views, the webhook worker, the health page and the runtime gate call these):

- :func:`mode_of` — the session's mode row (unsaved ``bot`` row when it has none).
- :func:`take_over` — an operator becomes the session's owner (mode ``human``).
- :func:`hand_back` — back to ``bot``, with the agent to answer next and a private note for it.
- :func:`send_reply` / :func:`resend` — an operator's message to the customer through the session's channel.
- :func:`request_human` — the customer or an agent asked for a person (mode ``waiting``).
- :func:`cancel_turn` — an operator's Cancel turn (audited; the site store's ``cancel_turn`` stops it).

Every change of mode runs under the session's turn lock (the site store's ``sync_turn``) and in one
database transaction with its audit entry (``OperatorAction``), which is broadcast live once committed.
Errors are :class:`sessions_app.actions.ActionError` subclasses carrying their HTTP status:
``InvalidAction`` (400, a message for the operator), ``SessionBusy`` (409), :class:`TakenOver` (409,
names the operator who owns the session); an unknown session is ``Http404``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any, Literal, TypeVar

from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.http import Http404
from django.utils import timezone

from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from chatflow_agent.jsonsafe import clean_text
from chatflow_agent.types import Message, Role
from sessions_app import live, registry
from sessions_app.actions import ActionError, InvalidAction, SessionBusy, audit, site_store
from sessions_app.models import ChatMessage, ChatSession, SessionLease
from takeover_app.models import OperatorReply, SessionMode
from webhooks_app import replies, taskqueue
from webhooks_app.arrival import Arrival, arrival_of
from webhooks_app.models import SENDING_PROVIDERS

__all__ = ["ACTIONS", "HELD_CHOICES", "TakenOver", "WHATSAPP_WINDOW", "arrival", "cancel_turn", "deliver", "hand_back",
           "held_messages", "idle_sweep", "in_takeover", "mode_of", "note_failed_turn", "request_human", "resend",
           "send_reply", "start_waiting", "take_over"]

logger = logging.getLogger("takeover_app")

Mode, Trigger, Status = SessionMode.Mode, SessionMode.Trigger, OperatorReply.Status

#: The audit log's action values written here (``OperatorAction.action``).
ACTIONS = {"take_over": "Take over", "hand_back": "Hand back", "operator_reply": "Operator reply",
           "human_requested": "Human requested", "cancel_turn": "Cancel turn", "takeover_idle": "Back to bot (idle)",
           "escalation_not_needed": "Escalation not needed", "budget_answered": "Budget answer"}

#: WhatsApp's customer-service window: a free-form message may be sent only this long after the
#: customer's last message (developers.facebook.com/docs/whatsapp/pricing#customer-service-windows).
WHATSAPP_WINDOW = timedelta(hours=24)

_T = TypeVar("_T")
_BUSY_RETRY_SECONDS = 5.0  # how long an action that writes a message waits for a (held) turn to end


class _SessionGone(Exception):
    """The session was deleted under a turn of this module: the turn is rolled back."""


class TakenOver(ActionError):
    """Another operator owns the session (HTTP 409); ``owner`` is their username."""

    status = 409

    def __init__(self, message: str, owner: str = "") -> None:
        super().__init__(message)
        self.owner = owner


def mode_of(session_id: str) -> SessionMode:
    """The session's ``SessionMode`` row, or an unsaved one in mode ``bot`` when the session has none."""
    return SessionMode.objects.filter(pk=session_id).first() or SessionMode(session_id=session_id)


def in_takeover(session_ids: Sequence[str], using: str = "default") -> set[str]:
    """Of ``session_ids``, those waiting for an operator or owned by one (mode ``waiting`` or ``human``)."""
    return set(SessionMode.objects.using(using)
               .filter(session_id__in=session_ids, mode__in=[SessionMode.Mode.WAITING, SessionMode.Mode.HUMAN])
               .values_list("session_id", flat=True))


def arrival(session_id: str) -> Arrival | None:
    """The webhook the session's messages arrive through (``webhooks_app.arrival``: it decides where an
    operator's reply goes), None for a session no webhook delivered to or no session."""
    meta = ChatSession.objects.filter(pk=session_id).values_list("metadata", flat=True).first()
    return arrival_of(session_id, meta)


def _session(session_id: str) -> ChatSession:
    row = ChatSession.objects.filter(pk=session_id).first()
    if row is None:
        raise Http404("No such session.")
    return row


def _locked_mode(session_id: str) -> SessionMode:
    """The mode row locked until the transaction ends (created in ``bot`` mode when missing)."""
    SessionMode.objects.get_or_create(session_id=session_id)
    return SessionMode.objects.select_for_update().get(pk=session_id)


def _state(row: SessionMode) -> dict[str, Any]:
    return {"mode": row.mode, "owner": row.owner_username, "trigger": row.trigger, "reason": row.reason}


def _taken(row: SessionMode) -> TakenOver:
    when = timezone.localtime(row.since).strftime("%Y-%m-%d %H:%M")
    return TakenOver(f"{row.owner_username or 'Another operator'} took this session over at {when}.",
                     owner=row.owner_username)


def _name(user: Any) -> str:
    return getattr(user, "username", "") or ""


@contextmanager
def _turn(session_id: str, *, wait: bool, queued: Callable[[], object] | None = None) -> Iterator[Any]:
    """The session's turn (the site store's ``sync_turn``); ``SessionBusy`` (409) when busy and not ``wait``.

    ``wait``: queue behind a running turn (FIFO); only outside any transaction (on SQLite a write
    transaction held while waiting would stop the running turn from committing). ``queued``: called
    once this turn has its place in the session's line (the store's ``sync_turn``).
    """
    try:
        with site_store().sync_turn(session_id, registry.starting_agent(), wait=wait, queued=queued) as session:
            yield session
    except SessionBusyError:
        raise SessionBusy(f"A turn is running on session {session_id!r}; try again when it has finished.") from None


def _retrying(action: Callable[[], _T]) -> _T:
    """``action()`` (a transaction taking the turn without waiting), tried again for a few seconds while
    ``SessionBusy``: held turns and other actions are short, and waiting outside the transaction lets
    them commit."""
    deadline = time.monotonic() + _BUSY_RETRY_SECONDS
    while True:
        try:
            return action()
        except SessionBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# ---- take over / hand back ------------------------------------------------------------------------
def take_over(user: Any, session_id: str, *, when: Literal["after_turn", "now"] = "after_turn") -> SessionMode:
    """Make ``user`` the owner of ``session_id`` (mode ``human``); returns the saved row.

    ``when="after_turn"``: a running turn finishes first (this call queues behind it, FIFO);
    ``"now"``: the running turn is stopped and rolled back (:func:`cancel_turn`), then the session is
    taken. Idempotent for the current owner. :class:`TakenOver` (409) when another operator owns it;
    ``InvalidAction`` (400) for another ``when``; ``Http404`` for an unknown session.
    """
    if when not in ("after_turn", "now"):
        raise InvalidAction(f"Take over when? 'after_turn' or 'now', not {when!r}.")
    _session(session_id)
    current = mode_of(session_id)
    if current.mode == Mode.HUMAN and current.owner_username != _name(user):
        raise _taken(current)  # before stopping anything
    # "now": the running turn is stopped once the takeover has its place in the session's line, so its
    # replay (the webhook worker plays a stopped delivery again, maybe in this process) comes after.
    stop = (partial(cancel_turn, user, session_id, "Stopped to take the session over.", replay=True)
            if when == "now" else None)
    taken: SessionMode | None = None
    try:
        with _turn(session_id, wait=True, queued=stop) as session, transaction.atomic():
            taken = _take(user, session_id, session, when)
    except SessionBusy:
        # Our own lease was taken away after the takeover committed (a second operator's "now" racing
        # this one cancels whatever holds the session): the session is ours all the same.
        if taken is None:
            raise
    return taken


def _take(user: Any, session_id: str, session: Any, when: str) -> SessionMode:
    """The takeover's writes (in the caller's transaction, under the session's turn lock)."""
    row = _locked_mode(session_id)
    if row.mode == Mode.HUMAN:
        if row.owner_username == _name(user):
            return row
        raise _taken(row)
    before = _state(row)
    if row.mode == Mode.BOT or not row.previous_agent:
        row.previous_agent = session.active_agent.name
    row.mode, row.since, row.updated_at = Mode.HUMAN, timezone.now(), timezone.now()
    row.owner, row.owner_username = (user if getattr(user, "pk", None) else None), _name(user)
    if before["mode"] == Mode.BOT:
        row.trigger, row.reason = Trigger.OPERATOR, ""
    row.unread, row.held_unanswered = 0, 0
    row.customer_last_at = _customer_last_at(session_id)
    row.save()
    audit(user, "take_over", session_id, before, {**_state(row), "when": when,
                                                  "active_agent": session.active_agent.name})
    return row


#: What the operator says of the messages held since the last operator reply, at hand-back: the bot answers them
#: now (``takeover_app.held``), they were answered, or (None: a form without the choice) nothing was said.
HELD_CHOICES = ("bot_answers", "answered")


def held_messages(session_id: str) -> list[tuple[int, str]]:
    """The customer messages held since the last reply (an operator's, the holding message, the bot's before
    the takeover): the session's USER rows after its last MODEL row, oldest first, as (row id, text)."""
    messages = ChatMessage.objects.filter(session_id=session_id)
    last = messages.filter(role=Role.MODEL.value).order_by("-id").values_list("id", flat=True).first()
    held = messages.filter(role=Role.USER.value, **({"id__gt": last} if last is not None else {}))
    return [(pk, text or "") for pk, text in held.order_by("id").values_list("id", "content")]


def hand_back(user: Any, session_id: str, *, agent_name: str | None = None, note: str = "",
              held: str | None = None) -> SessionMode:
    """Return the session to ``bot`` mode; ``agent_name`` (default: the agent active before the takeover)
    becomes its active agent and ``note`` (optional, private) is given to the next model call as an
    instruction the customer never sees. ``held`` (:data:`HELD_CHOICES` or None): what becomes of the
    messages held since the last reply (:func:`held_messages`, read under the turn lock and audited with the
    choice): ``"bot_answers"`` (the caller plays their turn, ``takeover_app.held``), ``"answered"``, or None
    (handed back unanswered: the session list flags it, ``held_unanswered``). The returned row carries them
    as ``row.held`` (a list of (row id, text)). ``InvalidAction`` (400) for an unknown agent or choice or a
    session in ``bot`` mode; :class:`TakenOver` (409) when another operator owns it; ``Http404`` for an
    unknown session.
    """
    if held is not None and held not in HELD_CHOICES:
        raise InvalidAction(f"What of the held messages? {' or '.join(HELD_CHOICES)}, not {held!r}.")
    _session(session_id)
    note = clean_text(note or "").strip()
    return _retrying(lambda: _hand_back(user, session_id, agent_name, note, held))


def _hand_back(user: Any, session_id: str, agent_name: str | None, note: str, held: str | None) -> SessionMode:
    with transaction.atomic(), _turn(session_id, wait=False) as session:
        row = _locked_mode(session_id)
        if row.mode == Mode.BOT:
            raise InvalidAction("This session is already answered by the bot.")
        if row.mode == Mode.HUMAN and row.owner_username and row.owner_username != _name(user):
            raise _taken(row)
        if _winding_down(session_id, row):
            raise SessionBusy("The turn stopped when the session was taken over is still winding down in a "
                              "worker; hand back when it has (a few seconds): the bot would answer its message "
                              "after your reply.")
        name = agent_name or row.previous_agent or session.active_agent.name
        agent = registry.get_agent(name)
        if agent is None:
            raise InvalidAction(f"Unknown agent {name!r}; registered agents: {', '.join(registry.agents())}.")
        before = {**_state(row), "active_agent": session.active_agent.name}
        if agent.name != session.active_agent.name:
            session.set_active_agent(agent)
        row.mode, row.since, row.updated_at = Mode.BOT, timezone.now(), timezone.now()
        row.owner, row.owner_username, row.trigger, row.reason = None, "", Trigger.HANDBACK, ""
        row.pending_note = row.last_note = note  # this hand-back's note: an earlier one is not shown for it
        row.unread, row.waiting_since, row.failed_turns = 0, None, 0
        waiting = held_messages(session_id)
        row.held_unanswered = len(waiting) if held is None else 0
        row.save()
        audit(user, "hand_back", session_id, before, {
            **_state(row), "active_agent": agent.name, "note": note,
            "held": {"messages": [pk for pk, _ in waiting], "choice": (held or "unanswered") if waiting else ""}})
    row.held = waiting  # type: ignore[attr-defined]  # for the caller (takeover_app.held)
    return row


def _winding_down(session_id: str, row: SessionMode) -> bool:
    """True while a turn the takeover stopped in a worker process may still be winding down: a webhook
    delivery of the session that arrived before it left the bot is still being played there. That worker
    plays its message again once it notices (held, while an operator has the session)."""
    return taskqueue.playing_since_before(session_id, row.since)


# ---- waiting ------------------------------------------------------------------------------------
def start_waiting(session_id: str, *, trigger: str, reason: str, using: str = "default",
                  detail: dict[str, Any] | None = None) -> SessionMode | None:
    """Put a ``bot`` session into ``waiting`` and audit it (no actor). Call it only while holding the
    session's turn (a turn's commit, an action under ``sync_turn``), inside a transaction or not.
    ``detail``: what fired, kept in the audit entry beside the trigger (``{"phrase": "talk to a human"}``,
    ``{"tool": "request_human", "tool_reason": …}``, ``{"failed_turns": 3}``, ``{"budget": "turns",
    "budget_limit": "20", "budget_used": "20"}``); the escalation
    (``takeover_app.escalations``) is that entry. Returns the row, or None when the session already waits or
    is owned."""
    with transaction.atomic(using=using):
        SessionMode.objects.using(using).get_or_create(session_id=session_id)
        row = SessionMode.objects.using(using).select_for_update().get(pk=session_id)
        if row.mode != Mode.BOT:
            return None
        before = _state(row)
        now = timezone.now()
        row.mode, row.since, row.waiting_since, row.updated_at = Mode.WAITING, now, now, now
        row.trigger, row.reason, row.unread = trigger, clean_text(reason)[:2000], 0
        row.save(using=using)
        audit(None, "human_requested", session_id, before, {**_state(row), **(detail or {})})
    return row


def request_human(session_id: str, reason: str, trigger: str) -> SessionMode | None:
    """Put a session in ``bot`` mode into ``waiting`` (``trigger``: a ``SessionMode.Trigger`` value; audited
    without an actor), under the session's turn lock (queued behind a running turn). Returns the row,
    or None when the session already waits or is owned. ``Http404`` for an unknown session."""
    _session(session_id)
    with _turn(session_id, wait=True):
        return start_waiting(session_id, trigger=trigger, reason=reason)


def note_failed_turn(session_id: str) -> bool:
    """Count a failed turn of a ``bot`` session; True when it made the session wait for an operator
    (``CHATFLOW_HUMAN_AFTER_FAILED_TURNS`` consecutive failures; 0 turns this off)."""
    limit = settings.CHATFLOW_HUMAN_AFTER_FAILED_TURNS
    if limit <= 0 or not ChatSession.objects.filter(pk=session_id).exists():
        return False
    try:
        with _turn(session_id, wait=True), transaction.atomic():
            try:
                row = _locked_mode(session_id)  # the mode row first: a delete's lock order
            except SessionMode.DoesNotExist:  # deleted by a delete that held it
                raise _SessionGone from None
            if not ChatSession.objects.filter(pk=session_id).exists():
                raise _SessionGone  # deleted since: the mode row made here and the turn are rolled back
            if row.mode != Mode.BOT:
                return False
            row.failed_turns += 1
            row.save(update_fields=["failed_turns"])
            if row.failed_turns < limit:
                return False
            return start_waiting(session_id, trigger=Trigger.FAILURES,
                                 reason=f"{row.failed_turns} turns in a row failed.",
                                 detail={"failed_turns": row.failed_turns}) is not None
    except (_SessionGone, SessionDeletedError):
        return False  # a deleted session's failure counts for nothing, and nothing of it is written again


def idle_sweep(now: Any = None) -> int:
    """Return ``waiting``/``human`` sessions idle for ``CHATFLOW_TAKEOVER_IDLE_MINUTES`` (0: never) to the
    bot, each audited (``takeover_idle``); how many. Idle: no customer message, operator reply or mode
    change since then."""
    minutes = settings.CHATFLOW_TAKEOVER_IDLE_MINUTES
    if minutes <= 0:
        return 0
    cutoff = (now or timezone.now()) - timedelta(minutes=minutes)
    done = 0
    for row in SessionMode.objects.filter(mode__in=[Mode.WAITING, Mode.HUMAN], updated_at__lt=cutoff):
        last = ChatMessage.objects.filter(session_id=row.session_id).order_by("-id").values_list(
            "created_at", flat=True).first()
        if last is not None and last >= cutoff:
            continue
        try:
            with transaction.atomic(), _turn(row.session_id, wait=False):
                locked = _locked_mode(row.session_id)
                if locked.mode == Mode.BOT or locked.updated_at >= cutoff:
                    continue
                before = _state(locked)
                locked.mode, locked.since, locked.updated_at = Mode.BOT, timezone.now(), timezone.now()
                locked.owner, locked.owner_username, locked.trigger = None, "", Trigger.IDLE
                locked.waiting_since, locked.unread = None, 0
                locked.save()
                audit(None, "takeover_idle", row.session_id, before, {**_state(locked), "idle_minutes": minutes})
                done += 1
        except SessionBusy:
            continue  # a turn is running there: not idle after all
    return done


# ---- cancel a running turn ----------------------------------------------------------------------
def cancel_turn(user: Any, session_id: str, reason: str, *, only_expired: bool = False,
                replay: bool = False, owner: str = "") -> bool:
    """An operator's Cancel turn: stop the turn running on ``session_id``, in this process or another, and audit
    it (the site store's ``cancel_turn``: its lease is taken away, so its commit is refused and the turn is rolled
    back; a stale lease is released). ``only_expired``: only an expired lease is released (a live turn is left
    alone). ``owner``: only the turn holding the lease as ``owner`` is stopped (the one a page showed, not one
    that began since). ``replay``: a webhook delivery whose turn this stops is played again (a takeover: it is
    then held for the operator); otherwise it ends failed with who cancelled it and why, which the worker reads
    from the store (``cancel_of``). Returns True when a lease was taken away, False when no (expired, with
    ``only_expired``; ``owner``'s, with ``owner``) lease held the session.
    """
    def audited(lease: SessionLease, expired: bool) -> None:
        before = {"lease_owner": lease.owner, "expired": expired,
                  "acquired_at": lease.acquired.isoformat() if lease.acquired else None}
        # A released stale lease's turn (its holder stalled, if alive) would have lost it anyway: replayed.
        audit(user, "cancel_turn", session_id, before, {"reason": clean_text(reason or "")[:2000],
                                                          "replay": replay or expired})

    text = _cancelled_text(getattr(user, "username", ""), reason)
    taken = site_store().cancel_turn(session_id, text, replay=replay, only_expired=only_expired, owner=owner,
                                     audited=audited)
    return taken is not None


def _cancelled_text(username: str | None, reason: str | None) -> str:
    """Who stopped a turn and why, as its delivery's and its record's error say it."""
    return f"Cancelled by {username or 'an operator'}: {clean_text(reason or '')[:2000] or 'no reason given'}"


# ---- operator replies ---------------------------------------------------------------------------
def _customer_last_at(session_id: str) -> Any:
    return ChatMessage.objects.filter(session_id=session_id, role=Role.USER.value).order_by("-id").values_list(
        "created_at", flat=True).first()


def _check_window(session_id: str, channel: str) -> None:
    if channel != "whatsapp":
        return
    last = _customer_last_at(session_id)
    if last is None or timezone.now() - last > WHATSAPP_WINDOW:
        when = "never" if last is None else timezone.localtime(last).strftime("%Y-%m-%d %H:%M")
        raise InvalidAction(f"WhatsApp only allows a free-form reply within 24 hours of the customer's last "
                            f"message (last: {when}). Template messages are not supported; wait for the customer "
                            f"to write again.")


def _owned(user: Any, session_id: str) -> SessionMode:
    row = _locked_mode(session_id)
    if row.mode != Mode.HUMAN:
        raise InvalidAction("Take the session over before replying: the bot answers it now.")
    if row.owner_username != _name(user):
        raise _taken(row)
    return row


def send_reply(user: Any, session_id: str, text: str) -> OperatorReply:
    """Store ``text`` as a MODEL message written by ``user`` and send it through the session's channel: the
    webhook its messages arrive through (:func:`arrival`), when that provider has an API to send with
    (WhatsApp, Telegram); otherwise (generic, or no webhook: the live chat, the demo, an import) the reply
    is in the transcript only, which its ``shown_status`` says (``in_transcript``).

    The message and the ``OperatorReply`` (status ``sending``) commit before the send; the outcome
    (``sent`` / ``failed`` with the error) is recorded after it. Sent at most once: a reply whose
    sender died stays ``sending`` (shown as unknown) and is only sent again by :func:`resend`.
    ``InvalidAction`` (400): empty text, a session not in mode ``human``, or a WhatsApp session whose
    customer wrote last more than 24 hours ago (its service window is closed); :class:`TakenOver`
    (409): another operator owns it; ``SessionBusy`` (409): a turn held the session throughout; ``Http404``: no such
    session, or it was deleted (and the reply with it) while the reply was being sent.
    """
    text = clean_text(text or "").strip()
    if not text:
        raise InvalidAction("The reply is empty.")
    _session(session_id)
    arrived = arrival(session_id)
    provider = arrived.provider if arrived is not None else ""
    reply, _entry = _retrying(lambda: _store_reply(user, session_id, text, provider))
    return _deliver(reply)


def _store_reply(user: Any, session_id: str, text: str, provider: str) -> tuple[OperatorReply, Any]:
    with transaction.atomic():
        with _turn(session_id, wait=False) as session:
            row = _owned(user, session_id)
            _check_window(session_id, provider)
            message = Message(role=Role.MODEL, content=text, author=_name(user) or "operator")
            session.add_message(message)
        reply = OperatorReply.objects.create(
            session_id=session_id, message_row_id=site_store().message_row_id(session, message), text=text,
            author=user if getattr(user, "pk", None) else None, author_username=_name(user),
            provider=provider, status=Status.SENDING, attempts=1, attempted_at=timezone.now())
        row.unread, row.updated_at = 0, timezone.now()
        row.save(update_fields=["unread", "updated_at"])
        entry = audit(user, "operator_reply", session_id, {}, {"reply": reply.pk, "text": text,
                                                                "provider": reply.provider})
    return reply, entry


def resend(user: Any, reply_id: int) -> OperatorReply:
    """Send a ``failed`` (or unknown: its sender died) operator reply again; the same rules as
    :func:`send_reply` apply (owner, 24-hour window). ``InvalidAction`` (400) for a reply that was sent
    or is still being sent; ``Http404`` for an unknown reply."""
    found = OperatorReply.objects.filter(pk=reply_id).first()
    if found is None:
        raise Http404("No such reply.")
    with transaction.atomic():
        _owned(user, found.session_id)
        reply = OperatorReply.objects.select_for_update().get(pk=reply_id)
        if not reply.resendable:
            raise InvalidAction(f"Only a failed or unknown reply can be sent again; this one is {reply.shown_status}.")
        _check_window(reply.session_id, reply.provider)
        before = {"reply": reply.pk, "status": reply.shown_status, "error": reply.error[:500]}
        reply.status, reply.error, reply.attempts = Status.SENDING, "", reply.attempts + 1
        reply.attempted_at = timezone.now()
        reply.save(update_fields=["status", "error", "attempts", "attempted_at"])
        audit(user, "operator_reply", reply.session_id, before,
              {"reply": reply.pk, "resend": True, "provider": reply.provider})
    return _deliver(reply)


def deliver(reply: OperatorReply) -> OperatorReply:
    """Send a committed ``sending`` reply once and record the outcome (what :func:`send_reply` does after its
    commit); for a reply another module committed, e.g. the bot's answer to held messages."""
    return _deliver(reply)


def _deliver(reply: OperatorReply) -> OperatorReply:
    """Send a committed ``sending`` reply, then record sent/failed and broadcast the new status. A reply
    whose provider sends nothing out is recorded ``sent``: it is in the transcript, all it can reach."""
    async def send(address: dict[str, Any]) -> None:
        # Never longer than half the time after which a reply still ``sending`` counts as its sender's
        # crash (unknown, resendable): a slow send must not overlap a resend of itself.
        async with asyncio.timeout(OperatorReply.SEND_DEADLINE / 2), replies.client() as client:
            await replies.send_to(client, reply.provider, address, reply.text)

    try:
        if reply.provider in SENDING_PROVIDERS:
            arrived = arrival(reply.session_id)
            if arrived is None or arrived.provider != reply.provider:
                raise LookupError(f"The session's messages no longer arrive through {reply.provider}: "
                                  "there is no one to send it to there.")
            async_to_sync(send)(arrived.address)  # whom the customer's last message came from
    except Exception as err:  # noqa: BLE001 - recorded on the reply, shown on the session page
        logger.warning("Operator reply %s on %r failed: %s", reply.pk, reply.session_id, err)
        fields = {"status": Status.FAILED, "error": f"{type(err).__name__}: {err}"[:4000]}
    else:
        fields = {"status": Status.SENT, "sent_at": timezone.now()}
    # Only this attempt's outcome (a resend counts an attempt more and records its own).
    OperatorReply.objects.filter(pk=reply.pk, status=Status.SENDING, attempts=reply.attempts).update(**fields)
    recorded = OperatorReply.objects.filter(pk=reply.pk).first()
    if recorded is None:  # its session was deleted during the send, and the reply with it
        raise Http404(f"Session {reply.session_id!r} was deleted while the reply was being sent.")
    reply = recorded
    live.publish_reply(reply)  # open pages render the reply's new status
    return reply
