"""The store contract (tests/store_contract.py) on DjangoSessionStore — on SQLite, and on PostgreSQL in
the second run of `dev.py test`."""

from __future__ import annotations

import pytest

from sessions_app.store import DjangoSessionStore
from tests.store_contract import *  # noqa: F403 - the contract's tests run here
from tests.store_contract import StoreKit


@pytest.fixture
def kit(transactional_db):
    opened: list[DjangoSessionStore] = []

    def make(**kw):
        store = DjangoSessionStore(**kw)
        opened.append(store)
        return store

    def reopen(store):
        again = DjangoSessionStore(using=store.using, default_max_turns=store.default_max_turns)
        opened.append(again)
        return again

    yield StoreKit(make=make, reopen=reopen, thread_rounds=10)
    for store in opened:
        store.close()
