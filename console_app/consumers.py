"""Websocket consumers of the console: the session list (``ws/sessions/``) and one session (``ws/sessions/<id>/``).

Thin by design: ``connect()`` checks access (anonymous → close 4401, no view permission → 4403,
unknown session → accepted and closed with 4404, a code the page sees) and accepts last; group messages are
turned into htmx out-of-band fragments by :mod:`console_app.fragments` (the console's own partials); the
ORM only through ``database_sync_to_async``. While open, each socket watches its login, its permission and the
channel layer (:class:`sessions_app.sockets.SocketWatch`): it closes with 4401 / 4403 once the login or the
permission is gone, and with 1013 when the layer failed under it.

Reconnects without gaps or doubles: after connecting, the detail page sends
``{"type": "resume", "after": <last message id it has>, "order": "newest"|"oldest", "tail": bool,
"page": n}``. The consumer joined its group before accepting and holds live events until then; it
replays the stored messages with a greater id, then the held events — a ``turn_completed`` sends
only messages above the consumer's cursor, so nothing arrives twice.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import QueryDict

from console_app import fragments, listing
from sessions_app.access import VIEW, may
from sessions_app.live import LIST_GROUP, group_for_session, join, leave
from sessions_app.models import ChatSession
from sessions_app.sockets import SocketWatch

logger = logging.getLogger("sessions_app.live")

PENDING_LIMIT = 2000


class _ConsoleConsumer(AsyncWebsocketConsumer):
    group = ""
    watch: SocketWatch | None = None

    async def _allowed(self) -> bool:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return False
        if not await database_sync_to_async(may)(user, VIEW):
            await self.close(code=4403)
            return False
        return True

    async def _join_and_accept(self, group: str) -> None:
        """Join ``group``, accept, and watch the login and the layer from now on."""
        self.watch = SocketWatch(self, VIEW, group)
        self.group = group
        await join(self.channel_layer, self.group, self.channel_name)
        await self.accept()
        self.watch.start()

    async def disconnect(self, code: int) -> None:
        if self.watch is not None:
            await self.watch.stop()
        if self.group:
            await leave(self.channel_layer, self.group, self.channel_name)

    async def live_probe(self, message: dict[str, Any]) -> None:
        """The watch's own message through the layer (:class:`SocketWatch`): the layer still delivers."""
        if self.watch is not None:
            self.watch.probe_arrived()

    async def dispatch(self, message: dict[str, Any]) -> None:
        if message["type"].startswith("live.") and not self.serving():
            return  # closed by its watch: group messages still queued are not rendered
        await super().dispatch(message)

    def serving(self) -> bool:
        """False once the watch closed the socket: nothing more is sent."""
        return self.watch is None or self.watch.serving

    async def _send(self, html: str) -> None:
        if html and self.serving():
            await self.send(text_data=html)


class SessionListConsumer(_ConsoleConsumer):
    """``ws/sessions/[?mode=top][&filters=<the list's search and filters, URL-encoded>]``: rows of sessions
    whose turns start/end or that operators changed. ``mode=top`` moves such a row to the top (the list's
    first page, newest first); with ``filters`` only sessions that match them are shown, and a session that
    stops matching leaves the list."""

    async def connect(self) -> None:
        if not await self._allowed():
            return
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.top = query.get("mode") == ["top"]
        filters = listing.parse_query(QueryDict((query.get("filters") or [""])[0]))
        self.filters = filters if listing.filters_of(filters) else None
        await self._join_and_accept(LIST_GROUP)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.watch is not None:
            await self.watch.holds()  # the list page sends nothing the server needs: only checked

    async def live_event(self, message: dict[str, Any]) -> None:
        event = message["event"]
        running = event["kind"] == "turn_started"
        frames = await database_sync_to_async(fragments.list_row_from_db)(event["session_id"], self.top, running,
                                                                            self.filters)
        for frame in frames:
            await self._send(frame)

    async def live_action(self, message: dict[str, Any]) -> None:
        action = message["action"]
        if action["kind"] == "delete":
            frames = [fragments.list_removed(action["session_id"])]
        else:
            # In place: every session is on the whole list. A filtered list shows a session that has come to
            # match its filters (a mode changed) at the top, as it could not have had its row.
            top = self.top and self.filters is not None
            frames = await database_sync_to_async(fragments.list_row_from_db)(action["session_id"], top, None,
                                                                                self.filters)
        # The navigation's waiting badge rides in the row's frame (a mode may have changed).
        badge = await database_sync_to_async(fragments.nav_waiting_from_db)()
        frames = [*frames[:-1], frames[-1] + badge] if frames else [badge]
        for frame in frames:
            await self._send(frame)

    async def live_reply(self, message: dict[str, Any]) -> None:
        return  # a reply's delivery changes no list column


class SessionConsumer(_ConsoleConsumer):
    """``ws/sessions/<session id>/``: a session's running turn, its new turns and operator actions on it."""

    async def connect(self) -> None:
        if not await self._allowed():
            return
        session_id = self.scope["url_route"]["kwargs"]["session_id"]
        if "\x00" in session_id or not await database_sync_to_async(ChatSession.objects.filter(pk=session_id).exists)():
            # Accepted, then closed: a handshake refused before accept() reaches the page as 1006, which it
            # retries for ever; 4404 tells it the session does not exist (static/js/live.js says so).
            await self.accept()
            await self.close(code=4404)
            return
        cookies = self.scope.get("cookies") or {}
        self.view = fragments.DetailView(self.scope["user"], session_id, csrf_token=cookies.get("csrftoken", ""))
        self.pending: list[dict[str, Any]] | None = []  # None once resumed
        await self._join_and_accept(group_for_session(session_id))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.watch is None or not await self.watch.holds():
            return
        try:
            data = json.loads(text_data or "")
            if data.get("type") != "resume":
                return
            after, page = max(0, int(data.get("after") or 0)), max(1, int(data.get("page") or 1))
        except (ValueError, TypeError, AttributeError, OverflowError, RecursionError):  # not a resume: ignored
            return
        await self.resume(after, data.get("order") != "oldest", bool(data.get("tail", True)), page)

    async def resume(self, after: int, newest_first: bool, tail: bool, page: int) -> None:
        """Replay what is stored after ``after``, then the live events held since connecting.

        Also sent again after an HTTP swap replaced the history: the page then has an empty running
        turn, so the next event of a turn in progress opens it again (``turn_id`` forgotten).
        """
        view = self.view
        view.cursor, view.newest_first, view.tail, view.page = after, newest_first, tail, page
        view.turn_id = ""
        html, _ids = await database_sync_to_async(fragments.committed_from_db)(view, False)
        await self._send(html + fragments.status("Live updates on.", "ok"))
        pending, self.pending = self.pending or [], None
        for message in pending:
            await self.dispatch(message)

    async def live_event(self, message: dict[str, Any]) -> None:
        if self._hold(message):
            return
        event = message["event"]
        if event["kind"] == "turn_completed":
            self.view.turn_id = ""
            html, _ids = await database_sync_to_async(fragments.committed_from_db)(self.view)
        else:
            html = fragments.render_event(self.view, event)
            if event["kind"] == "turn_failed":
                self.view.turn_id = ""
            if event["kind"] in ("turn_started", "turn_failed"):  # (a completed turn's re-read has it too)
                # The takeover panel offers "after this turn" / "stop it now" while a turn runs, and not after.
                html += await database_sync_to_async(fragments.takeover_from_db)(self.view)
        await self._send(html)

    async def live_action(self, message: dict[str, Any]) -> None:
        if self._hold(message):
            return
        action = message["action"]
        if action["kind"] == "delete":
            await self._send(fragments.deleted(action))
            return
        html = await database_sync_to_async(fragments.history_from_db)(self.view, fragments.action_note(action))
        await self._send(html or "")

    async def live_reply(self, message: dict[str, Any]) -> None:
        """An operator reply's delivery changed (``{"type": "live.reply", "reply": {"id", "session_id"}}``)."""
        if self._hold(message):
            return
        reply_id = message.get("reply", {}).get("id")
        if isinstance(reply_id, int):
            await self._send(await database_sync_to_async(fragments.reply_from_db)(self.view, reply_id))

    def _hold(self, message: dict[str, Any]) -> bool:
        if self.pending is None:
            return False
        if len(self.pending) < PENDING_LIMIT:
            self.pending.append(message)
        return True
