"""What an open console websocket keeps checking: its login and the channel layer under it.

A websocket is authenticated once, when it connects; a page may stay open for days. So every consumer of
the site (the session list, a session, the live chat) watches its connection while it is open
(:class:`SocketWatch`):

* **its login** — the Django session it connected with must still log in the same user, active, with the
  consumer's permission: re-read on every frame the page sends and every :data:`WATCH_SECONDS` while it only
  receives. Once that login is gone (logged out, session expired or flushed, password changed, account
  deactivated or deleted) the socket closes with :data:`CLOSE_LOGGED_OUT` (4401); once the permission is gone
  (removed from Operators, no longer staff) with :data:`CLOSE_FORBIDDEN` (4403). The page says which and does
  not reconnect.
* **the channel layer** (Redis; the in-memory layer cannot fail) — a consumer that listens to a group sends
  itself a probe message through the layer every :data:`WATCH_SECONDS` (and joins its group again: a Redis
  server that restarted empty has forgotten it). When a probe cannot be sent within :data:`WATCH_SECONDS`,
  or :data:`LOST_PROBES` probes in a row have not come back, each after :data:`PROBE_PATIENCE` watches (a busy
  process delivers late, and one message can be lost while the layer works: neither is a deaf layer), or any other
  use of the layer in this process found it unreachable
  since the socket connected (:attr:`LayerOutage.failures`), the socket closes with
  :data:`~sessions_app.live.CLOSE_LAYER_UNREACHABLE` (1013, "try again later"): the page says so and
  reconnects, and a session page's reconnect replays what it missed. Without it a socket whose layer went
  away heard nothing and was told nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import InMemoryChannelLayer
from django.conf import settings
from django.contrib import auth

from sessions_app.access import may
from sessions_app.live import CLOSE_LAYER_UNREACHABLE, UNREACHABLE, outage

__all__ = ["CLOSE_FORBIDDEN", "CLOSE_LOGGED_OUT", "CLOSE_UNCHECKED", "WATCH_SECONDS", "SocketWatch", "login_refusal"]

#: Close code of a socket whose login is gone (as at connect: not logged in).
CLOSE_LOGGED_OUT = 4401
#: Close code of a socket whose user lost the permission it needs (as at connect).
CLOSE_FORBIDDEN = 4403
#: Close code of a socket whose login could not be checked (the database did not answer): the page
#: reconnects, and the new socket's connect() checks the login again.
CLOSE_UNCHECKED = 1011
#: Seconds between two checks of an open socket while the page sends nothing.
WATCH_SECONDS = 5.0

PROBE = {"type": "live.probe"}
#: Watches a probe may stay out before the socket counts it lost (no new probe is sent meanwhile).
PROBE_PATIENCE = 3
#: Probes lost one after the other before the socket counts the layer unreachable (after one, it probes again).
LOST_PROBES = 2

log = logging.getLogger(__name__)


class _Visit:
    """What ``django.contrib.auth.get_user`` reads of a request: its session."""

    def __init__(self, session: Any) -> None:
        self.session = session


def login_refusal(session_key: str | None, user_id: Any, perm: str) -> int:
    """0 while the Django session ``session_key`` still logs in user ``user_id`` (active, the password it
    logged in with) and that user may ``perm``; else the close code: :data:`CLOSE_LOGGED_OUT` or
    :data:`CLOSE_FORBIDDEN`. Reads the session and the user afresh (no cached permission)."""
    if not session_key:
        return CLOSE_LOGGED_OUT
    session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    user = auth.get_user(_Visit(session))  # type: ignore[arg-type]
    if not user.is_authenticated or user.pk != user_id:
        return CLOSE_LOGGED_OUT
    return 0 if may(user, perm) else CLOSE_FORBIDDEN


class SocketWatch:
    """One consumer's watch (see the module's docstring). ``start()`` after ``accept()``, ``holds()`` before
    serving a frame the page sent, ``stop()`` in ``disconnect()``; ``serving`` is False once it closed."""

    def __init__(self, consumer: Any, perm: str, group: str = "") -> None:
        self.consumer, self.perm, self.group = consumer, perm, group
        session = consumer.scope.get("session")
        self.session_key = getattr(session, "session_key", None) if session is not None else None
        self.user_id = consumer.scope["user"].pk
        self.serving = True
        self._outages = outage.failures
        self._probe_sent_at: float | None = None  # the event loop's time the probe still out was sent
        self._lost = 0  # probes lost one after the other
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        """Stop watching (the page went away); :meth:`holds` still answers for work it left queued."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def holds(self) -> bool:
        """Whether the login still holds; closes the socket (4401/4403) when it does not."""
        if not self.serving:
            return False
        code = await database_sync_to_async(login_refusal)(self.session_key, self.user_id, self.perm)
        if code:
            await self._close(code)
        return not code

    def probe_arrived(self) -> None:
        """The consumer's ``live_probe`` handler: the layer delivered the last probe."""
        self._probe_sent_at = None
        self._lost = 0

    async def _watch(self) -> None:
        while self.serving:
            await asyncio.sleep(WATCH_SECONDS)
            try:
                if not await self.holds() or not await self._layer_holds():
                    return
            except Exception as err:  # e.g. the database did not answer: the login cannot be checked
                # A socket whose login is no longer checked must not go on serving: it closes, and the page's
                # reconnect checks the login afresh in connect().
                log.warning("Closing a websocket whose login could not be checked: %s: %s",
                            type(err).__name__, str(err).splitlines()[0] if str(err) else "")
                await self._close(CLOSE_UNCHECKED)
                return

    async def _layer_holds(self) -> bool:
        layer = self.consumer.channel_layer
        if not self.group or isinstance(layer, InMemoryChannelLayer):
            return True
        now = asyncio.get_running_loop().time()
        if self._probe_sent_at is not None:  # the layer took the last probe and has not delivered it yet
            waited = now - self._probe_sent_at
            if waited >= PROBE_PATIENCE * WATCH_SECONDS:  # lost, not late
                self._lost += 1
                if self._lost >= LOST_PROBES:  # one after the other: the socket is deaf
                    outage.failed(TimeoutError(f"{self._lost} probes sent through the channel layer never came "
                                               f"back (the last {waited:.1f} s ago)"))
                else:  # one lost message is not a deaf layer: probe again
                    self._probe_sent_at = None
        if self._probe_sent_at is None and outage.failures == self._outages:
            try:
                async with asyncio.timeout(WATCH_SECONDS):
                    await layer.group_add(self.group, self.consumer.channel_name)
                    await layer.send(self.consumer.channel_name, PROBE)
            except (*UNREACHABLE, TimeoutError) as err:
                outage.failed(err)
            else:
                self._probe_sent_at = now
        if outage.failures == self._outages:
            return True
        await self._close(CLOSE_LAYER_UNREACHABLE)
        return False

    async def _close(self, code: int) -> None:
        if self.serving:
            self.serving = False
            with contextlib.suppress(Exception):  # the client may be gone already
                await self.consumer.close(code=code)
