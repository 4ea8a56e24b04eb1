"""PersistentSessionStore: the turn protocol shared by the SQLite and Django stores.

Subclasses implement blocking primitives (``_db_*``) over one database; this class builds the
contract on them:

- an identity map (one ``SessionContext`` per session id while it is in use, plus a small LRU),
  revalidated against the row's *version* so a change made by another process is reloaded;
- turns (``turn`` / ``sync_turn``): the in-process FIFO lock, then a cross-process *lease*
  (``chatflow_session_leases``, renewed while the turn runs, expiring if its process dies),
  then one transaction at the end that writes the turn's rows and releases the lease
  (invariants 2 and 3: at most two blocking hops and two write transactions per turn);
- deletion detection by *incarnation token* (the row's ``created_at``), so a turn on a session
  deleted — in this process or another — raises ``SessionDeletedError`` and writes nothing;
- rows are removed by id, never by position; history on load is pruned by the same function as
  in memory, and rows the pruning left out are deleted with the next commit (invariant 4).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from operator import is_
from typing import TYPE_CHECKING, Any, TypeVar

from chatflow_agent.core._pool import BlockingPool
from chatflow_agent.core._pruning import prune_history
from chatflow_agent.core._session import (
    DEFAULT_DEDUP_TTL_HOURS,
    BaseSessionStore,
    SessionContext,
    _positive_int,
    _positive_number,
)
from chatflow_agent.core.backend import Changes, CommitResult, StoredSession, parse_row
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from chatflow_agent.types import Message

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

logger = logging.getLogger("chatflow_agent.memory")
_T = TypeVar("_T")

__all__ = ["DEFAULT_LEASE_TTL_SECONDS", "PersistentSessionStore"]

DEFAULT_LEASE_TTL_SECONDS = 30.0


def _process_tag() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}:"


_owner_prefix = _process_tag()
_owner_serial = itertools.count(1)


def _new_process() -> None:
    global _owner_prefix, _owner_serial
    _owner_prefix, _owner_serial = _process_tag(), itertools.count(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_process)


def _lease_owner() -> str:
    """``host:pid:random:serial``: unique per turn, and says which process holds a lease."""
    return f"{_owner_prefix}{next(_owner_serial)}"


class PersistentSessionStore(BaseSessionStore):
    """Base class of stores that persist to a database (see the module docstring)."""

    _BLOCKING_IO_WORKERS = 4
    _CACHE_SIZE = 1024
    #: seconds between two purges of expired lease and waiter rows (see :meth:`purge_expired_leases`)
    _LEASE_PURGE_EVERY = 300.0

    def __init__(self, default_max_turns: int = 40, dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
                 lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS) -> None:
        super().__init__()
        self.default_max_turns = _positive_int("default_max_turns", default_max_turns)
        self.dedup_ttl_hours = _positive_number("dedup_ttl_hours", dedup_ttl_hours)
        #: seconds a turn's lease lives without renewal (renewed every third of it while the turn runs):
        #: how long a session stays blocked after the process holding it died
        self.lease_ttl_seconds = _positive_number("lease_ttl_seconds", lease_ttl_seconds)
        self._last_lease_purge = 0.0
        self._weak: weakref.WeakValueDictionary[str, SessionContext] = weakref.WeakValueDictionary()
        self._lru: OrderedDict[str, SessionContext] = OrderedDict()
        self._cache_mutex = threading.RLock()
        self._pool: BlockingPool | None = None
        self._executor_mutex = threading.Lock()
        self._kept_leases: set[tuple[str, str]] = set()  # leases of running sync turns
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()
        self._warned_agents: set[str] = set()
        self._inline = False  # True: blocking work runs on the calling thread (ephemeral DBs)

    @property
    def dedup_ttl_seconds(self) -> float:
        return self.dedup_ttl_hours * 3600.0

    # ---- primitives subclasses implement (blocking) -------------------------------------
    def _db_head(self, session_id: str) -> StoredSession | None: raise NotImplementedError
    def _db_load(self, session_id: str) -> StoredSession | None: raise NotImplementedError
    def _db_create(self, session_id: str, agent_name: str, metadata_json: str) -> None: raise NotImplementedError
    def _db_commit(self, changes: Changes) -> CommitResult: raise NotImplementedError
    def _db_delete(self, session_id: str) -> bool: raise NotImplementedError
    def _db_list(self) -> list[str]: raise NotImplementedError
    def _db_clear(self) -> None: raise NotImplementedError
    def _db_claim(self, message_id: str, ttl_seconds: float) -> bool: raise NotImplementedError
    def _db_is_processed(self, message_id: str, ttl_seconds: float) -> bool: raise NotImplementedError
    def _db_purge_processed(self, ttl_seconds: float) -> int: raise NotImplementedError
    def _db_acquire_lease(self, session_id: str, owner: str, ttl: float, queue: bool = True) -> bool:
        raise NotImplementedError
    def _db_leave_queue(self, session_id: str, owner: str) -> None: return None
    def _db_renew_lease(self, session_id: str, owner: str, ttl: float) -> bool: raise NotImplementedError
    def _db_release_lease(self, session_id: str, owner: str) -> None: raise NotImplementedError
    def _db_purge_leases(self, before: float) -> int: raise NotImplementedError

    # ---- blocking dispatch ----------------------------------------------------------------
    async def _run_blocking(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Run blocking database work on the store's private pool of threads (0.4.0rc1)."""
        return await self._run_blocking_on(None, fn, *args)

    async def _run_blocking_on(self, key: str | None, fn: Callable[..., _T], *args: Any) -> _T:
        """Like :meth:`_run_blocking`, on the pool thread that ``key`` (a session id) maps to.

        Work for one session always runs on the same thread, so on the same connection, whose
        page cache is then still warm for the next hop of the turn (about a fifth of a turn's
        cost on SQLite). A plain queue and ``call_soon_threadsafe`` instead of
        ``run_in_executor``: half the hand-off cost.
        """
        if self._inline:
            return fn(*args)
        return await self._submit(key, fn, args)

    def _submit(self, key: str | None, fn: Callable[..., _T], args: tuple[Any, ...]) -> asyncio.Future[_T]:
        pool = self._pool
        if pool is None:
            with self._executor_mutex:
                if self._pool is None:
                    self._pool = BlockingPool(self._BLOCKING_IO_WORKERS)
                pool = self._pool
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        pool.submit(key, loop, fut, fn, args)
        return fut

    async def _finish_blocking_on(self, key: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, bool]:
        """Like :meth:`_run_blocking_on`, for work whose outcome the caller must know: ``(result, cancelled)``.

        A thread cannot be stopped, so a cancellation that arrives while ``fn`` runs does not
        abandon it: this waits for ``fn`` to finish — as long as the write takes, up to the
        database's lock timeout; further cancellations meanwhile are absorbed — and reports the
        cancellation as ``cancelled``, for the caller to re-raise once it has applied the result
        (a commit that was written must stay in memory, invariant 4). If ``fn`` raised, that error
        is raised (after a cancellation: ``CancelledError`` from it). The common, uncancelled path
        costs what :meth:`_run_blocking_on` costs (a shield would add a turn of the event loop).
        """
        if self._inline:
            return fn(*args), False
        outcome: list[tuple[bool, Any]] = []

        def job() -> Any:
            try:
                value = fn(*args)
            except BaseException as exc:
                outcome.append((False, exc))
                raise
            outcome.append((True, value))
            return value

        try:
            return await self._submit(key, job, ()), False
        except asyncio.CancelledError:
            pass
        while not outcome:  # the job still runs on its thread: poll for its end (a rare path)
            with suppress(asyncio.CancelledError):
                await asyncio.sleep(0.002)
        ok, value = outcome[0]
        if not ok:
            raise asyncio.CancelledError() from value
        return value, True

    def close(self) -> None:
        """Stop the pool's threads (connections are closed by subclasses)."""
        with self._executor_mutex:
            pool, self._pool = self._pool, None
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            self._keeper_stop.set()
            keeper.join()
            self._keeper_stop = threading.Event()
        if pool is not None:
            pool.shutdown()

    # ---- agents ---------------------------------------------------------------------------
    def _resolve_agent(self, name: str, default_agent: Agent | None) -> Agent:
        from chatflow_agent.core.agent import Agent

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
        placeholder = Agent(name=name, instructions="", model="placeholder")
        placeholder._placeholder = True  # type: ignore[attr-defined]
        return placeholder

    # ---- identity map ---------------------------------------------------------------------
    def _cached(self, session_id: str) -> SessionContext | None:
        with self._cache_mutex:
            return self._weak.get(session_id)

    def _remember(self, session: SessionContext) -> None:
        with self._cache_mutex:
            self._weak[session.session_id] = session
            self._lru[session.session_id] = session
            self._lru.move_to_end(session.session_id)
            while len(self._lru) > self._CACHE_SIZE:
                self._lru.popitem(last=False)

    def _forget_unstored(self, stored: StoredSession | None, session_id: str) -> None:
        """After a failed turn on a session that had no row: the turn made the context, so it goes
        (before the turn there was no session; the next turn starts with its own agent and metadata)."""
        if stored is None:
            cached = self._cached(session_id)
            if cached is not None and cached._token is None:
                self._forget(session_id)

    def _forget(self, session_id: str) -> SessionContext | None:
        with self._cache_mutex:
            self._lru.pop(session_id, None)
            return self._weak.pop(session_id, None)

    def _fill(self, session: SessionContext, stored: StoredSession, default_agent: Agent | None) -> None:
        """Load ``stored`` (with rows) into ``session``: pruned history, row map, token, version."""
        parsed: list[tuple[Message, int]] = []
        for row in stored.rows or []:
            msg = parse_row(row)
            if msg is not None:
                parsed.append((msg, row.id))
        row_of = {id(m): (m, rid) for m, rid in parsed}
        history = prune_history([m for m, _ in parsed], session.max_turns)
        kept = {id(m) for m in history}
        session._history = history
        session._rows = {k: v for k, v in row_of.items() if k in kept}
        session._synced = list(history)
        session._stale_ids = {rid for m, rid in parsed if id(m) not in kept}
        session._metadata = dict(stored.metadata)
        session._active_agent = self._resolve_agent(stored.agent_name, default_agent)
        session._token = stored.token
        session._version = stored.version  # type: ignore[attr-defined]

    def _new_context(self, session_id: str, agent: Agent, metadata: dict[str, Any]) -> SessionContext:
        session = SessionContext(session_id, agent, self.default_max_turns, metadata)
        session._store = self
        session._version = None  # type: ignore[attr-defined]
        return session

    def _materialise(self, session_id: str, stored: StoredSession | None, default_agent: Agent | None,
                     metadata: dict[str, Any] | None) -> SessionContext:
        """The cached context brought up to date with ``stored`` (a head or a full load)."""
        cached = self._cached(session_id)
        if stored is None:
            if cached is not None and cached._token is not None:
                cached._deleted = True  # deleted, possibly by another process
                self._forget(session_id)
                cached = None
            if cached is not None:
                return cached
            assert default_agent is not None
            session = self._new_context(session_id, default_agent, dict(metadata or {}))
            self._remember(session)
            return session
        if cached is not None and cached._token not in (None, stored.token):
            cached._deleted = True  # deleted and created again since we loaded it
            self._forget(session_id)
            cached = None
        if cached is not None and cached._version == stored.version and not cached.in_turn:  # type: ignore[attr-defined]
            self._remember(cached)
            return cached
        if cached is not None and cached.in_turn:
            return cached
        if stored.rows is None:
            stored = self._db_load(session_id) or stored
        agent = default_agent or self._resolve_agent(stored.agent_name, None)
        session = cached or self._new_context(session_id, agent, {})
        self._fill(session, stored, default_agent)
        self._remember(session)
        return session

    # ---- 0.3.4 interface ------------------------------------------------------------------
    def get_or_create(self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None) -> SessionContext:  # noqa: E501
        """The session ``session_id``, created (row written at once) with ``default_agent`` if absent."""
        head = self._db_head(session_id)
        if head is None:
            self._db_create(session_id, default_agent.name, json.dumps(metadata or {}, ensure_ascii=False))
            head = self._db_head(session_id)
        return self._materialise(session_id, head, default_agent, metadata)

    def get(self, session_id: str) -> SessionContext | None:
        """The stored session, or None. Unknown agent names give a placeholder agent (logged once)."""
        head = self._db_head(session_id)
        if head is None:
            cached = self._forget(session_id)
            if cached is not None and cached._token is not None:
                cached._deleted = True
            return None
        return self._materialise(session_id, head, None, None)

    def delete(self, session_id: str) -> bool:
        """Delete the session and its messages; live session objects raise SessionDeletedError.

        True when something was deleted: a stored session, or a live one not yet stored (a first
        turn still running), as the in-memory store answers."""
        cached = self._forget(session_id)
        if cached is not None:
            cached._deleted = True
        return self._db_delete(session_id) or (cached is not None and cached._token is None)

    def list_sessions(self) -> list[str]:
        """Session ids, most recently updated first."""
        return self._db_list()

    def clear(self) -> None:
        with self._cache_mutex:
            sessions = list(self._weak.values())
            self._weak.clear()
            self._lru.clear()
        for s in sessions:
            s._deleted = True
        self._db_clear()

    def is_message_processed(self, message_id: str) -> bool:
        """True if ``message_id`` was claimed less than ``dedup_ttl_hours`` ago."""
        return self._db_is_processed(message_id, self.dedup_ttl_seconds)

    def record_processed_message(self, message_id: str) -> bool:
        """Claim ``message_id`` in one atomic statement: True only for the first claim in the TTL."""
        return self._db_claim(message_id, self.dedup_ttl_seconds)

    def mark_message_processed(self, message_id: str) -> None:
        self._db_claim(message_id, self.dedup_ttl_seconds)

    def purge_processed_messages(self) -> int:
        """Delete expired de-duplication rows; returns how many."""
        return self._db_purge_processed(self.dedup_ttl_seconds)

    def purge_expired_leases(self) -> int:
        """Delete lease and waiter rows that expired more than ``lease_ttl_seconds`` ago (left by
        processes that died); returns how many. Turns also do it, at most once every ``_LEASE_PURGE_EVERY`` seconds."""
        self._last_lease_purge = time.time()
        return self._db_purge_leases(self._last_lease_purge - self.lease_ttl_seconds)

    # ---- commits --------------------------------------------------------------------------
    @staticmethod
    def _delta(session: SessionContext) -> tuple[list[Message], list[Message]] | None:
        """``(new messages, messages whose rows go)`` when the history is the one last written or
        loaded (``session._synced``) with messages dropped from its front and new ones appended,
        else None.

        That is the shape of nearly every commit (a turn appends, pruning drops the oldest turn),
        and checking it costs O(changed messages) plus one identity comparison in C, where the
        general path in :meth:`_changes` takes ``id()`` of every message twice per commit.
        """
        synced = session._synced
        if synced is None:
            return None
        history, rows = session._history, session._rows
        kept = len(history)
        while kept and id(history[kept - 1]) not in rows:
            kept -= 1
        dropped = len(synced) - kept
        if dropped < 0 or not all(map(is_, history[:kept], synced[dropped:])):
            return None
        new = history[kept:]
        if len(new) > 1 and len(set(map(id, new))) != len(new):
            return None  # one object added twice: the general path gives each occurrence its own row
        return new, synced[:dropped]

    def _changes(self, session: SessionContext, release_owner: str | None = None,
                 delta: tuple[list[Message], list[Message]] | None = None) -> Changes:
        """What ``session`` must write: messages without a row, rows no longer in its history.

        Messages are matched to rows by identity (``session._rows`` holds each persisted message,
        so its ``id()`` cannot be reused while the row is known). ``delta`` (from :meth:`_delta`)
        gives both directly; otherwise set operations over the whole (pruned) history find them.
        """
        if delta is not None:
            inserts, dropped = delta
            rows = session._rows
            delete_ids = [rows[id(m)][1] for m in dropped]
        else:
            inserts, delete_ids = self._compare_all(session)
        delete_ids.extend(session._stale_ids)
        metadata = session._metadata
        return Changes(
            session_id=session.session_id,
            token=session._token,
            agent_name=session._active_agent.name,
            metadata_json=json.dumps(metadata, ensure_ascii=False, default=str) if metadata else "{}",
            inserts=inserts,
            delete_ids=sorted(set(delete_ids)),
            release_owner=release_owner,
            version=getattr(session, "_version", None),
        )

    @staticmethod
    def _compare_all(session: SessionContext) -> tuple[list[Message], list[int]]:
        """Messages of the history without a row, and ids of rows whose message left it."""
        history, rows = session._history, session._rows
        ids = list(map(id, history))
        live = set(ids)
        if len(live) != len(ids):
            # One message object added twice: each occurrence needs its own row, so the repeats
            # become copies (otherwise one row would stand for two messages, and be lost on reload).
            seen: set[int] = set()
            for i, m in enumerate(history):
                if id(m) in seen:
                    history[i] = m = m.model_copy()
                    ids[i] = id(m)
                seen.add(id(m))
            live = set(ids)
        last_row, after_new = -1, False
        for i, m in enumerate(history):
            entry = rows.get(ids[i])
            if entry is None:
                after_new = True
            elif after_new or entry[1] < last_row:
                # A stored message now behind a new message or one stored after it (an object added
                # again once its first occurrence was pruned): rows load in id order, so it needs
                # a new row at its new place.
                history[i] = m.model_copy()
                ids[i] = id(history[i])
            else:
                last_row = entry[1]
        live = set(ids)
        new = live.difference(rows)
        if not new:
            inserts: list[Message] = []
        elif new.issuperset(ids[-len(new):]):  # the usual case: the new messages are the newest
            inserts = history[-len(new):]
        else:
            inserts = [m for m, i in zip(history, ids, strict=True) if i in new]
        return inserts, [rows[key][1] for key in rows.keys() - live]

    def _apply_commit(self, session: SessionContext, changes: Changes, result: CommitResult,
                      delta: tuple[list[Message], list[Message]] | None = None) -> None:
        rows = session._rows
        if delta is not None:
            for m in delta[1]:
                del rows[id(m)]
        else:
            for key in rows.keys() - set(map(id, session._history)):
                del rows[key]
        rows.update(zip(map(id, changes.inserts), zip(changes.inserts, result.new_ids, strict=True), strict=True))
        session._synced = list(session._history)  # now every message has its row, and no other row is known
        session._stale_ids = set()
        session._token = result.token
        session._version = result.version  # type: ignore[attr-defined]

    def _commit_blocking(self, session: SessionContext, release_owner: str | None = None) -> None:
        session._check()
        delta = self._delta(session)
        changes = self._changes(session, release_owner, delta)
        try:
            result = self._db_commit(changes)
        except SessionDeletedError:
            session._deleted = True
            self._forget(session.session_id)
            raise
        self._apply_commit(session, changes, result, delta)

    def _flush_sync(self, session: SessionContext) -> None:
        self._commit_blocking(session)

    async def _flush_async(self, session: SessionContext) -> None:
        session._check()
        await self._run_blocking_on(session.session_id, self._commit_blocking, session)

    # ---- turns ----------------------------------------------------------------------------
    def _begin_blocking(self, session_id: str, owner: str, queue: bool = True) -> tuple[bool, StoredSession | None]:
        if not self._db_acquire_lease(session_id, owner, self.lease_ttl_seconds, queue):
            return False, None
        if time.time() - self._last_lease_purge > self._LEASE_PURGE_EVERY:
            try:
                self.purge_expired_leases()
            except Exception:  # noqa: BLE001 - tidying only: the turn goes on, the next purge retries
                logger.exception("Purging expired session leases failed")
        try:
            head = self._db_head(session_id)
            cached = self._cached(session_id)
            if head is not None and not (cached is not None and cached._token == head.token
                                         and cached._version == head.version):  # type: ignore[attr-defined]
                head = self._db_load(session_id)
        except BaseException:
            self._db_release_lease(session_id, owner)
            raise
        return True, head

    def _renew_blocking(self, session_id: str, owner: str) -> None:
        if not self._db_renew_lease(session_id, owner, self.lease_ttl_seconds):
            logger.warning("Lost the lease of session %r while a turn was running", session_id)

    async def _heartbeat(self, session_id: str, owner: str) -> None:
        while True:
            await self._run_blocking_on(session_id, self._renew_blocking, session_id, owner)
            await asyncio.sleep(self.lease_ttl_seconds / 3)

    @asynccontextmanager
    async def turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None, *, wait: bool = True
    ) -> AsyncIterator[SessionContext]:
        if wait:
            await self._locks.acquire(session_id)
        elif not self._locks.try_acquire(session_id):
            raise SessionBusyError(session_id)
        try:
            owner = _lease_owner()
            stored = await self._acquire_lease_async(session_id, owner, wait)
            # The lease is renewed every third of its TTL; most turns end before the first renewal,
            # so the renewing task is only started by a timer (a task per turn costs ~5 % of a turn).
            tasks: list[asyncio.Task[None]] = []
            timer = asyncio.get_running_loop().call_later(
                self.lease_ttl_seconds / 3,
                lambda: tasks.append(asyncio.ensure_future(self._heartbeat(session_id, owner))))
            committed = False
            try:
                session = self._materialise(session_id, stored, default_agent, metadata)
                with session._atomic():
                    yield session
                    _, cancelled = await self._finish_blocking_on(session_id, self._commit_blocking, session, owner)
                    committed = session._committed = True
                if cancelled:  # cancelled while the commit was written: the turn is kept, then cancelled
                    raise asyncio.CancelledError()
            finally:
                timer.cancel()
                for heartbeat in tasks:
                    heartbeat.cancel()
                    with suppress(asyncio.CancelledError):
                        await heartbeat
                if not committed:
                    self._forget_unstored(stored, session_id)
                    await asyncio.shield(self._submit(session_id, self._db_release_lease, (session_id, owner)))
        finally:
            self._locks.release(session_id)

    async def _acquire_lease_async(self, session_id: str, owner: str, wait: bool) -> StoredSession | None:
        delay = 0.002
        try:
            while True:
                ok, stored = await self._run_blocking_on(session_id, self._begin_blocking, session_id, owner, wait)
                if ok:
                    return stored
                if not wait:
                    raise SessionBusyError(session_id)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)
        except asyncio.CancelledError:
            # Leave the cross-process waiting line we may have joined, and give back the lease that
            # ``_begin_blocking`` may still have won on its thread after we were cancelled (this
            # runs after it, on the same thread). Its own errors already released the lease.
            await asyncio.shield(self._submit(session_id, self._abandon_lease_blocking, (session_id, owner, wait)))
            raise
        except BaseException:
            if wait:  # leave the cross-process waiting line we may have joined
                await asyncio.shield(self._submit(session_id, self._db_leave_queue, (session_id, owner)))
            raise

    def _abandon_lease_blocking(self, session_id: str, owner: str, queued: bool) -> None:
        if queued:
            self._db_leave_queue(session_id, owner)
        self._db_release_lease(session_id, owner)

    @contextmanager
    def sync_turn(
        self, session_id: str, default_agent: Agent, metadata: dict[str, Any] | None = None, *, wait: bool = True
    ) -> Iterator[SessionContext]:
        if wait:
            self._locks.acquire_sync(session_id)
        elif not self._locks.try_acquire(session_id):
            raise SessionBusyError(session_id)
        try:
            owner = _lease_owner()
            delay = 0.002
            try:
                while True:
                    ok, stored = self._begin_blocking(session_id, owner, wait)
                    if ok:
                        break
                    if not wait:
                        raise SessionBusyError(session_id)
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
            except BaseException:
                if wait:
                    self._db_leave_queue(session_id, owner)
                raise
            committed = False
            self._keep_lease(session_id, owner)  # no event loop here: a thread renews the lease
            try:
                session = self._materialise(session_id, stored, default_agent, metadata)
                with session._atomic():
                    yield session
                    self._commit_blocking(session, owner)
                    committed = True
            finally:
                self._release_kept_lease(session_id, owner)
                if not committed:
                    self._forget_unstored(stored, session_id)
                    self._db_release_lease(session_id, owner)
        finally:
            self._locks.release(session_id)

    def _keep_lease(self, session_id: str, owner: str) -> None:
        """Renew this lease every third of its TTL from the store's keeper thread (sync turns)."""
        with self._executor_mutex:
            self._kept_leases.add((session_id, owner))
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keeper_loop, name="chatflow-lease-keeper", daemon=True)
                self._keeper.start()

    def _release_kept_lease(self, session_id: str, owner: str) -> None:
        with self._executor_mutex:
            self._kept_leases.discard((session_id, owner))

    def _keeper_loop(self) -> None:
        while not self._keeper_stop.wait(self.lease_ttl_seconds / 3):
            with self._executor_mutex:
                kept = list(self._kept_leases)
            for session_id, owner in kept:
                try:
                    renewed = self._db_renew_lease(session_id, owner, self.lease_ttl_seconds)
                except Exception:  # noqa: BLE001 - retried on the next tick
                    logger.exception("Renewing the lease of session %r failed", session_id)
                    continue
                with self._executor_mutex:
                    lost = not renewed and (session_id, owner) in self._kept_leases
                if lost:
                    logger.warning("Lost the lease of session %r while a turn was running", session_id)
