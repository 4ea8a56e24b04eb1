"""Websocket consumer of the live chat test page (``ws/chat/``).

The page's form sends ``{"message", "session_id", "agent", "channel", "seq"}`` (htmx's ``ws-send``;
``seq`` is the page's number for the message, digits). The first answer to each message acknowledges
``seq`` (``#chat-ack``: *accepted* when it became a turn, *refused* otherwise, so the page keeps a refused
text in its box). Each accepted message is shown at once as *queued*, then played by the site's Runner
(``site_runner()``: the same store, lock and run-event publishing as every other turn) with
``run_streamed``; its run events come back as fragments of the console's own ``item`` partial.
Messages sent while a turn runs queue in order: they are handed to the Runner one after the other,
and the store's per-session FIFO lock (across processes too) makes them wait for the turn ahead.

A new session gets the chosen starting agent and channel with its first turn's commit: a first turn
that fails leaves no session. Session ids the store cannot hold as typed and customers' sessions
(``agents_app.views.chat_refusal``) are refused, before they queue and again when their turn's time
comes (a turn ahead may have created the session). A turn the takeover gate held (the session waits for
an operator, or one owns it) ends *held for the operator*, not *answered*. Every turn handed to the Runner is
written to the audit log (``live_chat_turn``) when it ends, completed or failed.

The socket plays turns only while its login and permission last (:class:`sessions_app.sockets.SocketWatch`):
checked for each message the page sends and again when a queued message's turn is about to start; once
gone, the socket closes with 4401 / 4403 and queued messages are not played.
"""

from __future__ import annotations

import asyncio
import json
import logging
from decimal import Decimal
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import transaction
from django.template.loader import render_to_string

from agents_app.views import CHAT as CHAT_PERMISSION
from agents_app.views import MAX_MESSAGE, chat_refusal
from chatflow_agent.core.reports import TurnReport
from chatflow_agent.jsonsafe import clean_text
from console_app import fragments
from sessions_app import registry
from sessions_app.access import may
from sessions_app.actions import audit
from sessions_app.live import encode_event
from sessions_app.models import ChatSession, OperatorAction
from sessions_app.runtime import site_runner
from sessions_app.sockets import SocketWatch

logger = logging.getLogger("agents_app.chat")

CHAT = "agents_app/chat.html"
MAX_QUEUED = 10  # turns one page may have waiting or running: each is a (possibly paid) model call
STATES = {"queued": "queued", "running": "running", "answered": "answered", "held": "held for the operator",
          "failed": "failed · rolled back", "refused": "refused"}


def _refusal_now(session_id: str, metadata: dict[str, Any]) -> str:
    """:func:`chat_refusal` for ``session_id`` as stored now (``metadata``: what a new session would get)."""
    rows = list(ChatSession.objects.filter(pk=session_id).values_list("metadata", flat=True))
    return chat_refusal(session_id, rows[0] if rows else metadata)


def _seq(value: Any) -> str:
    """The page's number for one sent message (echoed in the answer so the page knows which text it was)."""
    text = str(value or "")
    return text if text.isdigit() and len(text) <= 9 else ""


def _ack(seq: str, accepted: bool) -> str:
    """Tells the page whether message ``seq`` became a turn (its box is emptied) or was refused (kept)."""
    return render_to_string(f"{CHAT}#chat-ack", {"seq": seq, "outcome": "accepted" if accepted else "refused"})


def _audit_turn(user: Any, session_id: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    with transaction.atomic():
        audit(user, OperatorAction.Kind.LIVE_CHAT_TURN, session_id, before, after)


class ChatConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not await database_sync_to_async(may)(user, CHAT_PERMISSION):
            await self.close(code=4403)
            return
        self.count = 0
        self.order = asyncio.Lock()  # hands turns to the Runner in the order they were sent
        self.tasks: set[asyncio.Task[None]] = set()
        self.watch = SocketWatch(self, CHAT_PERMISSION)
        await self.accept()
        self.watch.start()

    async def disconnect(self, code: int) -> None:
        # Turns already handed to the Runner finish (and commit) without this page; queued ones too, while
        # the login that sent them holds.
        watch = getattr(self, "watch", None)
        if watch is not None:
            await watch.stop()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not await self.watch.holds():
            return
        try:
            data = json.loads(text_data or "")
            if not isinstance(data, dict):
                raise ValueError
        except (ValueError, RecursionError):  # RecursionError: nested too deep for the parser
            logger.info("Live chat refused a frame that is not a JSON object (%d characters)", len(text_data or ""))
            await self._error("That frame is not a chat message (a JSON object with a message and a session id).")
            return
        # clean_text: no NUL (PostgreSQL text cannot hold it) and no lone surrogates reach the store.
        text = clean_text(str(data.get("message") or "")).strip()
        session_id = str(data.get("session_id") or "")  # as typed: refused, never cleaned
        agent = registry.get_agent(str(data.get("agent") or "")) or registry.starting_agent()
        channel = clean_text(str(data.get("channel") or "")).strip()[:100]
        seq = _seq(data.get("seq"))
        if not text or not session_id.strip() or len(text) > MAX_MESSAGE:
            await self._error(f"A message (at most {MAX_MESSAGE} characters) and a session id are needed.", seq)
            return
        if refusal := chat_refusal(session_id, None):  # an id that cannot be stored as typed: refused
            logger.info("Live chat refused a message for a session id of %d characters: %s",
                        len(session_id), refusal)
            await self._error(refusal, seq)
            return
        if len(self.tasks) >= MAX_QUEUED:
            await self._error(f"{MAX_QUEUED} messages are already waiting; send more when they have been answered.",
                              seq)
            return
        metadata = {"channel": channel} if channel else {}
        self.count += 1
        n = self.count
        turn = render_to_string(f"{CHAT}#chat-turn", {
            "n": n, "session_id": session_id, "text": text, "state": "queued", "state_label": STATES["queued"]})
        # Checked now, so that the page keeps a refused text in its box; checked again when the turn's
        # time comes (a queued turn ahead may create the session).
        if refusal := await self._refusal(session_id, metadata):
            logger.info("Live chat refused a turn on %r: %s", session_id, refusal)
            await self.send(text_data=turn + self._refused_html(n, refusal) + _ack(seq, accepted=False))
            return
        await self.send(text_data=turn + render_to_string(f"{CHAT}#chat-session-link", {"session_id": session_id})
                        + _ack(seq, accepted=True))
        task = asyncio.ensure_future(self._play(n, session_id, text, agent, metadata))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _error(self, error: str, seq: str = "") -> None:
        await self.send(text_data=render_to_string(f"{CHAT}#chat-error", {"error": error}) + _ack(seq, accepted=False))

    async def _refusal(self, session_id: str, metadata: dict[str, Any]) -> str:
        """Why no turn may be played on ``session_id`` now (``""``: it may); the stored session decides."""
        return await database_sync_to_async(_refusal_now)(session_id, metadata)

    def _refused_html(self, n: int, refusal: str) -> str:
        return render_to_string(f"{CHAT}#chat-refused", {"n": n, "refusal": refusal}) + self._state(n, "refused")

    async def _refused(self, n: int, session_id: str, metadata: dict[str, Any]) -> bool:
        """Whether turn ``n`` may not be played (shown on the page)."""
        refusal = await self._refusal(session_id, metadata)
        if refusal:
            logger.info("Live chat refused a turn on %r: %s", session_id, refusal)
            await self._safe_send(self._refused_html(n, refusal))
        return bool(refusal)

    async def _play(self, n: int, session_id: str, text: str, agent: Any, metadata: dict[str, Any]) -> None:
        view = fragments.DetailView(self.scope["user"], session_id, prefix=f"chat-{n}", show_user=False)
        view.turn_id = "-"  # never the mid-turn case: this page opened the turn itself
        record: dict[str, Any] = {}  # what the audit entry says: filled from the turn's run events
        try:
            async with self.order:
                if not await self.watch.holds():  # logged out (or lost the permission) while it queued
                    return
                if await self._refused(n, session_id, metadata):
                    return
                # The session (if new) is created with the turn's commit, with this agent and metadata.
                stream = site_runner().run_streamed(session_id, text, metadata or None, starting_agent=agent,
                                                    report=TurnReport(source="live_chat"))
                record["status"] = "failed"
                first = await anext(stream)
            await self._event(n, view, first, record, metadata)
            async for event in stream:
                await self._event(n, view, event, record, metadata)
        except Exception as err:  # the turn failed (already shown from its TurnFailed event) or never started
            if not getattr(view, "failed", False):
                await self._safe_send(render_to_string(f"{CHAT}#chat-failed", {
                    "n": n, "error_type": type(err).__name__, "error": str(err) or type(err).__name__})
                    + self._state(n, "failed"))
            record.setdefault("error_type", type(err).__name__)
            logger.info("Live chat turn %d on %r failed: %s", n, session_id, err)
        finally:
            if record:
                await self._audit(session_id, agent, record)

    async def _audit(self, session_id: str, agent: Any, record: dict[str, Any]) -> None:
        try:
            await asyncio.shield(database_sync_to_async(_audit_turn)(
                self.scope["user"], session_id, {"active_agent": record.pop("agent", agent.name)}, record))
        except Exception:
            logger.exception("Could not write the audit entry of a live chat turn on %r", session_id)

    async def _event(self, n: int, view: fragments.DetailView, event: Any, record: dict[str, Any],
                     metadata: dict[str, Any]) -> None:
        data = encode_event(event)
        kind = data["kind"]
        if kind == "turn_started":
            view.turn_id = data["turn_id"]
            record.update(turn_id=data["turn_id"], agent=data["agent_name"])
            html = self._state(n, "running") + fragments.render_event(view, {**data, "kind": "handoff",
                                                                              "to_agent": data["agent_name"]})
        elif kind == "turn_completed":
            record.update(status="completed", active_agent=data["response"]["active_agent_name"],
                          message_ids=data["message_ids"])
            active = data["response"]["active_agent_name"]
            # Held: the session waits for (or is answered by) an operator; no model was called.
            state = "held" if data["response"].get("held") else "answered"
            html = self._state(n, state) + fragments.render_event(view, {
                **data, "kind": "handoff", "to_agent": active})
            # The session exists now: its agent is its own (shown live), no longer a starting choice.
            ctx = {"existing": True, "agent": active, "agent_names": list(registry.agents()), "oob": True,
                   "channel": metadata.get("channel", "")}
            html += render_to_string(f"{CHAT}#chat-agent-field", ctx)
            if ctx["channel"]:  # sent from an editable field: the new session's channel, now stored
                html += render_to_string(f"{CHAT}#chat-channel-field", ctx)
            usage = data.get("usage") or {}
            cost = usage.get("cost")
            html += render_to_string(f"{CHAT}#chat-usage", {
                "n": n, "usage": usage, "cost": None if cost is None else f"{Decimal(cost):f}",  # never 1E-7
                "estimated": any(c.get("estimated") for c in usage.get("calls") or [])})
        elif kind == "turn_failed":
            view.failed = True  # type: ignore[attr-defined]
            record.update(status="failed", error_type=data["error_type"])
            html = self._state(n, "failed") + render_to_string(f"{CHAT}#chat-failed", {"n": n, **data})
        else:
            html = fragments.render_event(view, data)
        await self._safe_send(html)

    def _state(self, n: int, state: str) -> str:
        return render_to_string(f"{CHAT}#chat-state",
                                {"n": n, "state": state, "state_label": STATES[state], "oob": True})

    async def _safe_send(self, html: str) -> None:
        if html:
            try:
                await self.send(text_data=html)
            except Exception:  # the page went away; the turn goes on
                logger.debug("Live chat page closed before a fragment could be sent")
