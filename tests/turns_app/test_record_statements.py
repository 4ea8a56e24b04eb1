"""A turn record rides on the lease's own statements: taking a session's lease also opens the turn's
record (and marks a dead turn's record interrupted), releasing it also closes the record and adds it to
the session's totals, and a record that is no longer running adds nothing. PostgreSQL spells each as one
statement (data-modifying CTEs), SQLite as statements in the lease's transaction: the scenarios run
through ``DjangoBackend`` on whichever database the tests use, so both spellings keep one behaviour."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from django.db import connection

from chatflow_agent.core.reports import TurnReport
from chatflow_agent.core.sql import POSTGRESQL, SessionRules
from sessions_app.store import DjangoBackend
from turns_app import records
from turns_app.models import SessionTotals, TurnRecord

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                     reason="the riders are PostgreSQL's (data-modifying CTEs)")


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


@pytest.fixture
def backend() -> Iterator[DjangoBackend]:
    backend = DjangoBackend()
    yield backend
    backend.close()


def started(owner: str) -> TurnReport:
    report = TurnReport(source="api", user_text="where is order 7?", owner=owner)
    report.started_at = time.time()
    return report


def ended(report: TurnReport, status: str = "completed") -> TurnReport:
    report.finished_at = time.time()
    report.status = status
    return report


def test_taking_the_lease_opens_the_record_and_marks_a_dead_turn_interrupted(backend):
    TurnRecord.objects.create(session_id="s1", owner="dead-process", status="running")  # its lease is gone

    assert backend.acquire_lease("s1", "me", 30.0, False, started("me")) is True

    statuses = dict(TurnRecord.objects.filter(session_id="s1").values_list("owner", "status"))
    assert statuses == {"dead-process": "interrupted", "me": "running"}
    assert TurnRecord.objects.get(owner="me").user_text == "where is order 7?"
    totals = SessionTotals.objects.get(pk="s1")  # a recorded turn, whose spend nobody learned
    assert (totals.turns, totals.cost_known, totals.last_error) == (1, False, records.INTERRUPTED_ERROR)


def test_a_lease_held_by_a_live_turn_opens_no_record_and_interrupts_nothing(backend):
    assert backend.acquire_lease("s1", "me", 30.0, False, started("me")) is True

    assert backend.acquire_lease("s1", "other", 30.0, False, started("other")) is False

    assert dict(TurnRecord.objects.filter(session_id="s1").values_list("owner", "status")) == {"me": "running"}
    assert not SessionTotals.objects.filter(pk="s1").exists()  # nothing was marked: no totals row


def test_releasing_the_lease_closes_the_record_and_adds_the_totals_once(backend):
    report = started("me")
    backend.acquire_lease("s1", "me", 30.0, False, report)

    backend.release_lease("s1", "me", ended(report, "failed"))
    backend.release_lease("s1", "me", report)  # no lease, no running record: changes nothing

    record = TurnRecord.objects.get(owner="me")
    assert record.status == "failed" and record.finished_at is not None and record.duration_ms is not None
    totals = SessionTotals.objects.get(pk="s1")
    assert totals.turns == 1  # a record no longer running is not counted again


def test_a_record_marked_interrupted_meanwhile_stays_so_and_adds_nothing_when_its_turn_ends(backend):
    report = started("me")
    backend.acquire_lease("s1", "me", 30.0, False, report)
    TurnRecord.objects.filter(owner="me").update(status="interrupted", error=records.INTERRUPTED_ERROR)

    backend.release_lease("s1", "me", ended(report))

    assert TurnRecord.objects.get(owner="me").status == "interrupted"
    assert not SessionTotals.objects.filter(pk="s1").exists()  # no row changed: the totals were not touched


def take(cursor: CountingCursor, rules: SessionRules, report: TurnReport) -> bool:
    rider = records.lease_opening_turn(POSTGRESQL, "s1", report)
    return rules.acquire_lease(cursor, lambda fn: fn(cursor), "s1", report.owner, 30.0, False, rider)


@postgresql_only
def test_on_postgresql_taking_or_releasing_a_lease_with_its_record_is_one_statement(cursor):
    TurnRecord.objects.create(session_id="s1", owner="dead-process", status="running")  # its lease is gone
    rules = SessionRules(POSTGRESQL)
    report = started("me")

    assert take(cursor, rules, report) is True  # the lease, the record, the interrupted mark and its totals
    assert take(cursor, rules, started("other")) is False
    assert cursor.statements == 2
    released = rules.release_lease(cursor, "s1", "me", records.lease_closing_turn(POSTGRESQL, "s1", ended(report)))
    again = rules.release_lease(cursor, "s1", "me", records.lease_closing_turn(POSTGRESQL, "s1", report))

    assert (released, again) == (True, False)  # the row count still says whether the lease was released
    assert cursor.statements == 4
    statuses = dict(TurnRecord.objects.filter(session_id="s1").values_list("owner", "status"))
    assert statuses == {"dead-process": "interrupted", "me": "completed"}
    assert SessionTotals.objects.get(pk="s1").turns == 2  # the interrupted turn counts too


sqlite_only = pytest.mark.skipif(connection.vendor != "sqlite",
                                 reason="counts SQLite virtual-machine steps (PostgreSQL plans by statistics)")


def steps_of_one_recorded_turn(cursor: CountingCursor, session_id: str) -> int:
    """SQLite virtual-machine steps of opening and closing one turn's record on ``session_id``."""
    from chatflow_agent.core.sql import SQLITE

    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    report = started(f"{session_id}-next")
    connection.connection.set_progress_handler(count, 1)
    try:
        records.open_turn(cursor, SQLITE, session_id, report)
        records.close_turn(cursor, SQLITE, session_id, ended(report))
    finally:
        connection.connection.set_progress_handler(None, 1)
    return steps


@sqlite_only
def test_a_turns_record_statements_cost_the_same_on_a_long_session_as_on_a_new_one(cursor):
    """Opening and closing a record search only the open records (running, or waiting for a cancelled turn's
    figures), not the session's history nor the table's."""
    TurnRecord.objects.bulk_create([TurnRecord(session_id="long", owner=f"t{n}", status="completed")
                                    for n in range(2000)])
    TurnRecord.objects.bulk_create([TurnRecord(session_id=f"other{n}", owner=f"o{n}", status="failed")
                                    for n in range(2000)])
    steps_of_one_recorded_turn(cursor, "warm-up")  # statements prepared, pages cached
    new, long = steps_of_one_recorded_turn(cursor, "new"), steps_of_one_recorded_turn(cursor, "long")
    assert long < new * 1.5, (new, long)  # 2,000 ended records in the session add (next to) nothing
    assert TurnRecord.objects.filter(session_id="long", status="completed").count() == 2001
