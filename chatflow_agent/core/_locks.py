"""Per-session FIFO locks that work across tasks, event loops and threads of one process.

An ``asyncio.Lock`` belongs to one event loop, but one store is used from the Runner's loop,
from ``Runner.run`` (a fresh loop each call) and from Django's sync views (threads). These
locks are granted strictly in arrival order to async and sync waiters alike.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from chatflow_agent.exceptions import SessionBusyError

__all__ = ["SessionLocks"]


class _Entry:
    __slots__ = ("held", "waiters", "refs")

    def __init__(self) -> None:
        self.held = False
        self.waiters: deque[Any] = deque()
        self.refs = 0


class SessionLocks:
    """A registry of FIFO locks keyed by session id; entries vanish when nobody uses them."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def _enter(self, key: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.refs += 1
        return entry

    def _leave(self, key: str, entry: _Entry) -> None:
        entry.refs -= 1
        if entry.refs == 0 and not entry.held:
            self._entries.pop(key, None)

    def locked(self, key: str) -> bool:
        """True while a holder has the lock for ``key``."""
        with self._mutex:
            entry = self._entries.get(key)
            return bool(entry and entry.held)

    def try_acquire(self, key: str, queued: Callable[[], object] | None = None) -> bool:
        """Take the lock only if it is free and nobody waits; ``release`` it afterwards.

        ``queued``: called once the lock is taken (as in ``acquire_sync``); if it raises, the lock
        is released and the error propagates."""
        with self._mutex:
            entry = self._entries.get(key)
            if entry and (entry.held or entry.waiters):
                return False
            entry = self._enter(key)
            entry.held = True
        if queued is not None:
            try:
                queued()
            except BaseException:
                self.release(key)
                raise
        return True

    async def enter(self, key: str, wait: bool) -> None:
        """A turn's way into the line of ``key``: wait (FIFO) for the lock, or, when not ``wait``, take it
        only if it is free and nobody waits, else ``SessionBusyError``."""
        if wait:
            await self.acquire(key)
        elif not self.try_acquire(key):
            raise SessionBusyError(key)

    def enter_sync(self, key: str, wait: bool, queued: Callable[[], object] | None = None) -> None:
        """Blocking :meth:`enter`, with ``queued`` called as in :meth:`acquire_sync` / :meth:`try_acquire`."""
        if wait:
            self.acquire_sync(key, queued=queued)
        elif not self.try_acquire(key, queued=queued):
            raise SessionBusyError(key)

    async def acquire(self, key: str) -> None:
        """Wait (FIFO) for the lock of ``key``. Cancelling the wait leaves the lock consistent."""
        loop = asyncio.get_running_loop()
        with self._mutex:
            entry = self._enter(key)
            if not entry.held and not entry.waiters:
                entry.held = True
                return
            fut: asyncio.Future[None] = loop.create_future()
            entry.waiters.append((loop, fut))
        try:
            await fut
        except asyncio.CancelledError:
            with self._mutex:
                if (loop, fut) in entry.waiters:
                    entry.waiters.remove((loop, fut))
                    self._leave(key, entry)
                    raise
            if fut.done() and not fut.cancelled():
                self.release(key)  # granted just as we were cancelled: pass it on
            # else: _grant will find the future cancelled and pass the lock on
            raise

    def acquire_sync(self, key: str, timeout: float | None = None,
                     queued: Callable[[], object] | None = None) -> bool:
        """Blocking FIFO acquire for threads; False when ``timeout`` (seconds) runs out.

        ``queued``: called once this call has its place in the line (holding the lock, or first
        behind everyone already waiting), before it waits; whoever joins the line from then on,
        e.g. a turn that ``queued`` itself causes, comes after. If it raises, the place is given up
        and the error propagates."""
        event: threading.Event | None = None
        with self._mutex:
            entry = self._enter(key)
            if not entry.held and not entry.waiters:
                entry.held = True
            else:
                event = threading.Event()
                entry.waiters.append(event)
        if queued is not None:
            try:
                queued()
            except BaseException:
                if event is None or not self._withdraw(key, entry, event):
                    self.release(key)
                raise
        if event is None or event.wait(timeout):
            return True
        if self._withdraw(key, entry, event):
            return False
        return True  # granted just as the wait timed out

    def _withdraw(self, key: str, entry: _Entry, event: threading.Event) -> bool:
        """Leave the line before being granted the lock (True); False when it was granted already."""
        with self._mutex:
            if event in entry.waiters:
                entry.waiters.remove(event)
                self._leave(key, entry)
                return True
        return False

    def release(self, key: str) -> None:
        """Hand the lock of ``key`` to the next waiter, or free it."""
        with self._mutex:
            entry = self._entries[key]
            entry.refs -= 1
            while entry.waiters:
                waiter = entry.waiters.popleft()
                if isinstance(waiter, threading.Event):
                    waiter.set()
                    return
                loop, fut = waiter
                if loop.is_closed():
                    entry.refs -= 1
                    continue
                loop.call_soon_threadsafe(self._grant, key, fut)
                return
            entry.held = False
            if entry.refs == 0:
                self._entries.pop(key, None)

    def _grant(self, key: str, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():
            self.release(key)
        else:
            fut.set_result(None)


class BoundLock:
    """The object behind ``SessionContext.lock``: the store's lock for one session id.

    Supports ``async with`` (and ``locked()``) like ``asyncio.Lock``.
    """

    def __init__(self, locks: SessionLocks, key: str) -> None:
        self._locks = locks
        self._key = key

    def locked(self) -> bool:
        return self._locks.locked(self._key)

    async def acquire(self) -> bool:
        await self._locks.acquire(self._key)
        return True

    def release(self) -> None:
        self._locks.release(self._key)

    async def __aenter__(self) -> None:
        await self._locks.acquire(self._key)

    async def __aexit__(self, *exc: object) -> None:
        self._locks.release(self._key)
