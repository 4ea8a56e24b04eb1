"""The persistent stores' identity map: one live ``SessionContext`` per session id, and its sync state."""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

from chatflow_agent.core._session import SessionContext
from chatflow_agent.core._sync import SyncState

__all__ = ["IdentityMap"]


class IdentityMap:
    """Session ids to the live ``SessionContext`` objects (weakly, plus the most recently used kept
    alive: at most ``size`` sessions holding at most ``messages`` messages of history between them, the
    newest session always), and each live session object's ``SyncState``.

    The message bound is what keeps a long-running process's memory flat: histories grow with every
    turn (up to their ``max_turns``), so a bound on sessions alone lets the cache grow with the length
    of the conversations it has seen. What is bounded exactly: right after :meth:`remember` (a session
    taken for a turn or loaded), the kept sessions' histories hold at most ``messages`` messages between
    them, counted then, unless the newest session alone holds more. A history that grows afterwards (the
    turn a session was taken for appends to it) is counted again when its commit is written
    (:meth:`recount`), so the kept messages exceed the bound only by what turns in progress appended.
    Each kept session's count is remembered, so neither call walks the others. A session pushed out is
    loaded again on its next turn.

    The sync state belongs to the session object, not to the id: it lives as long as the object
    does, also once the id was forgotten (a deleted session's object keeps answering
    ``SessionDeletedError`` without a store lookup). Thread-safe.

    Each session id also has a lock (:meth:`lock`), the one its live objects write under: whoever
    creates, brings up to date, changes or commits a session holds it, so one thread's load never
    lands in the middle of another's commit, and two threads never both create the id's object.
    """

    def __init__(self, size: int, messages: int) -> None:
        self.size = size
        self.messages = messages
        self._weak: weakref.WeakValueDictionary[str, SessionContext] = weakref.WeakValueDictionary()
        # kept alive, least recently used first: session id → (session, its history's length when counted)
        self._lru: OrderedDict[str, tuple[SessionContext, int]] = OrderedDict()
        self._held = 0  # the counted lengths' sum
        self._states: weakref.WeakKeyDictionary[SessionContext, SyncState] = weakref.WeakKeyDictionary()
        # session id → its lock, while anything holds it (every session object of the id does)
        self._locks: weakref.WeakValueDictionary[str, threading.RLock] = weakref.WeakValueDictionary()
        self._mutex = threading.RLock()

    def lock(self, session_id: str) -> threading.RLock:
        """The lock of ``session_id``: the same object for as long as anything holds it (a session
        object bound to it, or a caller holding it), a new one after."""
        with self._mutex:
            lock = self._locks.get(session_id)
            if lock is None:
                lock = self._locks[session_id] = threading.RLock()
            return lock

    def get(self, session_id: str) -> SessionContext | None:
        with self._mutex:
            return self._weak.get(session_id)

    def remember(self, session: SessionContext) -> None:
        """Map ``session``'s id to it, keep it alive as the most recently used, and drop the least
        recently used sessions beyond the bounds."""
        with self._mutex:
            self._weak[session.session_id] = session
            self._keep(session)

    def recount(self, session: SessionContext) -> None:
        """``session``'s history changed (a commit was written): count it again if it is kept, and drop
        the least recently used sessions beyond the bounds."""
        with self._mutex:
            entry = self._lru.get(session.session_id)
            if entry is not None and entry[0] is session:
                self._keep(session, move=False)

    def _keep(self, session: SessionContext, move: bool = True) -> None:
        sid = session.session_id
        entry = self._lru.get(sid)
        if entry is not None:
            self._held -= entry[1]
        count = len(session.history)
        self._lru[sid] = (session, count)
        self._held += count
        if move:
            self._lru.move_to_end(sid)
        while len(self._lru) > self.size or (self._held > self.messages and len(self._lru) > 1):
            _, (_, dropped) = self._lru.popitem(last=False)
            self._held -= dropped

    def forget(self, session_id: str) -> SessionContext | None:
        """Drop ``session_id``; returns the session object it mapped to, if any."""
        with self._mutex:
            entry = self._lru.pop(session_id, None)
            if entry is not None:
                self._held -= entry[1]
            return self._weak.pop(session_id, None)

    def forget_all(self) -> list[SessionContext]:
        with self._mutex:
            sessions = list(self._weak.values())
            self._weak.clear()
            self._lru.clear()
            self._held = 0
        return sessions

    def state(self, session: SessionContext) -> SyncState:
        """``session``'s sync state (a fresh one, not stored, the first time)."""
        try:
            return self._states[session]
        except KeyError:
            with self._mutex:
                return self._states.setdefault(session, SyncState())
