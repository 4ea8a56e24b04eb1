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
    them, counted then, unless the newest session alone holds more. Histories that grow afterwards (the
    turn a session was taken for appends to it) are counted at the next :meth:`remember`, so between
    two calls the kept messages can exceed the bound by what the turns in progress appended. A session
    pushed out is loaded again on its next turn.

    The sync state belongs to the session object, not to the id: it lives as long as the object
    does, also once the id was forgotten (a deleted session's object keeps answering
    ``SessionDeletedError`` without a store lookup). Thread-safe.
    """

    def __init__(self, size: int, messages: int) -> None:
        self.size = size
        self.messages = messages
        self._weak: weakref.WeakValueDictionary[str, SessionContext] = weakref.WeakValueDictionary()
        self._lru: OrderedDict[str, SessionContext] = OrderedDict()
        self._states: weakref.WeakKeyDictionary[SessionContext, SyncState] = weakref.WeakKeyDictionary()
        self._mutex = threading.RLock()

    def get(self, session_id: str) -> SessionContext | None:
        with self._mutex:
            return self._weak.get(session_id)

    def remember(self, session: SessionContext) -> None:
        with self._mutex:
            sid = session.session_id
            self._weak[sid] = session
            self._lru[sid] = session
            self._lru.move_to_end(sid)
            while len(self._lru) > self.size:
                self._lru.popitem(last=False)
            held = sum(len(kept.history) for kept in self._lru.values())
            while held > self.messages and len(self._lru) > 1:
                _, dropped = self._lru.popitem(last=False)
                held -= len(dropped.history)

    def forget(self, session_id: str) -> SessionContext | None:
        """Drop ``session_id``; returns the session object it mapped to, if any."""
        with self._mutex:
            self._lru.pop(session_id, None)
            return self._weak.pop(session_id, None)

    def forget_all(self) -> list[SessionContext]:
        with self._mutex:
            sessions = list(self._weak.values())
            self._weak.clear()
            self._lru.clear()
        return sessions

    def state(self, session: SessionContext) -> SyncState:
        """``session``'s sync state (a fresh one, not stored, the first time)."""
        try:
            return self._states[session]
        except KeyError:
            with self._mutex:
                return self._states.setdefault(session, SyncState())
