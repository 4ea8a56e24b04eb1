"""Live updates from the embedded worker process: its channel layer publishes, relayed to the server's.

The embedded worker runs in a child process of the server (see :mod:`webhooks_app.embedded`). With
Redis (``REDIS_URL``) both share the channel layer and nothing here is used. With the default
in-memory layer the child's layer is :class:`RelayChannelLayer`: ``group_send`` writes one JSON line
``{"group": …, "message": …}`` to a pipe the server reads (:func:`forward`), and the server puts each
message on its own in-memory layer, in order, from its serving event loop — where the console's and
the live chat's consumers listen. Messages on the layer are JSON-safe dicts by contract
(:mod:`sessions_app.live`; msgpack on Redis), so JSON carries them unchanged (lone surrogates too:
``\\udxxx`` escapes round-trip).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
from typing import Any

from channels.layers import BaseChannelLayer

from sessions_app.live import publisher

__all__ = ["RelayChannelLayer", "forward", "serving_loop"]

logger = logging.getLogger("webhooks_app.worker")


class RelayChannelLayer(BaseChannelLayer):
    """``CHANNEL_LAYERS`` backend of the embedded worker process: ``group_send`` only, to the server.

    ``CONFIG``: ``{"fd": <write end of the pipe>}`` (settings: ``CHATFLOW_LIVE_RELAY_FD``, set by the
    server for its child). A worker only publishes; it serves no consumer, so it has no channels.
    Once the server is gone (broken pipe) messages are dropped: nobody could receive them.
    """

    extensions = ["groups"]

    def __init__(self, fd: int, expiry: int = 60, capacity: int = 100, channel_capacity: Any = None) -> None:
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity)
        self.fd = int(fd)
        self._lock = threading.Lock()  # a line longer than PIPE_BUF is written in pieces
        self._broken = False

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self.require_valid_group_name(group)
        line = json.dumps({"group": group, "message": message}, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            if self._broken:
                return
            try:
                view = memoryview(line)
                while view:
                    view = view[os.write(self.fd, view):]
            except OSError as err:  # the server died: the worker finishes what it holds, then stops
                self._broken = True
                logger.warning("The server's live relay is gone (%s): live updates of this worker are dropped", err)

    async def group_add(self, group: str, channel: str) -> None:
        raise NotImplementedError("the embedded worker's relay layer only publishes (group_send)")

    async def group_discard(self, group: str, channel: str) -> None:
        raise NotImplementedError("the embedded worker's relay layer only publishes (group_send)")


def serving_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop this process serves ASGI on, where its websocket consumers run, if known.

    daphne (and its ``runserver``) runs Twisted's asyncio reactor on ``daphne.server.twisted_loop``;
    uvicorn and hypercorn import the application inside their running loop, which
    :func:`remember_loop` records at start-up.
    """
    if _loop is not None and not _loop.is_closed():
        return _loop
    daphne = sys.modules.get("daphne.server")
    loop = getattr(daphne, "twisted_loop", None)
    return loop if loop is not None and not loop.is_closed() else None


_loop: asyncio.AbstractEventLoop | None = None


def remember_loop() -> None:
    """At start-up: remember the running event loop, if the application is loaded inside one."""
    global _loop
    try:
        _loop = asyncio.get_running_loop()
    except RuntimeError:
        pass


def _publish(messages: list[tuple[str, dict[str, Any]]]) -> None:
    publisher.send_soon(messages)  # one drain task per loop: the child's order is kept


def _decode(lines: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for line in lines:
        try:
            item = json.loads(line)
            out.append((item["group"], item["message"]))
        except (ValueError, KeyError, TypeError):
            logger.exception("Dropping a malformed live relay line from the embedded worker: %r", line[:200])
    return out


def forward(fd: int, pid: int) -> None:
    """Read the child ``pid``'s relay pipe until it closes; put its messages on this process's layer.

    Runs on a thread of its own (blocking reads); each batch of lines is handed to the serving loop
    with ``call_soon_threadsafe``. Messages that arrive before the loop is known are dropped, like a
    ``group_send`` to a group nobody has joined yet.
    """
    pending = b""
    warned = False
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            messages = _decode([line for line in lines if line])
            loop = serving_loop()
            if loop is None:
                if not warned:
                    logger.warning("No serving event loop known in this process: live updates of the embedded "
                                   "worker (pid %s) are dropped; set REDIS_URL to share a channel layer", pid)
                    warned = True
                continue
            if messages:
                try:
                    loop.call_soon_threadsafe(_publish, messages)
                except RuntimeError:  # the loop closed: the server is shutting down
                    return
