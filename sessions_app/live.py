"""The live path's publishing side: run events and operator actions → channel layer groups.

Group names come from :func:`group_for_session` and :data:`LIST_GROUP` only. A session id is any
string (``+15550100``, ``a/b``, ``olá 👋``), a group name only ASCII letters, digits, ``-_.`` and
under 100 characters, so the id is hashed (SHA-256 of its UTF-8 bytes; lone surrogates kept through
``surrogatepass`` so distinct ids never collide on encoding).

Messages on the layer are plain JSON-safe dicts (msgpack on Redis):

* ``{"type": "live.event", "event": {...}}`` — one run event, :func:`encode_event`'s shape
  (``kind`` = the event's ``type`` literal, its fields, pydantic values dumped as JSON);
* ``{"type": "live.action", "action": {...}}`` — an operator action from the audit log
  (``id``, ``kind``, ``session_id``, ``actor``, ``before``, ``after``);
* ``{"type": "live.reply", "reply": {"id", "session_id", "status"}}`` — an operator reply's delivery
  changed (sending → sent / failed), :func:`publish_reply`; the session page re-renders that message.

The Runner awaits its subscribers inside the turn, so :class:`Publisher` only puts the messages on a
per-event-loop queue and returns; one drain task per loop sends them in order. A send that fails is
logged, never raised into the turn: while the layer is unreachable (Redis down) its messages are dropped
with one warning for the whole outage, and one line when a send succeeds again (:class:`LayerOutage`).
Operator actions are published after their transaction commits. A run event nobody can receive is neither
built by the Runner nor encoded (:meth:`Publisher.wants`, :func:`has_receivers`): on the in-memory layer,
when neither its session's group nor (for the list's kinds) the list's group has a member in this
process — a standalone worker's run events cost nothing then. Who is a member is this module's own record
(:data:`receivers`): the console's consumers join and leave groups through :func:`join` and :func:`leave`,
which keep it.

With the in-memory channel layer only the serving process sees its own events: a second process
(``manage.py chatflow_chat``, ``chatflow_worker``) that runs turns warns loudly (log and stderr) when it
builds the site's Runner (:func:`warn_unless_serving`, a runtime hook); the process that loads the
websocket routes (``console_app.routing``) is the serving one and does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import DatabaseError, transaction
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from chatflow_agent.jsonsafe import json_safe

__all__ = [
    "CLOSE_DATABASE_AWAY", "CLOSE_LAYER_UNREACHABLE", "LIST_GROUP", "LayerGuard", "LayerOutage", "Publisher",
    "Receivers", "encode_event",
    "group_for_session", "group_send",
    "has_receivers", "join", "leave", "mark_serving", "receivers",
    "flush_before_close", "outage", "publish_action", "publish_reply", "publisher",
    "mark_unwatched", "warn_if_isolated", "warn_unless_serving",
]

logger = logging.getLogger("sessions_app.live")

LIST_GROUP = "chatflow.sessions"
#: Run events the session list reacts to (the others only go to the session's own group).
LIST_KINDS = frozenset({"turn_started", "turn_completed", "turn_failed"})
QUEUE_LIMIT = 10_000
#: Operator actions that change a session or what its customer received (exports and webhook retries change
#: neither; a resent reply reaches the customer).
BROADCAST_ACTIONS = frozenset({"force_handoff", "rollback", "delete", "resend_reply",
                               # human takeover (takeover_app.service.ACTIONS)
                               "take_over", "hand_back", "operator_reply", "human_requested", "cancel_turn",
                               "takeover_idle", "escalation_not_needed"})
#: Session ids whose group names are cached (every run event of a turn names its session's group).
GROUP_NAME_CACHE = 4096


@functools.lru_cache(maxsize=GROUP_NAME_CACHE)
def group_for_session(session_id: str) -> str:
    """The channel layer group of one session: valid for any session id, 50 ASCII characters."""
    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:40]
    return f"chatflow.s.{digest}"


def dom_id(session_id: str) -> str:
    """An HTML id fragment for a session (same hash as the group): ``row-<dom_id>`` in the list."""
    return group_for_session(session_id).rsplit(".", 1)[1][:24]


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        try:
            return json.loads(value.model_dump_json())
        except (TypeError, ValueError):
            return json_safe(value.model_dump())
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return json_safe(value)


def encode_event(event: Any) -> dict[str, Any]:
    """A run event as a JSON-safe dict: ``{"kind": event.type, **fields}``."""
    out: dict[str, Any] = {"kind": event.type}
    for f in dataclasses.fields(event):
        if f.name != "type":
            out[f.name] = _plain(getattr(event, f.name))
    return out


def _groups(session_id: str, event_type: str) -> list[str]:
    """The groups a run event of ``event_type`` on ``session_id`` goes to."""
    groups = [group_for_session(session_id)]
    if event_type in LIST_KINDS:
        groups.append(LIST_GROUP)
    return groups


class Receivers:
    """The channel layer groups this process's consumers are members of, per layer object: group name →
    channel names (a layer built afresh, e.g. after ``channel_layers.backends.clear()``, has none).

    Kept by :func:`join` and :func:`leave` (idempotent: a channel leaving a group it never joined, or
    twice, changes nothing). Thread-safe: consumers run on the serving loop, publishers on any loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: weakref.WeakKeyDictionary[Any, dict[str, set[str]]] = weakref.WeakKeyDictionary()

    def joined(self, layer: Any, group: str, channel: str) -> None:
        with self._lock:
            self._members.setdefault(layer, {}).setdefault(group, set()).add(channel)

    def left(self, layer: Any, group: str, channel: str) -> None:
        with self._lock:
            groups = self._members.get(layer, {})
            members = groups.get(group)
            if members is not None:
                members.discard(channel)
                if not members:
                    del groups[group]

    def any(self, layer: Any, groups: list[str]) -> bool:
        """True when one of ``groups`` of ``layer`` has a member in this process."""
        with self._lock:
            joined = self._members.get(layer, {})
            return any(group in joined for group in groups)


#: This process's consumers' group memberships (the in-memory layer delivers to nobody else).
receivers = Receivers()


async def join(layer: Any, group: str, channel: str) -> None:
    """``layer.group_add(group, channel)``, recorded in :data:`receivers` once the layer accepted it."""
    await layer.group_add(group, channel)
    receivers.joined(layer, group, channel)


async def leave(layer: Any, group: str, channel: str) -> None:
    """``layer.group_discard(group, channel)``; the channel is no longer a receiver even if that raises."""
    receivers.left(layer, group, channel)
    await layer.group_discard(group, channel)


def has_receivers(layer: Any, groups: list[str]) -> bool:
    """False when no message sent to ``groups`` can be received: ``layer`` is an in-memory layer (which
    delivers only to this process's consumers) and no consumer of this process joined one of the groups
    (:data:`receivers`). True for every other layer (Redis: other processes listen; the embedded worker's
    relay: the server does)."""
    if not isinstance(layer, InMemoryChannelLayer):
        return True
    return receivers.any(layer, groups)


#: What a send raises when the channel layer's server cannot be reached (as opposed to a bad message).
UNREACHABLE = (OSError, RedisConnectionError, RedisTimeoutError)


class LayerOutage:
    """The channel layer's reachability as this process's sends see it: one log line per change.

    :meth:`failed` on the first unreachable send logs one warning (the error, not a traceback) and
    counts the messages dropped after it; :meth:`sent` after an outage logs its end (duration in
    seconds, messages dropped) at INFO. :attr:`failures` counts every failure this process saw: an open
    websocket that saw it change may have missed a message (:mod:`sessions_app.sockets`). Thread-safe: sends
    run on several event loops and threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._dropped = 0
        self.failures = 0

    def failed(self, err: BaseException) -> None:
        with self._lock:
            self._dropped += 1
            self.failures += 1
            if self._since is not None:
                return
            self._since = time.monotonic()
        logger.warning("Channel layer unreachable (%s: %s): live updates are dropped until it is back",
                       type(err).__name__, err)

    def sent(self) -> None:
        if self._since is None:
            return
        with self._lock:
            if self._since is None:
                return
            seconds, dropped = time.monotonic() - self._since, self._dropped
            self._since, self._dropped = None, 0
        logger.info("Channel layer reachable again after %.1f s: live updates resume (%d messages dropped)",
                    seconds, dropped)


#: This process's view of the layer, shared by every send below.
outage = LayerOutage()

#: The close code of a websocket whose consumer could not reach the channel layer's server: 1013, "try again
#: later" (RFC 6455's registry), which htmx's ws extension reconnects after (static/js/ws.js paces it).
CLOSE_LAYER_UNREACHABLE = 1013
#: Close code of a websocket whose login or consumer could not read the database: the page reconnects.
CLOSE_DATABASE_AWAY = 1011


class LayerGuard:
    """ASGI middleware around the websockets' whole stack (the login's middleware included): a connection that
    stops because the channel layer's server cannot be reached (:data:`UNREACHABLE`: joining its group, or
    receiving) closes with :data:`CLOSE_LAYER_UNREACHABLE` and the outage is logged once (:data:`outage`); one
    that stops because the database did not answer (reading the login at the handshake, or in a consumer) closes
    with :data:`CLOSE_DATABASE_AWAY` and one warning line. Either is accepted first, so the browser sees the
    code, and neither is a traceback per connection attempt. Other errors are raised."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        state = {"accepted": False, "closed": False}

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "websocket.accept":
                state["accepted"] = True
            elif message["type"] == "websocket.close":
                state["closed"] = True
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except UNREACHABLE as err:
            outage.failed(err)
            code = CLOSE_LAYER_UNREACHABLE
        except DatabaseError as err:
            logger.warning("Websocket %s closed: the database does not answer (%s: %s)", scope.get("path", ""),
                           type(err).__name__, (str(err).strip().splitlines() or [""])[0])
            code = CLOSE_DATABASE_AWAY
        else:
            return
        if state["closed"]:
            return
        with contextlib.suppress(Exception):  # the client may be gone already
            if not state["accepted"]:
                await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": code})


async def group_send(layer: Any, group: str, message: dict[str, Any]) -> None:
    """``layer.group_send``, reporting reachability to :data:`outage`; an unreachable layer is not raised."""
    try:
        await layer.group_send(group, message)
    except UNREACHABLE as err:
        outage.failed(err)
    else:
        outage.sent()


class Publisher:
    """Run-event subscriber: ``publisher(event)`` queues the event's messages and returns at once."""

    def __init__(self) -> None:
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Queue] = weakref.WeakKeyDictionary()
        self._tasks: set[asyncio.Task[None]] = set()

    def wants(self, session_id: str, event_type: str) -> bool:
        """The Runner asks before it builds an event (``Runner.subscribe``): False when nobody can receive it
        (:func:`has_receivers`), so a standalone worker's turns build no events for this publisher."""
        return has_receivers(get_channel_layer(), _groups(session_id, event_type))

    def __call__(self, event: Any) -> None:
        groups = _groups(event.session_id, event.type)
        if not has_receivers(get_channel_layer(), groups):
            return  # nobody in this process listens (a standalone worker on the in-memory layer): no encoding
        try:
            message = {"type": "live.event", "event": encode_event(event)}
            messages = [(group, message) for group in groups]
        except Exception:
            logger.exception("Could not encode run event %s for the channel layer", getattr(event, "type", event))
            return
        self.send_soon(messages)

    def send_soon(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        """Queue ``(group, message)`` pairs for this event loop's drain task (started when idle)."""
        loop = asyncio.get_running_loop()
        queue = self._queues.get(loop)
        if queue is None:
            queue = self._queues[loop] = asyncio.Queue()
        if queue.qsize() + len(messages) > QUEUE_LIMIT:
            logger.warning("Live queue full (%d messages): dropping %d", queue.qsize(), len(messages))
            return
        idle = queue.empty() and not any(t.get_loop() is loop and not t.done() for t in self._tasks)
        for item in messages:
            queue.put_nowait(item)
        if idle:
            task = loop.create_task(self._drain(queue))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain(self, queue: asyncio.Queue) -> None:
        layer = get_channel_layer()
        while not queue.empty():
            group, message = queue.get_nowait()
            try:
                await group_send(layer, group, message)
            except Exception:
                logger.exception("Channel layer send to %s failed", group)

    async def flush(self) -> None:
        """Wait until this loop's queued messages were sent (tests, benchmarks, shutdown)."""
        loop = asyncio.get_running_loop()
        while any(t.get_loop() is loop and not t.done() for t in self._tasks):
            await asyncio.gather(*[t for t in self._tasks if t.get_loop() is loop], return_exceptions=True)


#: The process's publisher, subscribed to the site's Runner by agents_app's AppConfig.
publisher = Publisher()

#: Seconds a closing event loop waits for its queued live updates (a channel layer that is down fails
#: each send after its connect timeout; past this the rest are dropped).
FLUSH_TIMEOUT = 10.0


async def flush_before_close() -> None:
    """Send the live updates this event loop still has queued: for code whose loop is about to close
    (``asyncio.run`` of a command's turn), whose queued messages would otherwise be dropped with it."""
    try:
        await asyncio.wait_for(publisher.flush(), FLUSH_TIMEOUT)
    except TimeoutError:
        logger.warning("Live updates still queued after %.0f s were dropped", FLUSH_TIMEOUT)


def _action_message(entry: Any) -> dict[str, Any]:
    return {"type": "live.action", "action": {
        "id": entry.pk, "kind": entry.action, "session_id": entry.session_id, "actor": entry.actor_username,
        "before": json_safe(entry.before), "after": json_safe(entry.after),
    }}


async def _send_all(messages: list[tuple[str, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    for group, message in messages:
        await group_send(layer, group, message)


def publish_action(entry: Any) -> None:
    """Broadcast an operator action (an ``OperatorAction`` row) to its session's group and the list, now."""
    message = _action_message(entry)
    _broadcast([(group_for_session(entry.session_id), message), (LIST_GROUP, message)],
               f"operator action {entry.action} on {entry.session_id!r}")


def publish_reply(reply: Any) -> None:
    """Broadcast that an operator reply's (an ``OperatorReply`` row) delivery status changed, to its
    session's group, now (after the transaction that recorded it: call it once committed)."""
    message = {"type": "live.reply", "reply": {"id": reply.pk, "session_id": reply.session_id,
                                               "status": reply.status}}
    _broadcast([(group_for_session(reply.session_id), message)], f"the delivery of operator reply {reply.pk}")


def _broadcast(messages: list[tuple[str, dict[str, Any]]], what: str) -> None:
    """Send ``messages`` now: from sync code, waiting for the layer (a failure is logged, never raised);
    from an event loop, through the publisher (in order, without blocking the loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            async_to_sync(_send_all)(messages)
        except Exception:
            logger.exception("Broadcasting %s failed", what)
        return
    publisher.send_soon(messages)


def on_operator_action(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    """post_save receiver for OperatorAction: broadcast once the action's transaction has committed."""
    if created and instance.action in BROADCAST_ACTIONS:
        transaction.on_commit(lambda: publish_action(instance))


_serving = False
_unwatched = False


def mark_serving() -> None:
    """Called when this process loads the websocket routes: it serves the consumers itself."""
    global _serving
    _serving = True


def mark_unwatched() -> None:
    """Called by a process whose turns nobody watches live (the demo data seeder): it does not warn."""
    global _unwatched
    _unwatched = True


def warn_unless_serving(runner: Any = None) -> bool:
    """Runner hook: a process that runs turns without serving the websockets warns (in-memory layer only),
    unless it was :func:`mark_unwatched`."""
    if _serving or _unwatched:
        return False
    argv = [Path(sys.argv[0]).name, *sys.argv[1:2]] if sys.argv and sys.argv[0] else ["this process"]
    return warn_if_isolated(" ".join(argv))


def layer_is_in_memory() -> bool:
    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    return backend.endswith("InMemoryChannelLayer")


def warn_if_isolated(process: str) -> bool:
    """Warn loudly (log + stderr) when this process publishes into an in-memory channel layer.

    Call it at the start of every process that runs turns but does not serve the websockets
    (``chatflow_chat``, workers): with the in-memory layer its events never reach the server.
    Returns True when it warned.
    """
    if not layer_is_in_memory():
        return False
    text = (f"WARNING: {process} uses the in-memory channel layer: its run events stay in this process "
            "and will NOT reach the console's websockets. Set REDIS_URL (the same for the server and "
            "this process) to see its turns live.")
    logger.warning(text)
    if not _logged_to_stderr(logger):
        print(text, file=sys.stderr, flush=True)
    return True


def _logged_to_stderr(log: logging.Logger) -> bool:
    """True when a WARNING of ``log`` is written to this process's stderr by one of its handlers
    (the site's LOGGING gives the root logger one), so printing it as well would show it twice."""
    if not log.isEnabledFor(logging.WARNING):
        return False
    current: logging.Logger | None = log
    while current is not None:
        for handler in current.handlers:
            stream = getattr(handler, "stream", None)
            if (isinstance(handler, logging.StreamHandler) and handler.level <= logging.WARNING
                    and stream is not None and stream in (sys.stderr, sys.__stderr__)):
                return True
        current = current.parent if current.propagate else None
    return False
