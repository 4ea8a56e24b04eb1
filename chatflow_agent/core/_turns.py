"""The persistent stores' turn/lease core: taking, keeping and giving back a session's lease.

A turn first holds the in-process FIFO lock (``SessionLocks``), then the session's cross-process
lease (the backend's ``acquire_lease``, polled with backoff: the backend keeps the FIFO line). While
the turn runs, its lease is renewed every third of its TTL — by a task of the turn's event loop
(async turns) or by the core's keeper thread (sync turns, which have no loop). A commit releases
the lease in its own transaction; a turn that does not commit releases it here.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from typing import TypeVar

from chatflow_agent.core._bridge import BlockingBridge
from chatflow_agent.core.backend import SessionBackend, TurnReport
from chatflow_agent.core.sql import PURGE_EVERY_SECONDS
from chatflow_agent.exceptions import SessionBusyError

__all__ = ["LeaseCore", "new_lease_owner"]

logger = logging.getLogger("chatflow_agent.memory")
_T = TypeVar("_T")

_FIRST_DELAY, _MAX_DELAY = 0.002, 0.05  # seconds between polls for a busy lease, doubling


def _process_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}:"


_owner_prefix = _process_tag()
_owner_serial = itertools.count(1)


def _new_process() -> None:
    global _owner_prefix, _owner_serial
    _owner_prefix, _owner_serial = _process_tag(), itertools.count(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_process)


def new_lease_owner() -> str:
    """``host:pid:random:serial``: unique per turn, and says which process holds a lease."""
    return f"{_owner_prefix}{next(_owner_serial)}"


class _Heartbeat:
    """Renews a lease from the event loop every third of its TTL. Most turns end before the first
    renewal, so the renewing task is only started by a timer (a task per turn is not free)."""

    __slots__ = ("_timer", "_tasks", "_turn", "_loop", "lost")

    def __init__(self, core: LeaseCore, session_id: str, owner: str) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self._loop = asyncio.get_running_loop()
        self._turn = asyncio.current_task()  # the turn's task: stopped when the lease is lost
        #: True once the lease was lost (not renewed, or taken away): the turn was told to stop
        self.lost = False
        self._timer = self._loop.call_later(
            core.ttl_seconds / 3,
            lambda: self._tasks.append(asyncio.ensure_future(core.renew_loop(session_id, owner, self))))

    def lose(self) -> None:
        """Thread-safe: the lease is gone, so stop the turn now (its task is cancelled; the store
        turns that into ``SessionBusyError`` and rolls the turn back)."""
        def stop() -> None:
            if not self.lost:
                self.lost = True
                if self._turn is not None:
                    self._turn.cancel()

        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(stop)

    def forgive(self) -> None:
        """On the turn's task, after it caught the cancellation :meth:`lose` caused: undo it."""
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            task.uncancel()

    async def stop(self) -> None:
        self._timer.cancel()
        for task in self._tasks:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task


class LeaseCore:
    """Leases of one store's turns over ``backend``; owns the purge clock and the keeper thread.

    ``ttl_seconds``: how long a lease lives without renewal, so how long a session stays blocked
    after the process running a turn on it died.
    """

    def __init__(self, backend: SessionBackend, bridge: BlockingBridge, ttl_seconds: float) -> None:
        self.backend = backend
        self.bridge = bridge
        self.ttl_seconds = ttl_seconds
        self._last_purge = 0.0
        self._mutex = threading.Lock()
        self._kept: set[tuple[str, str]] = set()  # leases of running sync turns
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()

    # ---- blocking steps -------------------------------------------------------------------------
    def try_acquire(self, session_id: str, owner: str, queue: bool, report: TurnReport | None = None) -> bool:
        """One try at the lease (blocking); purges expired leases now and then. ``report``: the turn's,
        opened by the backend with the lease (its start time is this try's)."""
        if report is None:
            if not self.backend.acquire_lease(session_id, owner, self.ttl_seconds, queue):
                return False
        else:
            report.begin(owner)
            if not self.backend.acquire_lease(session_id, owner, self.ttl_seconds, queue, report):
                return False
        if time.time() - self._last_purge > PURGE_EVERY_SECONDS:
            try:
                self.purge_expired()
            except Exception:  # noqa: BLE001 - tidying only: the turn goes on, the next purge retries
                logger.exception("Purging expired session leases failed")
        return True

    def purge_expired(self) -> int:
        """Delete lease and waiter rows that expired more than ``ttl_seconds`` ago; how many."""
        self._last_purge = time.time()
        return self.backend.purge_leases(self._last_purge - self.ttl_seconds)

    def _abandon(self, session_id: str, owner: str, queued: bool, report: TurnReport | None) -> None:
        if queued:
            self.backend.leave_queue(session_id, owner)
        self.release_blocking(session_id, owner, report)

    def release_blocking(self, session_id: str, owner: str, report: TurnReport | None) -> None:
        """Give the lease back, closing the turn's record when there is a report."""
        if report is None:
            self.backend.release_lease(session_id, owner)
        else:
            self.backend.release_lease(session_id, owner, report)

    def _renew(self, session_id: str, owner: str) -> bool:
        if not self.backend.renew_lease(session_id, owner, self.ttl_seconds):
            logger.warning("Lost the lease of session %r while a turn was running; the turn is stopped", session_id)
            return False
        return True

    # ---- async turns ----------------------------------------------------------------------------
    async def acquire(self, session_id: str, owner: str, wait: bool,
                      begin: Callable[[str, str, bool], tuple[bool, _T]], report: TurnReport | None = None) -> _T:
        """Poll ``begin(session_id, owner, wait)`` (a blocking hop that tries the lease, then reads)
        on the session's thread until it got the lease; its result. ``SessionBusyError`` at once
        when not ``wait``; a cancellation leaves the line and gives back a lease won meanwhile."""
        delay = _FIRST_DELAY
        try:
            while True:
                ok, value = await self.bridge.run(session_id, begin, session_id, owner, wait)
                if ok:
                    return value
                if not wait:
                    raise SessionBusyError(session_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)
        except asyncio.CancelledError:
            # ``begin`` may still have won the lease on its thread after we were cancelled: this
            # runs after it, on the same thread. Its own errors already released the lease.
            if report is not None and report.status == "running":
                report.end("cancelled", "CancelledError: cancelled while waiting for the session")
            await asyncio.shield(self.bridge.submit(session_id, self._abandon, (session_id, owner, wait, report)))
            raise
        except BaseException:
            if wait:
                await asyncio.shield(self.bridge.submit(session_id, self.backend.leave_queue, (session_id, owner)))
            raise

    def heartbeat(self, session_id: str, owner: str) -> _Heartbeat:
        """Keep renewing the lease from the running loop until ``await beat.stop()``."""
        return _Heartbeat(self, session_id, owner)

    async def renew_loop(self, session_id: str, owner: str, beat: _Heartbeat) -> None:
        """Renew the lease every third of its TTL until it is lost (the heartbeat task); a lost lease
        stops the turn (``beat.lose()``): its commit would be refused anyway."""
        while True:
            if not await self.bridge.run(session_id, self._renew, session_id, owner):
                beat.lose()
                return
            await asyncio.sleep(self.ttl_seconds / 3)

    async def release(self, session_id: str, owner: str, report: TurnReport | None = None) -> None:
        """Give the lease back (the write completes even if the caller is cancelled)."""
        await asyncio.shield(self.bridge.submit(session_id, self.release_blocking, (session_id, owner, report)))

    # ---- sync turns -----------------------------------------------------------------------------
    def acquire_sync(self, session_id: str, owner: str, wait: bool,
                     begin: Callable[[str, str, bool], tuple[bool, _T]]) -> _T:
        """Blocking twin of :meth:`acquire`."""
        delay = _FIRST_DELAY
        try:
            while True:
                ok, value = begin(session_id, owner, wait)
                if ok:
                    return value
                if not wait:
                    raise SessionBusyError(session_id)
                time.sleep(delay)
                delay = min(delay * 2, _MAX_DELAY)
        except BaseException:
            if wait:
                self.backend.leave_queue(session_id, owner)
            raise

    def keep(self, session_id: str, owner: str) -> None:
        """Renew this lease every third of its TTL from the keeper thread until :meth:`unkeep`."""
        with self._mutex:
            self._kept.add((session_id, owner))
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keeper_loop, name="chatflow-lease-keeper", daemon=True)
                self._keeper.start()

    def unkeep(self, session_id: str, owner: str) -> None:
        with self._mutex:
            self._kept.discard((session_id, owner))

    def _keeper_loop(self) -> None:
        stop = self._keeper_stop
        while not stop.wait(self.ttl_seconds / 3):
            with self._mutex:
                kept = list(self._kept)
            for session_id, owner in kept:
                try:
                    renewed = self.backend.renew_lease(session_id, owner, self.ttl_seconds)
                except Exception:  # noqa: BLE001 - retried on the next tick
                    logger.exception("Renewing the lease of session %r failed", session_id)
                    continue
                with self._mutex:
                    lost = not renewed and (session_id, owner) in self._kept
                if lost:
                    logger.warning("Lost the lease of session %r while a turn was running", session_id)

    def close(self) -> None:
        """Stop the keeper thread (a later sync turn starts a new one)."""
        with self._mutex:
            keeper, self._keeper = self._keeper, None
            stop, self._keeper_stop = self._keeper_stop, threading.Event()
        if keeper is not None:
            stop.set()
            keeper.join()
