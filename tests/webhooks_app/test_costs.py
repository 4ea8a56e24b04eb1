"""``chatflow_worker --costs``: round trips and write transactions counted where the store runs them."""

from __future__ import annotations

import pytest
from django.db import connections

from chatflow_agent import Agent, Message, Role
from sessions_app.store import DjangoSessionStore
from webhooks_app.costs import Costs

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = Agent(name="Support", instructions="help")


@pytest.fixture
def costs():
    kept = Costs()
    kept.install()
    yield kept
    kept.uninstall()
    connections.close_all()  # the next test's connections are not counted


def test_it_counts_the_store_statements_run_on_the_driver_cursor(costs):
    store = DjangoSessionStore()
    try:
        with store.sync_turn("s", AGENT) as session:
            session.add_message(Message(role=Role.USER, content="hello"))
            session.add_message(Message(role=Role.MODEL, content="hi"))
    finally:
        store.close()
    costs.deliveries = 1
    per = costs.report()["per_delivery"]
    # the lease upsert (autocommitted, or its own transaction) and the commit's transaction, which releases it
    assert per["round_trips"]["lease"] >= 1
    assert per["round_trips"]["session"] >= 3  # head, the commit's session row and message rows
    assert per["write_transactions"]["total"] >= 2  # the lease and the commit
    assert per["ms_by_stage"]["commit"] > 0


def test_it_counts_nothing_once_uninstalled(costs):
    costs.uninstall()
    connections.close_all()
    store = DjangoSessionStore()
    try:
        with store.sync_turn("s", AGENT) as session:
            session.add_message(Message(role=Role.USER, content="hello"))
    finally:
        store.close()
    assert costs.report()["per_delivery"]["round_trips"]["total"] == 0
    costs.install()  # the fixture uninstalls it again
