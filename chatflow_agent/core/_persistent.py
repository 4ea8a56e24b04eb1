"""PersistentSessionStore: the persistent stores' contract over one ``SessionBackend``.

The store is composed of parts that each own their state:

- the backend (``chatflow_agent.core.backend.SessionBackend``): one database's rows;
- an ``IdentityMap``: one ``SessionContext`` per session id while it is in use (plus an LRU bounded
  in sessions and in messages) and each live session's ``SyncState`` (which row holds each message, token, version),
  revalidated against the row's *version* so a change made by another process is reloaded; and each
  session id's lock, under which its context is made, reloaded, changed and committed (invariant 11:
  a reload never lands in the middle of a change or a commit, two threads never make two contexts);
- the pure diff functions of ``_sync``: what a commit writes, and the state after it;
- a ``LeaseCore``: the cross-process *lease* of a turn (FIFO line, renewal while it runs,
  expiry if its process dies);
- a ``BlockingBridge``: blocking backend work dispatched from event loops to the pool thread of
  the session.

Turns (``turn`` / ``sync_turn``): the in-process FIFO lock, then the lease and the session's
head in one blocking hop, then one transaction at the end that writes the turn's rows and
releases the lease (invariants 2 and 3: at most two blocking hops and two write transactions per
turn). Deletion is detected by *incarnation token*, so a turn on a session deleted — in this
process or another — raises ``SessionDeletedError`` and writes nothing. Rows are removed by id,
never by position; history on load is pruned by the same function as in memory, and rows the
pruning left out are deleted with the next commit (invariant 4).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from chatflow_agent.core import _sync
from chatflow_agent.core._bridge import BlockingBridge
from chatflow_agent.core._identity import IdentityMap
from chatflow_agent.core._session import (
    DEFAULT_DEDUP_TTL_HOURS,
    BaseSessionStore,
    SessionContext,
    _positive_int,
    _positive_number,
)
from chatflow_agent.core._turns import LeaseCore, new_lease_owner
from chatflow_agent.core.backend import SessionBackend, StoredSession, TurnReport
from chatflow_agent.core.hooks import TurnHooks
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from chatflow_agent.types import Message

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

logger = logging.getLogger("chatflow_agent.memory")
_T = TypeVar("_T")

__all__ = ["DEFAULT_LEASE_TTL_SECONDS", "PersistentSessionStore"]

DEFAULT_LEASE_TTL_SECONDS = 30.0
#: Threads a persistent store runs its blocking backend work on, unless its class says otherwise.
BLOCKING_IO_WORKERS = 4


class _Outcome:
    """Whether a turn's commit was written (see ``PersistentSessionStore._committing``)."""

    __slots__ = ("committed",)

    def __init__(self) -> None:
        self.committed = False


class PersistentSessionStore(BaseSessionStore):
    """``PersistentSessionStore(backend, default_max_turns=40, dedup_ttl_hours=192, lease_ttl_seconds=30)``:
    the store contract on a ``SessionBackend`` (see the module docstring).

    Non-positive numbers → ``ValueError``. ``lease_ttl_seconds``: how long a turn's lease lives
    without renewal (renewed every third of it while the turn runs), so how long a session stays
    blocked after the process holding it died. :meth:`close` stops the store's threads and closes
    the backend.
    """

    _BLOCKING_IO_WORKERS = BLOCKING_IO_WORKERS
    _CACHE_SIZE = 1024  # sessions kept alive between turns (the identity map's LRU) …
    _CACHE_MESSAGES = 4096  # … holding at most this many messages between them (a process's memory stays flat)

    def __init__(self, backend: SessionBackend, default_max_turns: int = 40,
                 dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
                 lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS) -> None:
        super().__init__()
        self.default_max_turns = _positive_int("default_max_turns", default_max_turns)
        self.dedup_ttl_hours = _positive_number("dedup_ttl_hours", dedup_ttl_hours)
        self.backend = backend
        self._bridge = BlockingBridge(backend.inline, self._BLOCKING_IO_WORKERS)
        self._sessions = IdentityMap(self._CACHE_SIZE, self._CACHE_MESSAGES)
        self._leases = LeaseCore(backend, self._bridge, _positive_number("lease_ttl_seconds", lease_ttl_seconds))
        self._warned_agents: set[str] = set()
        self._beats: dict[str, tuple[str, Any]] = {}  # session id → (lease owner, heartbeat) of its async turn here

    @property
    def lease_ttl_seconds(self) -> float:
        return self._leases.ttl_seconds

    @lease_ttl_seconds.setter
    def lease_ttl_seconds(self, value: float) -> None:
        self._leases.ttl_seconds = _positive_number("lease_ttl_seconds", value)

    @property
    def dedup_ttl_seconds(self) -> float:
        return self.dedup_ttl_hours * 3600.0

    # ---- blocking dispatch ----------------------------------------------------------------
    async def _run_blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await self._bridge.run(None, fn, *args)

    async def _run_blocking_on(self, key: str | None, fn: Callable[..., _T], *args: Any) -> _T:
        return await self._bridge.run(key, fn, *args)

    def close(self) -> None:
        """Stop the store's threads, then close the backend's connections."""
        self._leases.close()
        self._bridge.close()
        self.backend.close()

    # ---- agents ---------------------------------------------------------------------------
    def _resolve_agent(self, name: str, default_agent: Agent | None) -> Agent:
        from chatflow_agent.core.agent import PlaceholderAgent

        if default_agent is not None and default_agent.name == name:
            return default_agent
        if self._agent_resolver is not None:
            agent = self._agent_resolver(name)
            if agent is not None:
                return agent
        if name not in self._warned_agents:
            self._warned_agents.add(name)
            logger.warning(
                "No agent named %r is registered (no agent resolver, or it does not know the name): "
                "using a placeholder agent without tools. Create the Runner first or call "
                "store.set_agent_resolver().",
                name,
            )
        return PlaceholderAgent(name=name, instructions="", model="placeholder")

    # ---- identity map ---------------------------------------------------------------------
    def message_row_id(self, session: SessionContext, message: Message) -> int | None:
        """The id of the ``chatflow_messages`` row that holds ``message`` (an object of
        ``session.history``), or None when it has none yet (not committed)."""
        return self._sessions.state(session).row_id(message)

    def _stored_token(self, session: SessionContext | None) -> Any:
        return None if session is None else self._sessions.state(session).token

    def _forget_unstored(self, stored: StoredSession | None, session_id: str) -> None:
        """After a failed turn on a session that had no row: the turn made the context, so it goes
        (before the turn there was no session; the next turn starts with its own agent and metadata)."""
        if stored is None:
            with self._sessions.lock(session_id):  # not while a get_or_create makes it a stored one
                cached = self._sessions.get(session_id)
                if cached is not None and self._stored_token(cached) is None:
                    self._sessions.forget(session_id)

    def _gone(self, session_id: str) -> None:
        """The session was deleted (here or by another process): its live object says so."""
        cached = self._sessions.forget(session_id)
        if cached is not None:
            cached.store_side.mark_deleted()

    def _fill(self, session: SessionContext, stored: StoredSession, default_agent: Agent | None) -> None:
        """Load ``stored`` (with rows) into ``session`` and its sync state."""
        state = self._sessions.state(session)
        history = _sync.load_rows(state, stored.rows or [], session.max_turns, stored.token, stored.version)
        session.store_side.load(history, self._resolve_agent(stored.agent_name, default_agent), dict(stored.metadata))

    def _new_context(self, session_id: str, agent: Agent, metadata: dict[str, Any]) -> SessionContext:
        session = SessionContext(session_id, agent, self.default_max_turns, metadata)
        session.store_side.bind(self, self._sessions.lock(session_id))
        return session

    def _materialise(self, session_id: str, stored: StoredSession | None, default_agent: Agent | None,
                     metadata: dict[str, Any] | None, refresh: bool = True) -> SessionContext:
        """The cached context brought up to date with ``stored`` (a head or a full load); the caller
        holds the session's lock (``self._sessions.lock``) from reading ``stored`` until it has the
        context. ``refresh`` False: a cached context is returned as it is (a turn holds the session,
        and changes it where a reload would not see)."""
        sessions = self._sessions
        cached = sessions.get(session_id)
        if stored is None:
            if cached is not None and self._stored_token(cached) is not None:
                self._gone(session_id)  # deleted, possibly by another process
                cached = None
            if cached is not None:
                return cached
            assert default_agent is not None
            session = self._new_context(session_id, default_agent, dict(metadata or {}))
            sessions.remember(session)
            return session
        if cached is not None:
            state = sessions.state(cached)
            if state.token not in (None, stored.token):
                self._gone(session_id)  # deleted and created again since we loaded it
                cached = None
            elif cached.in_turn or not refresh:
                return cached
            elif state.version == stored.version:
                sessions.remember(cached)
                return cached
        if stored.rows is None:
            stored = self.backend.load(session_id) or stored
        agent = default_agent or self._resolve_agent(stored.agent_name, None)
        session = cached or self._new_context(session_id, agent, {})
        self._fill(session, stored, default_agent)
        sessions.remember(session)
        return session

    # ---- 0.3.4 interface ------------------------------------------------------------------
    def get_or_create(self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None) -> SessionContext:  # noqa: E501
        """The session ``session_id``, created (row written at once) with ``default_agent`` if absent."""
        held = self._held_by_turn(session_id)
        if held is not None:
            return held
        with self._sessions.lock(session_id):
            head = self.backend.head(session_id)
            if head is None:
                self.backend.create(session_id, default_agent.name, json.dumps(metadata or {}, ensure_ascii=False))
                head = self.backend.head(session_id)
            return self._materialise(session_id, head, default_agent, metadata,
                                     refresh=not self._locks.locked(session_id))

    def get(self, session_id: str) -> SessionContext | None:
        """The stored session, or None. Unknown agent names give a placeholder agent (logged once)."""
        held = self._held_by_turn(session_id)
        if held is not None:
            return held
        with self._sessions.lock(session_id):
            head = self.backend.head(session_id)
            if head is None:
                cached = self._sessions.get(session_id)
                if cached is not None and self._stored_token(cached) is not None:
                    self._gone(session_id)  # deleted, possibly by another process
                # (a context without a row is a first turn's, still running: it stays that turn's)
                return None
            return self._materialise(session_id, head, None, None, refresh=not self._locks.locked(session_id))

    def _held_by_turn(self, session_id: str) -> SessionContext | None:
        """The live context of a stored session a turn holds (its lock), if its row is still the one
        it was loaded from: returned as it is, without the session's lock, which the turn's commit
        holds while it writes (a reader does not wait for that write, nor block it from a
        transaction of its own). None otherwise: the caller takes the lock."""
        cached = self._sessions.get(session_id)
        if cached is None or not self._locks.locked(session_id):
            return None
        token = self._stored_token(cached)
        if token is None:
            return None
        head = self.backend.head(session_id)
        return cached if head is not None and head.token == token else None

    def delete(self, session_id: str) -> bool:
        """Delete the session and its messages; live session objects raise SessionDeletedError.

        True when something was deleted: a stored session, or a live one not yet stored (a first
        turn still running), as the in-memory store answers."""
        return self.delete_with(session_id, self.backend.delete)

    def delete_with(self, session_id: str, delete_rows: Callable[[str], bool]) -> bool:
        """:meth:`delete`, with ``delete_rows(session_id)`` (True when it deleted a stored session) in place of
        the backend's delete: for a store that deletes more than the session's rows (what other tables hold of
        it) and wants to see what it did. The live session objects are marked deleted first, as by
        :meth:`delete`."""
        cached = self._sessions.forget(session_id)
        if cached is not None:
            cached.store_side.mark_deleted()
        return delete_rows(session_id) or (cached is not None and self._stored_token(cached) is None)

    def list_sessions(self) -> list[str]:
        """Session ids, most recently updated first."""
        return self.backend.list_sessions()

    def clear(self) -> None:
        for s in self._sessions.forget_all():
            s.store_side.mark_deleted()
        self.backend.clear()

    def is_message_processed(self, message_id: str) -> bool:
        """True if ``message_id`` was claimed less than ``dedup_ttl_hours`` ago."""
        return self.backend.is_message_claimed(message_id, self.dedup_ttl_seconds)

    def record_processed_message(self, message_id: str) -> bool:
        """Claim ``message_id`` in one atomic statement: True only for the first claim in the TTL."""
        return self.backend.claim_message(message_id, self.dedup_ttl_seconds)

    def release_processed_message(self, message_id: str) -> None:
        """Release ``message_id``'s claim in one statement (``SessionBackend.release_claim``)."""
        self.backend.release_claim(message_id)

    def mark_message_processed(self, message_id: str) -> None:
        self.backend.claim_message(message_id, self.dedup_ttl_seconds)

    def purge_processed_messages(self) -> int:
        """Delete expired de-duplication rows; returns how many."""
        return self.backend.purge_claims(self.dedup_ttl_seconds)

    def purge_expired_leases(self) -> int:
        """Delete lease and waiter rows that expired more than ``lease_ttl_seconds`` ago (left by
        processes that died); returns how many. Turns also do it, at most once every
        ``chatflow_agent.core.sql.PURGE_EVERY_SECONDS``."""
        return self._leases.purge_expired()

    # ---- commits --------------------------------------------------------------------------
    def _commit_blocking(self, session: SessionContext, release_owner: str | None = None,
                         report: TurnReport | None = None, hooks: TurnHooks | None = None) -> None:
        # Under the session's lock: nothing reloads the session between the diff, the write and the
        # state after it (a mutation outside a turn holds it already, from its change on).
        with self._sessions.lock(session.session_id):
            history = session.history  # SessionDeletedError once deleted
            state = self._sessions.state(session)
            diff = _sync.delta(history, state)
            changes = _sync.changes(session.session_id, history, session.active_agent.name, session.metadata,
                                    state, release_owner, diff)
            if report is not None:
                report.end("completed")
                changes.report = report
            changes.hooks = hooks
            try:
                result = self.backend.commit(changes)
            except SessionDeletedError:
                self._sessions.forget(session.session_id)
                session.store_side.mark_deleted()
                raise
            _sync.apply_commit(state, history, changes, result, diff)
            self._sessions.recount(session)

    def save_change(self, session: SessionContext) -> None:
        self._commit_blocking(session)

    async def asave_change(self, session: SessionContext, change: Callable[..., None], args: tuple[Any, ...]) -> None:
        """The change and its write in one hop, on the session's thread, under the session's lock."""
        side = session.store_side
        side.check()
        await self._bridge.run(session.session_id, side.mutate, change, *args)

    # ---- turns ----------------------------------------------------------------------------
    def _begin_blocking(self, session_id: str, owner: str, queue: bool, report: TurnReport | None,
                        default_agent: Agent, metadata: dict[str, Any] | None
                        ) -> tuple[bool, tuple[StoredSession | None, SessionContext] | None]:
        """One hop: the lease (opening ``report``'s record), then, under the session's lock, its head —
        or its rows when the cached context is not current — and the context brought up to date:
        ``(True, (stored, context))``, or ``(False, None)`` while another turn holds the lease."""
        if not self._leases.try_acquire(session_id, owner, queue, report):
            return False, None
        try:
            with self._sessions.lock(session_id):
                head = self.backend.head(session_id)
                cached = self._sessions.get(session_id)
                if head is not None:
                    state = None if cached is None else self._sessions.state(cached)
                    if state is None or state.token != head.token or state.version != head.version:
                        head = self.backend.load(session_id)
                session = self._materialise(session_id, head, default_agent, metadata)
        except BaseException as err:
            if report is not None:
                report.ended_by(err)
            self._leases.release_blocking(session_id, owner, report)
            raise
        return True, (head, session)

    def _begin_for(self, report: TurnReport | None, default_agent: Agent, metadata: dict[str, Any] | None
                   ) -> Callable[[str, str, bool], tuple[bool, tuple[StoredSession | None, SessionContext] | None]]:
        return lambda session_id, owner, queue: self._begin_blocking(session_id, owner, queue, report,
                                                                     default_agent, metadata)

    @asynccontextmanager
    async def turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None, *, wait: bool = True,
        report: TurnReport | None = None, hooks: TurnHooks | None = None,
    ) -> AsyncIterator[SessionContext]:
        await self._locks.enter(session_id, wait)
        try:
            owner = new_lease_owner()
            try:
                begun = await self._leases.acquire(session_id, owner, wait,
                                                   self._begin_for(report, default_agent, metadata), report)
            except asyncio.CancelledError:
                # The lease may have been won (and the context made) just before: it was given back.
                self._forget_unstored(None, session_id)
                raise
            assert begun is not None
            stored, session = begun
            beat = self._leases.heartbeat(session_id, owner)
            self._beats[session_id] = (owner, beat)
            outcome = _Outcome()
            try:
                with self._committing(session, report, outcome):
                    try:
                        yield session
                        _, cancelled = await self._bridge.finish(session_id, self._commit_blocking, session, owner,
                                                                 report, hooks)
                    except asyncio.CancelledError:
                        if not beat.lost:
                            raise
                        beat.forgive()  # the lease was lost or taken away: a failed turn, not a cancelled task
                        raise SessionBusyError(session_id) from None
                    outcome.committed = True
                if cancelled and beat.lost:
                    beat.forgive()  # stopped after its commit was written: the turn is kept and completes
                elif cancelled:  # cancelled while the commit was written: the turn is kept, then cancelled
                    raise asyncio.CancelledError()
            finally:
                self._beats.pop(session_id, None)
                await beat.stop()
                if not outcome.committed:
                    self._forget_unstored(stored, session_id)
                    await self._leases.release(session_id, owner, report)
        finally:
            self._locks.release(session_id)

    @contextmanager
    def _committing(self, session: SessionContext, report: TurnReport | None, outcome: _Outcome) -> Iterator[None]:
        """The body of a turn, :meth:`turn`'s and :meth:`sync_turn`'s alike, once it holds its lease: the
        block plays the turn and writes its commit, then sets ``outcome.committed``. ``session``'s changes
        are undone on any exception before that, and ``report`` is ended by the exception — e.g. its lease
        was lost or taken away (an operator's cancel): stopped at a renewal, or its commit refused; the
        caller gets ``SessionBusyError`` (see ``TurnReport.ended_by``)."""
        side = session.store_side
        try:
            with side.atomic():
                yield
                side.mark_committed()
        except BaseException as err:
            if report is not None and not outcome.committed:
                report.ended_by(err)
            raise

    def stop_turn(self, session_id: str, owner: str | None = None) -> bool:
        """Thread-safe: stop the async turn of this store running on ``session_id`` in this process, if
        any (True): it fails with ``SessionBusyError`` and is rolled back, as when its lease is lost.
        ``owner``: only the turn holding (or that held) the lease of that owner, not a later turn of the
        session. Call it after the lease was taken away; otherwise a turn whose commit was being written
        when it was stopped completes normally. A turn in another process stops at its next lease renewal."""
        entry = self._beats.get(session_id)
        if entry is None or (owner is not None and entry[0] != owner):
            return False
        entry[1].lose()
        return True

    @contextmanager
    def sync_turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None, *, wait: bool = True,
        report: TurnReport | None = None, queued: Callable[[], object] | None = None,
        hooks: TurnHooks | None = None,
    ) -> Iterator[SessionContext]:
        self._locks.enter_sync(session_id, wait, queued)
        try:
            owner = new_lease_owner()
            begun = self._leases.acquire_sync(session_id, owner, wait, self._begin_for(report, default_agent, metadata))
            assert begun is not None
            stored, session = begun
            outcome = _Outcome()
            self._leases.keep(session_id, owner)  # no event loop here: the keeper thread renews the lease
            try:
                with self._committing(session, report, outcome):
                    yield session
                    self._commit_blocking(session, owner, report, hooks)
                    outcome.committed = True
            finally:
                self._leases.unkeep(session_id, owner)
                if not outcome.committed:
                    self._forget_unstored(stored, session_id)
                    self._leases.release_blocking(session_id, owner, report)
        finally:
            self._locks.release(session_id)
