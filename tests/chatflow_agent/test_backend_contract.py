"""The store contract (tests/store_contract.py) on a backend written here from the public contract only.

``DictBackend`` implements ``chatflow_agent.core.backend.SessionBackend`` as its docstrings describe
it, over plain dicts, and ``PersistentSessionStore`` runs the whole contract suite on it: proof
that the backend contract says everything a store needs.
"""

from __future__ import annotations

import inspect
import itertools
import threading
import time
from dataclasses import dataclass, field

import pytest

from chatflow_agent.core.backend import Changes, CommitResult, SessionBackend, StoredRow, StoredSession
from chatflow_agent.core.memory import PersistentSessionStore, SQLiteBackend
from chatflow_agent.exceptions import SessionBusyError, SessionDeletedError
from tests.store_contract import *  # noqa: F403 - the contract's tests run here
from tests.store_contract import StoreKit

WAITER_TTL = 5.0


@dataclass
class _Session:
    agent_name: str
    metadata_json: str
    token: int
    version: int
    updated: float
    rows: dict[int, StoredRow] = field(default_factory=dict)


@dataclass
class DictDatabase:
    """What several backends (as several processes would) share."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: dict[str, _Session] = field(default_factory=dict)
    claims: dict[str, float] = field(default_factory=dict)
    leases: dict[str, tuple[str, float]] = field(default_factory=dict)
    waiters: dict[str, tuple[int, str, float]] = field(default_factory=dict)  # owner -> (ticket, session, expiry)
    serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class DictBackend:
    def __init__(self, db: DictDatabase) -> None:
        self.db = db

    @property
    def inline(self) -> bool:
        return False

    def _stored(self, session_id: str, with_rows: bool) -> StoredSession | None:
        s = self.db.sessions.get(session_id)
        if s is None:
            return None
        import json

        rows = [s.rows[i] for i in sorted(s.rows)] if with_rows else None
        return StoredSession(session_id, s.agent_name, json.loads(s.metadata_json), s.token, s.version, rows)

    def head(self, session_id: str) -> StoredSession | None:
        with self.db.lock:
            return self._stored(session_id, False)

    def load(self, session_id: str) -> StoredSession | None:
        with self.db.lock:
            return self._stored(session_id, True)

    def create(self, session_id: str, agent_name: str, metadata_json: str) -> None:
        with self.db.lock:
            if session_id not in self.db.sessions:
                self.db.sessions[session_id] = _Session(agent_name, metadata_json, next(self.db.serial),
                                                        next(self.db.serial), time.time())

    def commit(self, changes: Changes) -> CommitResult:
        db = self.db
        with db.lock:
            if changes.hooks is not None:
                import json

                changes.hooks.committing(changes.session_id, json.loads(changes.metadata_json), changes.report)
            s = db.sessions.get(changes.session_id)
            if changes.token is not None and (s is None or s.token != changes.token):
                raise SessionDeletedError(changes.session_id)
            owner = changes.release_owner
            if owner and db.leases.get(changes.session_id, ("", 0.0))[0] != owner:
                raise SessionBusyError(changes.session_id)
            if s is None:
                s = db.sessions[changes.session_id] = _Session("", "{}", next(db.serial), 0, 0.0)
            s.agent_name, s.metadata_json, s.updated = changes.agent_name, changes.metadata_json, time.time()
            for row_id in changes.delete_ids:
                s.rows.pop(row_id, None)
            new_ids = []
            for msg in changes.inserts:
                row_id = next(db.serial)
                s.rows[row_id] = StoredRow(row_id, msg.role.value, msg.content, msg.model_dump_json())
                new_ids.append(row_id)
            if owner:
                del db.leases[changes.session_id]
            s.version = next(db.serial)
            return CommitResult(new_ids, s.token, s.version)

    def delete(self, session_id: str) -> bool:
        with self.db.lock:
            return self.db.sessions.pop(session_id, None) is not None

    def list_sessions(self) -> list[str]:
        with self.db.lock:
            return [k for k, _ in sorted(self.db.sessions.items(), key=lambda kv: -kv[1].updated)]

    def clear(self) -> None:
        with self.db.lock:
            self.db.sessions.clear()

    def claim_message(self, message_id: str, ttl_seconds: float) -> bool:
        with self.db.lock:
            now = time.time()
            if now - self.db.claims.get(message_id, -1e18) < ttl_seconds:
                return False
            self.db.claims[message_id] = now
            return True

    def release_claim(self, message_id: str) -> None:
        with self.db.lock:
            self.db.claims.pop(message_id, None)

    def is_message_claimed(self, message_id: str, ttl_seconds: float) -> bool:
        with self.db.lock:
            return time.time() - self.db.claims.get(message_id, -1e18) < ttl_seconds

    def purge_claims(self, ttl_seconds: float) -> int:
        with self.db.lock:
            old = [k for k, at in self.db.claims.items() if time.time() - at >= ttl_seconds]
            for k in old:
                del self.db.claims[k]
            return len(old)

    def acquire_lease(self, session_id: str, owner: str, ttl_seconds: float, queue: bool,
                      report: object = None) -> bool:  # keeps no turn records: the report is ignored
        db = self.db
        with db.lock:
            now = time.time()
            mine = db.waiters.get(owner)
            ahead = any(sid == session_id and expiry >= now and other != owner
                        and (mine is None or ticket < mine[0])
                        for other, (ticket, sid, expiry) in db.waiters.items())
            lease = db.leases.get(session_id)
            if (lease is None or lease[1] < now) and not ahead:
                db.leases[session_id] = (owner, now + ttl_seconds)
                db.waiters.pop(owner, None)
                return True
            if queue:
                ticket = mine[0] if mine is not None else next(db.serial)
                db.waiters[owner] = (ticket, session_id, now + WAITER_TTL)
            return False

    def leave_queue(self, session_id: str, owner: str) -> None:
        with self.db.lock:
            self.db.waiters.pop(owner, None)

    def renew_lease(self, session_id: str, owner: str, ttl_seconds: float) -> bool:
        with self.db.lock:
            if self.db.leases.get(session_id, ("", 0.0))[0] != owner:
                return False
            self.db.leases[session_id] = (owner, time.time() + ttl_seconds)
            return True

    def release_lease(self, session_id: str, owner: str, report: object = None) -> None:
        with self.db.lock:
            if self.db.leases.get(session_id, ("", 0.0))[0] == owner:
                del self.db.leases[session_id]

    def purge_leases(self, before: float) -> int:
        with self.db.lock:
            leases = [k for k, (_, expiry) in self.db.leases.items() if expiry < before]
            waiters = [k for k, (_, _, expiry) in self.db.waiters.items() if expiry < before]
            for k in leases:
                del self.db.leases[k]
            for k in waiters:
                del self.db.waiters[k]
            return len(leases) + len(waiters)

    def close(self) -> None:
        return None


def _protocol_members() -> dict[str, object]:
    return {name: member for name, member in vars(SessionBackend).items() if not name.startswith("_")}


@pytest.mark.parametrize("backend_class", [DictBackend, SQLiteBackend])
def test_a_backend_has_every_member_of_the_protocol_with_its_parameters(backend_class) -> None:
    # mypy checks only the runtime (pyproject.toml), so the shape is checked here, member by member.
    members = _protocol_members()
    assert {"head", "commit", "acquire_lease", "purge_leases", "close", "inline"} <= members.keys()
    for name, member in members.items():
        implemented = getattr(backend_class, name, None)
        assert implemented is not None, f"{backend_class.__name__} lacks {name}"
        if isinstance(member, property):
            assert isinstance(implemented, property) or not callable(implemented), name
        else:
            assert list(inspect.signature(implemented).parameters) == list(inspect.signature(member).parameters), name
    assert DictBackend(DictDatabase()).inline is False


@pytest.fixture
def kit():
    db = DictDatabase()
    opened: list[PersistentSessionStore] = []

    def make(**kw):
        store = PersistentSessionStore(DictBackend(db), **kw)
        opened.append(store)
        return store

    def reopen(store):
        again = PersistentSessionStore(DictBackend(db), default_max_turns=store.default_max_turns)
        opened.append(again)
        return again

    # 10 rounds of the threaded scenarios: this backend proves the contract complete; the 100-round
    # runs are the real stores' (tests/chatflow_agent/test_store_contract.py).
    yield StoreKit(make=make, reopen=reopen, thread_rounds=10)
    for store in opened:
        store.close()
