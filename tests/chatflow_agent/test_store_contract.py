"""The store contract (tests/store_contract.py) on the runtime's own stores."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from chatflow_agent import SessionStore, SQLiteSessionStore
from tests.store_contract import *  # noqa: F403 - the contract's tests run here
from tests.store_contract import StoreKit


def _memory_kit() -> StoreKit:
    return StoreKit(make=lambda **kw: SessionStore(**kw), reopen=None)


def _sqlite_kit(path_factory) -> StoreKit:
    opened: list[SQLiteSessionStore] = []

    def make(**kw):
        store = SQLiteSessionStore(path_factory(), **kw)
        opened.append(store)
        return store

    def reopen(store):
        again = SQLiteSessionStore(store.db_path, default_max_turns=store.default_max_turns)
        opened.append(again)
        return again

    kit = StoreKit(make=make, reopen=reopen)
    kit.opened = opened  # type: ignore[attr-defined]
    return kit


@pytest.fixture(params=["memory", "sqlite-file", "sqlite-memory", "sqlite-shared-cache", "sqlite-named-memory"])
def kit(request, tmp_path: Path):
    kind = request.param
    if kind == "memory":
        yield _memory_kit()
        return
    if kind == "sqlite-file":
        kit = _sqlite_kit(lambda: str(tmp_path / f"{uuid.uuid4().hex}.db"))
    elif kind == "sqlite-memory":
        kit = _sqlite_kit(lambda: ":memory:")
        kit.reopen = None
        kit.thread_rounds = 10  # the in-memory URI below runs the full 100 on the same inline path
    elif kind == "sqlite-shared-cache":
        def shared():
            return "file::memory:?cache=shared"
        kit = _sqlite_kit(shared)
        kit.thread_rounds = 10  # as ":memory:"
    else:
        kit = _sqlite_kit(lambda: f"file:chatflow-{uuid.uuid4().hex}?mode=memory&cache=shared")
    if kind == "sqlite-shared-cache":
        original = kit.make

        def make_clean(**kw):
            store = original(**kw)
            store.clear()
            return store

        kit.make = make_clean
    yield kit
    for store in kit.opened:
        store.close()
