"""Responses handed to the server no faster than the client reads them (ASGI middleware for daphne).

An ASGI ``send`` says nothing about the client: daphne writes each body message to its Twisted transport at
once, whatever the transport still holds. A streamed response (the bulk export) to a client that reads slowly,
or pauses, was therefore produced whole into the server's memory, once per paused client (measured in
docs/performance.md, "Slow export readers").

:class:`PacedResponses` wraps the HTTP application. Under daphne (its ``send`` is bound to the request, a
``twisted.web.http.Request``) it registers a streaming producer on the request for the response's lifetime
(Twisted's ``IConsumer.registerProducer``): the transport pauses it when its send buffer is full and resumes it
once the client has read it down; after each body message the response waits while it is paused. So a slow
reader holds one chunk and the transport's buffer, and the stream goes on as the client reads. A client that
goes away stops the producer and ends the wait (Django then cancels the response). Under another server the
application is called as it is: uvicorn's ``send`` waits for its transport's buffer itself. A ``send`` that
comes from daphne but is not bound to a request this module recognises (a daphne release that binds it
differently) is logged once as a warning: responses then go unpaced.

After a response whose client made it wait, the C allocator is asked to return its free memory to the system
(glibc's ``malloc_trim``; elsewhere nothing), on a worker thread: it walks the allocator's heaps, which takes
longer the more memory the process holds, and the event loop must not wait for it. What slow readers held is
freed when they go, but stayed in the process's resident memory without it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import threading
from typing import Any

__all__ = ["PacedResponses"]

logger = logging.getLogger("chatflow_site.pacing")


def _allocator_trim() -> Any:
    """glibc's ``malloc_trim``, or None (another C library, or none found)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_trim = _allocator_trim()
_trimming = threading.Lock()  # held while a trim runs: one at a time, a trim asked for meanwhile is skipped


def _trim_now() -> None:
    if _trim is not None and _trimming.acquire(blocking=False):
        try:
            _trim(0)
        finally:
            _trimming.release()


class _Reader:
    """A Twisted push producer (``pauseProducing``/``resumeProducing``/``stopProducing``) as an asyncio event:
    set while the client keeps up. Called on the reactor's thread, which is the event loop's under daphne."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.ready = asyncio.Event()
        self.ready.set()
        self.registered = False
        self.waited = False  # the client did not keep up at least once

    def pauseProducing(self) -> None:  # noqa: N802 - Twisted's interface
        self.waited = True
        self.ready.clear()

    def resumeProducing(self) -> None:  # noqa: N802
        self.ready.set()

    def stopProducing(self) -> None:  # noqa: N802 - the client went away
        self.ready.set()

    def register(self) -> None:
        if self.request.producer is None and self.request.channel is not None:
            self.request.registerProducer(self, True)
            self.registered = True

    def unregister(self) -> None:
        """Before the last body message: the request finishes with it, and its connection may carry a next
        request, whose producer slot must be free."""
        if self.registered:
            self.registered = False
            if self.request.producer is self and self.request.channel is not None:
                self.request.unregisterProducer()


def _twisted_request(send: Any) -> Any:
    """The ``twisted.web.http.Request`` daphne bound ``send`` to, or None (another server)."""
    request = send.args[0] if isinstance(send, functools.partial) and send.args else None
    try:
        from twisted.web.http import Request
    except ImportError:
        return None
    return request if isinstance(request, Request) else None


def _from_daphne(send: Any) -> bool:
    """True when ``send`` is daphne's (its function or bound method is defined in the daphne package)."""
    func = getattr(send, "func", send)
    return (getattr(func, "__module__", None) or "").split(".")[0] == "daphne"


class PacedResponses:
    """ASGI middleware for ``http`` scopes: see the module docstring. ``waiting``: how many responses are
    waiting for their client to read now."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.waiting = 0
        self._warned = False
        self._trims: set[asyncio.Future[None]] = set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        request = _twisted_request(send) if scope["type"] == "http" else None
        if request is None:
            if scope["type"] == "http" and not self._warned and _from_daphne(send):
                self._warned = True
                logger.warning("Serving under daphne, but its send is not bound to a request as expected: "
                               "streamed responses are not paced to their clients (slow readers hold them in memory)")
            await self.app(scope, receive, send)
            return
        reader = _Reader(request)

        async def paced(message: dict[str, Any]) -> None:
            kind = message["type"]
            more = kind == "http.response.body" and message.get("more_body", False)
            if kind == "http.response.start":
                reader.register()
            elif kind == "http.response.body" and not more:
                reader.unregister()
            await send(message)
            if more and not reader.ready.is_set():
                self.waiting += 1
                try:
                    await reader.ready.wait()
                finally:
                    self.waiting -= 1

        try:
            await self.app(scope, receive, paced)
        finally:
            reader.unregister()
            if reader.waited and _trim is not None:
                trim = asyncio.get_running_loop().run_in_executor(None, _trim_now)  # off the event loop
                self._trims.add(trim)
                trim.add_done_callback(self._trims.discard)
