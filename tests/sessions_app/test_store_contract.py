"""The store contract (tests/store_contract.py) on DjangoSessionStore — on SQLite, and on PostgreSQL in
the second run of `dev.py test`."""

from __future__ import annotations

import pytest
from django.db import connection

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

    # Rounds of the threaded scenarios (the runtime's stores run 100): every sync write here is a
    # durable commit through the ORM — ~1 ms on SQLite, ~9 ms on this machine's PostgreSQL (fsync),
    # so 100 rounds of 8 threads x 50 messages would take ~2 and ~6 minutes. The races the scenarios
    # look for (lost or doubled rows) showed within the first round when they existed.
    rounds = 3 if connection.vendor == "postgresql" else 10
    # The racing scenarios likewise (a round is a new session and its writes); the races showed within
    # the first rounds.
    race_rounds = 2 if connection.vendor == "postgresql" else 15
    yield StoreKit(make=make, reopen=reopen, thread_rounds=rounds, race_rounds=race_rounds)
    for store in opened:
        store.close()
