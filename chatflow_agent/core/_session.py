"""SessionContext, the store contract (BaseSessionStore) and the in-memory SessionStore."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from chatflow_agent.core._locks import BoundLock, SessionLocks
from chatflow_agent.core._pruning import group_turns, prune_history
from chatflow_agent.core.hooks import TurnHooks
from chatflow_agent.core.reports import TurnReport
from chatflow_agent.exceptions import SessionDeletedError
from chatflow_agent.types import Message, Role

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

logger = logging.getLogger("chatflow_agent.memory")
_T = TypeVar("_T")

#: Webhook de-duplication window: 8 days, past WhatsApp's 7-day redelivery window (seed).
DEFAULT_DEDUP_TTL_HOURS: int = 192
DEFAULT_DEDUP_TTL_SECONDS: float = float(DEFAULT_DEDUP_TTL_HOURS * 3600)


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


class _Snapshot:
    """A session's conversation state at the start of a turn, restored if the turn fails. (A
    persistent store's sync state needs none: it changes only once a commit was written.)"""

    __slots__ = ("history", "agent", "metadata")

    def __init__(self, history: list[Message], agent: Agent, metadata: dict[str, Any]) -> None:
        self.history = list(history)
        self.agent = agent
        self.metadata = dict(metadata)


class StoreSide:
    """The store-facing interface of one ``SessionContext`` (``session.store_side``): everything a
    store does to the sessions it hands out, and the only way it reaches their state. Applications
    never need it.

    - ``bind(store, mutex=None)``: the session belongs to ``store``; ``mutex`` (a ``threading.RLock``,
      the store's lock of the session id) replaces the session's own as the lock its changes and
      writes run under.
    - ``load(history, agent, metadata)``: replace the conversation state by what the store read.
    - ``check()``: ``SessionDeletedError`` once the session was deleted.
    - ``mutate(change, *args)``: ``change(*args)`` (a change the session passed to the store's
      ``asave_change``), then, outside a turn, the store's ``save_change``, under the session's mutex.
    - ``atomic()``: a context manager (yielding the session) inside which changes are kept in
      memory and, on any exception, undone; the store's ``turn`` / ``sync_turn`` commit inside it,
      so a failed commit is undone too.
    - ``mark_committed()``: the current turn's commit was written (``session.turn_committed``).
    - ``mark_deleted()``: the session was deleted; its reads and writes raise ``SessionDeletedError``.
    """

    __slots__ = ("bind", "load", "check", "mutate", "atomic", "mark_committed", "mark_deleted")

    def __init__(
        self, *,
        bind: Callable[[BaseSessionStore, threading.RLock | None], None],
        load: Callable[[list[Message], Agent, dict[str, Any]], None],
        check: Callable[[], None],
        mutate: Callable[..., None],
        atomic: Callable[[], AbstractContextManager[SessionContext]],
        mark_committed: Callable[[], None],
        mark_deleted: Callable[[], None],
    ) -> None:
        self.bind = bind
        self.load = load
        self.check = check
        self.mutate = mutate
        self.atomic = atomic
        self.mark_committed = mark_committed
        self.mark_deleted = mark_deleted


class SessionContext:
    """One conversation: its history, active agent, metadata and turn lock.

    ``history`` holds ``Message`` objects pruned by whole turns (see ``_pruning``);
    ``max_turns`` must be a positive int (``ValueError`` otherwise, chatflow-agent 0.4.0rc1).
    A session obtained from a store persists every change: the plain methods write at once
    (sync), the ``a``-prefixed twins without blocking the event loop; inside a turn
    (``store.turn``) changes are kept until the turn commits, all at once, or are undone.
    Reads and writes through a session whose session was deleted raise ``SessionDeletedError``.
    """

    def __init__(
        self,
        session_id: str,
        initial_agent: Agent,
        max_turns: int = 40,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.session_id = session_id
        self.max_turns = _positive_int("max_turns", max_turns)
        self._active_agent = initial_agent
        self._metadata: dict[str, Any] = metadata if metadata is not None else {}
        self._history: list[Message] = []
        self._store: BaseSessionStore | None = None
        self._deleted = False
        self._turn: _Snapshot | None = None
        self._committed = False  # the current (or last) turn's commit was written
        self._own_lock: asyncio.Lock | None = None
        # Serialises the sync mutations: each applies its change and writes it before the next
        # thread's change starts (otherwise two threads' writes interleave and storage diverges).
        # A persistent store replaces it by its lock of the session id (``StoreSide.bind``).
        self._mutex: threading.RLock = threading.RLock()
        self._store_side: StoreSide | None = None

    # -- state -------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._deleted:
            raise SessionDeletedError(self.session_id)

    @property
    def history(self) -> list[Message]:
        self._check()
        return self._history

    @history.setter
    def history(self, value: list[Message]) -> None:
        self._check()
        self._history = list(value)

    @property
    def active_agent(self) -> Agent:
        self._check()
        return self._active_agent

    @active_agent.setter
    def active_agent(self, agent: Agent) -> None:
        self._check()
        self._active_agent = agent

    @property
    def metadata(self) -> dict[str, Any]:
        self._check()
        return self._metadata

    @metadata.setter
    def metadata(self, value: dict[str, Any]) -> None:
        self._check()
        self._metadata = dict(value)

    @property
    def deleted(self) -> bool:
        """True once the session was deleted through its store."""
        return self._deleted

    @property
    def in_turn(self) -> bool:
        return self._turn is not None

    @property
    def turn_committed(self) -> bool:
        """True once the current (or last) turn's changes were written by its store; a turn cancelled
        while its commit was being written is kept when this is True (see ``BaseSessionStore.turn``)."""
        return self._committed

    @property
    def lock(self) -> Any:
        """The session's turn lock (``async with session.lock``): the store's lock for this id."""
        if self._store is not None:
            return self._store.session_lock(self.session_id)
        if self._own_lock is None:
            self._own_lock = asyncio.Lock()
        return self._own_lock

    @property
    def turns(self) -> tuple[tuple[Message, ...], ...]:
        """Read-only view of the history grouped into turns (each starting with a USER message)."""
        _system, turns, _ = group_turns(self.history)
        return tuple(tuple(t) for t in turns)

    @property
    def system_messages(self) -> tuple[Message, ...]:
        return tuple(group_turns(self.history)[0])

    # -- mutations ---------------------------------------------------------------------------
    def add_message(self, message: Message) -> None:
        """Append ``message`` and prune by whole turns; persisted at once outside a turn.

        Safe to call from several threads on one session: the calls are applied one at a time."""
        self._mutate(self._apply_add, message)

    async def aadd_message(self, message: Message) -> None:
        """Awaitable twin of :meth:`add_message`."""
        await self._amutate(self._apply_add, message)

    def _apply_add(self, message: Message) -> None:
        self._check()
        history = self._history
        # Appending a MODEL/TOOL message to a pruned history that ends inside a turn leaves it
        # pruned: skip the O(n) pass. Otherwise (USER, SYSTEM, no turn yet) prune.
        # (``len(history) > 0``, not ``history``: the list itself would be truthy once appended to.)
        fast = message.role in (Role.MODEL, Role.TOOL) and len(history) > 0 and history[-1].role != Role.SYSTEM
        history.append(message)
        if not fast:
            self._prune_history()

    def set_active_agent(self, agent: Agent) -> None:
        """Make ``agent`` the active agent (persisted at once outside a turn)."""
        self._mutate(self._apply_agent, agent)

    async def aset_active_agent(self, agent: Agent) -> None:
        await self._amutate(self._apply_agent, agent)

    def _apply_agent(self, agent: Agent) -> None:
        self.active_agent = agent

    def clear_history(self) -> None:
        """Remove every message (persisted at once outside a turn)."""
        self._mutate(self._apply_rollback, 0)

    async def aclear_history(self) -> None:
        await self._amutate(self._apply_rollback, 0)

    def rollback_to(self, checkpoint_len: int) -> None:
        """Keep the first ``checkpoint_len`` messages; the removed ones are deleted by identity.

        Rollback does not undo side effects of tools that already ran.
        """
        self._mutate(self._apply_rollback, checkpoint_len)

    async def arollback_to(self, checkpoint_len: int) -> None:
        await self._amutate(self._apply_rollback, checkpoint_len)

    def _apply_rollback(self, checkpoint_len: int) -> None:
        self._check()
        self._history = self._history[: max(0, checkpoint_len)]

    def _prune_history(self) -> None:
        """Apply turn-based pruning in place (see ``chatflow_agent.core._pruning``)."""
        self._history = prune_history(self._history, self.max_turns)

    # -- persistence hooks -------------------------------------------------------------------
    def _mutate(self, change: Callable[..., None], *args: Any) -> None:
        """``change(*args)``, then (outside a turn) its write, both under the session's mutex: one
        thread's change and write at a time, and a store reloads the session before or after them,
        never in between."""
        with self._mutex:
            change(*args)
            self._flush()

    async def _amutate(self, change: Callable[..., None], *args: Any) -> None:
        """Awaitable :meth:`_mutate`: inside a turn (kept until the turn commits) or without a store
        the change is applied here; otherwise the store applies and writes it (``asave_change``)."""
        store = self._store
        if store is None or self._turn is not None:
            change(*args)
            return
        await store.asave_change(self, change, args)

    def _flush(self) -> None:
        if self._store is not None and self._turn is None:
            self._store.save_change(self)

    @contextmanager
    def _atomic(self) -> Iterator[SessionContext]:
        """Changes inside the block are kept in memory; on an exception they are undone.

        The store's ``turn`` / ``sync_turn`` commit them inside the block (so a failed commit is
        undone too)."""
        self._begin_turn()
        try:
            yield self
        except BaseException:
            self._restore_turn()
            raise
        self._end_turn()

    def _begin_turn(self) -> None:
        self._check()
        self._committed = False
        self._turn = _Snapshot(self._history, self._active_agent, self._metadata)

    def _restore_turn(self) -> None:
        snap = self._turn
        self._turn = None
        if snap is not None:
            self._history, self._active_agent, self._metadata = snap.history, snap.agent, snap.metadata

    # -- for stores (through ``store_side``) -----------------------------------------------------
    @property
    def store_side(self) -> StoreSide:
        """This session's store-facing interface (see :class:`StoreSide`): for stores, not applications."""
        if self._store_side is None:  # built once: a store reaches it several times per turn
            self._store_side = StoreSide(bind=self._bind, load=self._load, check=self._check, mutate=self._mutate,
                                         atomic=self._atomic, mark_committed=self._mark_committed,
                                         mark_deleted=self._mark_deleted)
        return self._store_side

    def _bind(self, store: BaseSessionStore, mutex: threading.RLock | None = None) -> None:
        self._store = store
        if mutex is not None:
            self._mutex = mutex

    def _load(self, history: list[Message], agent: Agent, metadata: dict[str, Any]) -> None:
        self._history, self._active_agent, self._metadata = history, agent, metadata

    def _mark_deleted(self) -> None:
        self._deleted = True

    def _mark_committed(self) -> None:
        self._committed = True

    def _end_turn(self) -> None:
        self._turn = None

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} id={self.session_id!r} active_agent={self._active_agent.name!r} "
            f"messages={len(self._history)}>"
        )


AgentResolver = Callable[[str], "Agent | None"]


class BaseSessionStore(ABC):
    """The store contract: sessions, their turn locks, and webhook de-duplication.

    Subclasses implement the five abstract sync methods (0.3.4's interface). Every operation
    has an awaitable twin (``aget_or_create``, ``aget``, ``adelete``, ``alist_sessions``,
    ``aclear``, ``ais_message_processed``, ``amark_message_processed``,
    ``arecord_processed_message``, ``arelease_processed_message``); :meth:`turn` runs a turn
    atomically under the session's lock.
    """

    default_max_turns: int = 40

    _agent_resolver: AgentResolver | None = None

    def __init__(self) -> None:
        self.__dict__["_locks"] = SessionLocks()

    @property
    def _locks(self) -> SessionLocks:
        # Subclasses written for 0.3.4 may not call super().__init__(): create the locks lazily.
        locks: SessionLocks | None = self.__dict__.get("_locks")
        if locks is None:
            locks = self.__dict__.setdefault("_locks", SessionLocks())
        return locks

    # 0.3.4's abstract interface
    @abstractmethod
    def get_or_create(self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None) -> SessionContext: ...  # noqa: E501

    @abstractmethod
    def get(self, session_id: str) -> SessionContext | None: ...

    @abstractmethod
    def delete(self, session_id: str) -> bool: ...

    @abstractmethod
    def list_sessions(self) -> list[str]: ...

    @abstractmethod
    def clear(self) -> None: ...

    def set_agent_resolver(self, resolver: AgentResolver) -> None:
        """Map stored agent names back to ``Agent`` objects (the Runner installs one)."""
        self._agent_resolver = resolver

    def message_row_id(self, session: SessionContext, message: Message) -> int | None:
        """The id of the stored row that holds ``message`` (an object of ``session.history``), or
        None: not stored yet, or a store without rows (the in-memory store)."""
        return None

    def is_message_processed(self, message_id: str) -> bool:
        return False

    def mark_message_processed(self, message_id: str) -> None:
        self.record_processed_message(message_id)

    def record_processed_message(self, message_id: str) -> bool:
        """Claim ``message_id`` atomically: True only for the first caller within the TTL."""
        return True

    def release_processed_message(self, message_id: str) -> None:
        """Release ``message_id``'s claim, so the next :meth:`record_processed_message` of it wins (its
        processing failed before its turn committed). Claims carry no owner; an id that is not claimed,
        and every other id's claim, are left as they are. Call it in the transaction of the failure where
        the store has transactions. This base keeps no claims: nothing to release."""
        return None

    # awaitable twins: blocking work off the event loop (stores may run it inline if cheap)
    async def _run_blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.to_thread(fn, *args)

    async def _run_blocking_on(self, key: str | None, fn: Callable[..., _T], *args: Any) -> _T:
        """:meth:`_run_blocking` for work on one session (stores may keep it on one thread)."""
        return await self._run_blocking(fn, *args)

    async def aget_or_create(self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None) -> SessionContext:  # noqa: E501
        return await self._run_blocking_on(session_id, self.get_or_create, session_id, default_agent, metadata)

    async def aget(self, session_id: str) -> SessionContext | None:
        return await self._run_blocking_on(session_id, self.get, session_id)

    async def adelete(self, session_id: str) -> bool:
        return await self._run_blocking_on(session_id, self.delete, session_id)

    async def alist_sessions(self) -> list[str]:
        return await self._run_blocking(self.list_sessions)

    async def aclear(self) -> None:
        await self._run_blocking(self.clear)

    async def ais_message_processed(self, message_id: str) -> bool:
        return await self._run_blocking(self.is_message_processed, message_id)

    async def amark_message_processed(self, message_id: str) -> None:
        await self._run_blocking(self.mark_message_processed, message_id)

    async def arecord_processed_message(self, message_id: str) -> bool:
        return await self._run_blocking(self.record_processed_message, message_id)

    async def arelease_processed_message(self, message_id: str) -> None:
        await self._run_blocking(self.release_processed_message, message_id)

    # The session-facing interface: what SessionContext calls on the store that holds it (no-ops for
    # stores that keep objects in memory). Not for applications.
    def session_lock(self, session_id: str) -> BoundLock:
        """The object behind ``SessionContext.lock``: this store's turn lock of ``session_id``."""
        return BoundLock(self._locks, session_id)

    def save_change(self, session: SessionContext) -> None:
        """Write a change just made to ``session`` outside a turn (sync, under the session's mutex);
        ``SessionDeletedError`` if the session was deleted."""
        if session.deleted:
            raise SessionDeletedError(session.session_id)

    async def asave_change(self, session: SessionContext, change: Callable[..., None], args: tuple[Any, ...]) -> None:
        """Apply ``change(*args)`` to ``session`` outside a turn and write it (``StoreSide.mutate``);
        here, on the caller's thread: nothing blocks."""
        session.store_side.mutate(change, *args)

    @asynccontextmanager
    async def turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None, *, wait: bool = True,
        report: TurnReport | None = None, hooks: TurnHooks | None = None,
    ) -> AsyncIterator[SessionContext]:
        """Run a turn atomically: ``async with store.turn(id, agent) as session: ...``.

        Waits (FIFO) for the session's lock — or raises ``SessionBusyError`` at once when
        ``wait`` is false and a turn is running. Changes made through ``session`` inside the
        block are committed together on exit; on any exception (cancellation and timeouts
        included) they are undone and nothing is written. A cancellation that arrives once the
        commit is being written (on a persistent store's thread, which cannot be stopped) waits
        for the write, however long it takes (up to the database's lock timeout): if it was
        written, the turn is kept, in memory as on disk, and ``CancelledError`` raised after; if
        it failed, the turn is undone and ``CancelledError`` raised from that error.
        ``SessionDeletedError`` if the session is deleted meanwhile.

        ``report`` (a ``chatflow_agent.core.reports.TurnReport``, usually the Runner's): the store
        sets its lease owner, start and end times and final status (``completed``, ``failed`` or
        ``cancelled``); a persistent store hands it to its backend with the lease and commit writes
        (turn records). The in-memory store keeps no records.

        ``hooks`` (a ``chatflow_agent.core.hooks.TurnHooks``): the turn's commit hooks, called inside its
        commit (its transaction, on a persistent store) before its rows are written; one that raises
        refuses the commit and the turn fails with that error, rolled back (see that module).
        """
        await self._locks.enter(session_id, wait)
        try:
            if report is not None:
                report.begin("")
            session, created = await self._aget_or_create_for_turn(session_id, default_agent, metadata)
            with self._playing(session, created, report, hooks):
                yield session
        finally:
            self._locks.release(session_id)

    @contextmanager
    def sync_turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None, *, wait: bool = True,
        report: TurnReport | None = None, queued: Callable[[], object] | None = None,
        hooks: TurnHooks | None = None,
    ) -> Iterator[SessionContext]:
        """Blocking twin of :meth:`turn` for code without an event loop (e.g. Django views).

        ``queued``: called once this call has its place in the session's line, before it waits for
        a running turn; a turn that joins the line after (one that ``queued`` caused, say) comes
        after this one. E.g. stopping the running turn from ``queued`` makes this call the next
        turn even when the stopped turn's owner plays it again at once. If it raises, the place is
        given up and the error propagates."""
        self._locks.enter_sync(session_id, wait, queued)
        try:
            if report is not None:
                report.begin("")
            session, created = self._get_or_create_for_turn(session_id, default_agent, metadata)
            with self._playing(session, created, report, hooks):
                yield session
        finally:
            self._locks.release(session_id)

    @contextmanager
    def _playing(self, session: SessionContext, created: bool, report: TurnReport | None,
                 hooks: TurnHooks | None = None) -> Iterator[SessionContext]:
        """The body of a turn, :meth:`turn`'s and :meth:`sync_turn`'s alike, once the session's lock is held:
        ``session``'s changes kept (in memory there is nothing to write; ``hooks`` run where a commit would
        be, and refuse it by raising) and undone on any exception, ``report`` ended, and a session the turn
        ``created`` discarded again when it fails."""
        side = session.store_side
        try:
            with side.atomic():
                yield session
                side.check()
                if hooks is not None and hooks.on_commit:
                    hooks.committing(session.session_id, dict(session.metadata), report)
                if report is not None:
                    report.end("completed")
        except BaseException as err:
            if report is not None and report.status == "running":
                report.ended_by(err)
            if created:
                self._discard_created(session)
            raise

    def _get_or_create_for_turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None
    ) -> tuple[SessionContext, bool]:
        """``(session, created)``: ``created`` when the turn made the session, which a failed turn
        then removes again (before the turn there was none). Stores that cannot tell say False."""
        return self.get_or_create(session_id, default_agent, metadata), False

    async def _aget_or_create_for_turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None
    ) -> tuple[SessionContext, bool]:
        return await self.aget_or_create(session_id, default_agent, metadata), False

    def _discard_created(self, session: SessionContext) -> None:
        """Forget ``session``, made by a turn that failed (see :meth:`_get_or_create_for_turn`)."""
        return None


class SessionStore(BaseSessionStore):
    """Thread-safe in-memory store: ``get_or_create`` returns the same object every time.

    De-duplication remembers at most 10,000 ids (the oldest evicted in O(1)) for
    ``dedup_ttl_hours`` from their first claim; a repeat inside the window does not extend it.
    The cap bounds memory, so an id evicted by it can be claimed again while its TTL still
    runs: webhooks that must be processed exactly once (invariant 6) need a persistent store.
    """

    _DEDUP_MAX_ENTRIES: int = 10_000

    def __init__(self, default_max_turns: int = 40, dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS) -> None:
        super().__init__()
        self.default_max_turns = _positive_int("default_max_turns", default_max_turns)
        self.dedup_ttl_hours = _positive_number("dedup_ttl_hours", dedup_ttl_hours)
        self._dedup_ttl_seconds = self.dedup_ttl_hours * 3600.0
        self._sessions: dict[str, SessionContext] = {}
        self._mutex = threading.RLock()
        self._processed: OrderedDict[str, float] = OrderedDict()  # id -> monotonic first claim
        self._clock: Callable[[], float] = time.monotonic

    async def _run_blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        return fn(*args)  # in-memory work never blocks: run inline

    def get_or_create(self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None) -> SessionContext:  # noqa: E501
        with self._mutex:
            session = self._sessions.get(session_id)
            if session is None:
                session = SessionContext(session_id, default_agent, self.default_max_turns, dict(metadata or {}))
                session.store_side.bind(self, None)
                self._sessions[session_id] = session
            return session

    def get(self, session_id: str) -> SessionContext | None:
        with self._mutex:
            return self._sessions.get(session_id)

    def _get_or_create_for_turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None
    ) -> tuple[SessionContext, bool]:
        with self._mutex:
            created = session_id not in self._sessions
            return self.get_or_create(session_id, default_agent, metadata), created

    async def _aget_or_create_for_turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None
    ) -> tuple[SessionContext, bool]:
        return self._get_or_create_for_turn(session_id, default_agent, metadata)

    def _discard_created(self, session: SessionContext) -> None:
        with self._mutex:
            if self._sessions.get(session.session_id) is session:
                del self._sessions[session.session_id]

    def delete(self, session_id: str) -> bool:
        with self._mutex:
            session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        session.store_side.mark_deleted()
        return True

    def list_sessions(self) -> list[str]:
        with self._mutex:
            return list(self._sessions)

    def clear(self) -> None:
        with self._mutex:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for s in sessions:
            s.store_side.mark_deleted()

    def _expired(self, first_seen: float, now: float) -> bool:
        return now - first_seen > self._dedup_ttl_seconds

    def is_message_processed(self, message_id: str) -> bool:
        with self._mutex:
            first = self._processed.get(message_id)
            return first is not None and not self._expired(first, self._clock())

    def record_processed_message(self, message_id: str) -> bool:
        with self._mutex:
            now = self._clock()
            while self._processed:  # ids are in claim order: purge expired ones from the front
                oldest_id, first = next(iter(self._processed.items()))
                if not self._expired(first, now):
                    break
                del self._processed[oldest_id]
            if message_id in self._processed:
                return False
            if len(self._processed) >= self._DEDUP_MAX_ENTRIES:
                self._processed.popitem(last=False)
            self._processed[message_id] = now
            return True

    def release_processed_message(self, message_id: str) -> None:
        with self._mutex:
            self._processed.pop(message_id, None)

    def mark_message_processed(self, message_id: str) -> None:
        self.record_processed_message(message_id)
