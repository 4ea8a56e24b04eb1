"""On PostgreSQL a turn record rides on the lease's own statements: the upsert that takes a session's
lease also opens the turn's record (and marks a dead turn's record interrupted), and the delete that
releases it also closes the record and adds it to the session's totals, each one statement."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from django.db import connection

from chatflow_agent.core.reports import TurnReport
from chatflow_agent.core.sql import POSTGRESQL, SessionRules
from turns_app import records
from turns_app.models import SessionTotals, TurnRecord

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the riders are PostgreSQL's (data-modifying CTEs)"),
]


class CountingCursor:
    """The driver's cursor, counting the statements sent through it."""

    def __init__(self, cursor: Any) -> None:
        self.cursor = cursor
        self.statements = 0

    @property
    def rowcount(self) -> int:
        return int(self.cursor.rowcount)

    def execute(self, sql: str, params: Sequence[Any], /) -> object:
        self.statements += 1
        return self.cursor.execute(sql, params)

    def fetchone(self) -> Any:
        return self.cursor.fetchone()

    def fetchall(self) -> Sequence[Any]:
        return self.cursor.fetchall()


@pytest.fixture
def cursor() -> Iterator[CountingCursor]:
    connection.ensure_connection()
    raw = connection.connection.cursor()  # autocommit: each statement is its own transaction
    yield CountingCursor(raw)
    raw.close()


def started(owner: str) -> TurnReport:
    report = TurnReport(source="api", user_text="where is order 7?", owner=owner)
    report.started_at = time.time()
    return report


def take(cursor: CountingCursor, rules: SessionRules, report: TurnReport) -> bool:
    rider = records.lease_opening_turn(POSTGRESQL, "s1", report)
    return rules.acquire_lease(cursor, lambda fn: fn(cursor), "s1", report.owner, 30.0, False, rider)


def test_one_statement_takes_the_lease_opens_the_record_and_marks_a_dead_turn_interrupted(cursor):
    TurnRecord.objects.create(session_id="s1", owner="dead-process", status="running")  # its lease is gone

    assert take(cursor, SessionRules(POSTGRESQL), started("me")) is True

    assert cursor.statements == 1
    statuses = dict(TurnRecord.objects.filter(session_id="s1").values_list("owner", "status"))
    assert statuses == {"dead-process": "interrupted", "me": "running"}
    assert TurnRecord.objects.get(owner="me").user_text == "where is order 7?"
    assert SessionTotals.objects.get(pk="s1").last_error == records.INTERRUPTED_ERROR


def test_a_lease_held_by_a_live_turn_opens_no_record_and_interrupts_nothing(cursor):
    rules = SessionRules(POSTGRESQL)
    assert take(cursor, rules, started("me")) is True

    assert take(cursor, rules, started("other")) is False

    assert cursor.statements == 2
    assert dict(TurnRecord.objects.filter(session_id="s1").values_list("owner", "status")) == {"me": "running"}


def test_one_statement_releases_the_lease_closes_the_record_and_adds_the_totals(cursor):
    rules = SessionRules(POSTGRESQL)
    report = started("me")
    take(cursor, rules, report)
    report.finished_at = time.time()
    report.status = "completed"

    released = rules.release_lease(cursor, "s1", "me", records.lease_closing_turn(POSTGRESQL, report))
    again = rules.release_lease(cursor, "s1", "me", records.lease_closing_turn(POSTGRESQL, report))

    assert (released, again) == (True, False)  # the row count still says whether the lease was released
    assert cursor.statements == 3
    record = TurnRecord.objects.get(owner="me")
    assert record.status == "completed" and record.finished_at is not None and record.duration_ms is not None
    assert SessionTotals.objects.get(pk="s1").turns == 1  # a record no longer running is not counted again
