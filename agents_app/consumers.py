"""Websocket consumer of the live chat test page (``ws/chat/``).

The page's form sends ``{"message", "session_id", "agent", "channel"}`` (htmx's ``ws-send``). Each
message is shown at once as *queued*, then played by the site's Runner (``site_runner()``: the same
store, lock and run-event publishing as every other turn) with ``run_streamed``; its run events come
back as fragments of the console's own ``item`` partial. Messages sent while a turn runs queue in
order: they are handed to the Runner one after the other, and the store's per-session FIFO lock
(across processes too) makes them wait for the turn ahead of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.template.loader import render_to_string

from agents_app import registry
from agents_app.views import CHAT as CHAT_PERMISSION
from chatflow_agent.jsonsafe import clean_text
from sessions_app import fragments
from sessions_app.access import may

logger = logging.getLogger("agents_app.chat")

CHAT = "agents_app/chat.html"
MAX_MESSAGE = 4000
MAX_SESSION_ID = 200
MAX_QUEUED = 10  # turns one page may have waiting or running: each is a (possibly paid) model call
STATES = {"queued": "queued", "running": "running", "answered": "answered", "failed": "failed · rolled back"}


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
        await self.accept()

    async def disconnect(self, code: int) -> None:
        # Turns already handed to the Runner finish (and commit) without this page; queued ones too.
        return

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            data = json.loads(text_data or "")
            if not isinstance(data, dict):
                raise ValueError
        except ValueError:
            return
        # clean_text: no NUL (PostgreSQL text cannot hold it) and no lone surrogates reach the store.
        text = clean_text(str(data.get("message") or "")).strip()
        session_id = clean_text(str(data.get("session_id") or "")).strip()
        agent = registry.get_agent(str(data.get("agent") or "")) or registry.starting_agent()
        channel = clean_text(str(data.get("channel") or "")).strip()[:100]
        if not text or not session_id or len(text) > MAX_MESSAGE or len(session_id) > MAX_SESSION_ID:
            await self.send(text_data=render_to_string(f"{CHAT}#chat-error", {
                "error": f"A message (at most {MAX_MESSAGE} characters) and a session id "
                         f"(at most {MAX_SESSION_ID}) are needed."}))
            return
        if len(self.tasks) >= MAX_QUEUED:
            await self.send(text_data=render_to_string(f"{CHAT}#chat-error", {
                "error": f"{MAX_QUEUED} messages are already waiting; send more when they have been answered."}))
            return
        self.count += 1
        n = self.count
        await self.send(text_data=render_to_string(f"{CHAT}#chat-turn", {
            "n": n, "session_id": session_id, "text": text, "state": "queued", "state_label": STATES["queued"]})
            + render_to_string(f"{CHAT}#chat-session-link", {"session_id": session_id}))
        task = asyncio.ensure_future(self._play(n, session_id, text, agent, {"channel": channel} if channel else {}))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _play(self, n: int, session_id: str, text: str, agent: Any, metadata: dict[str, Any]) -> None:
        from agents_app.runtime import site_runner, site_store

        view = fragments.DetailView(self.scope["user"], session_id, prefix=f"chat-{n}", show_user=False)
        view.turn_id = "-"  # never the mid-turn case: this page opened the turn itself
        try:
            async with self.order:
                if await site_store().aget(session_id) is None:
                    await site_store().aget_or_create(session_id, agent, metadata)
                stream = site_runner().run_streamed(session_id, text, metadata or None)
                first = await anext(stream)
            await self._event(n, view, first)
            async for event in stream:
                await self._event(n, view, event)
        except Exception as err:  # the turn failed (already shown from its TurnFailed event) or never started
            if not getattr(view, "failed", False):
                await self._safe_send(render_to_string(f"{CHAT}#chat-failed", {
                    "n": n, "error_type": type(err).__name__, "error": str(err) or type(err).__name__})
                    + self._state(n, "failed"))
            logger.info("Live chat turn %d on %r failed: %s", n, session_id, err)

    async def _event(self, n: int, view: fragments.DetailView, event: Any) -> None:
        from sessions_app.live import encode_event

        data = encode_event(event)
        kind = data["kind"]
        if kind == "turn_started":
            view.turn_id = data["turn_id"]
            html = self._state(n, "running") + fragments.render_event(view, {**data, "kind": "handoff",
                                                                              "to_agent": data["agent_name"]})
        elif kind == "turn_completed":
            html = self._state(n, "answered") + fragments.render_event(view, {
                **data, "kind": "handoff", "to_agent": data["response"]["active_agent_name"]})
        elif kind == "turn_failed":
            view.failed = True  # type: ignore[attr-defined]
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
