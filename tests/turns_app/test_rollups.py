"""The rollups' fold: each ended record counted exactly once whatever order records commit in and however
many folders run, a rollback moving records folded or not, and the worker heartbeat folding."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from turns_app import rollups
from turns_app.models import TurnRecord, TurnRollup
from turns_app.usage import mark_rolled_back
from webhooks_app import heartbeat

pytestmark = pytest.mark.django_db(transaction=True)
postgresql_only = pytest.mark.skipif(connection.vendor != "postgresql",
                                     reason="concurrent writers: SQLite has one writer at a time")


def record(session_id: str, status: str = "completed", **fields: Any) -> TurnRecord:
    return TurnRecord.objects.create(session_id=session_id, owner=f"h:1:{session_id}:", status=status,
                                     duration_ms=5.0, finished_at=timezone.now(), **fields)


def turns_rolled_up(status: str = "completed") -> int:
    return sum(r.turns for r in TurnRollup.objects.filter(span="hour", status=status))


def turns_read(status: str = "completed") -> int:
    cells = rollups.read(timezone.now() - timedelta(hours=2)).cells
    return sum(cell.turns for (_, s), cell in cells.items() if s == status)


class InThread:
    """``work`` on its own thread (and so its own database connection), closed when it ends."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._work = work
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self._work()
        except BaseException as exc:  # noqa: BLE001 - handed to the test by join()
            self.error = exc
        finally:
            connections.close_all()

    def join(self) -> Any:
        self.thread.join(30)
        assert not self.thread.is_alive()
        if self.error:
            raise self.error
        return self.result


def waiting_on_a_lock() -> int:
    """How many other connections to this database wait on a lock now."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]


def test_a_fold_counts_each_ended_record_once_and_leaves_running_ones_for_later():
    record("a"), record("b", status="failed")
    running = record("c", status="running")
    assert turns_read() == 1 and turns_rolled_up() == 0  # read live before any fold
    assert rollups.fold() == 2 and rollups.fold() == 0
    assert (turns_rolled_up(), turns_rolled_up("failed"), turns_read()) == (1, 1, 1)
    TurnRecord.objects.filter(pk=running.pk).update(status="completed")
    assert turns_read() == 2  # ended since: counted live, then folded once
    assert rollups.fold() == 1 and (turns_rolled_up(), turns_read()) == (2, 2)
    assert not TurnRecord.objects.filter(folded=False).exists()


def test_a_fold_works_in_batches_and_stops_after_the_batches_asked_for():
    for n in range(5):
        record(f"s{n}")
    assert rollups.fold(batch=2, batches=1) == 2 and turns_read() == 5
    assert rollups.fold(batch=2) == 3 and turns_rolled_up() == 5


def test_a_rollback_moves_turns_folded_or_not():
    folded = record("s1", first_message_id=1)
    rollups.fold()
    record("s1", first_message_id=2)  # not folded yet
    assert mark_rolled_back("s1", [1, 2]) == 2
    assert (turns_rolled_up(), turns_rolled_up("rolled_back")) == (0, 1)  # the folded one moved
    assert (turns_read(), turns_read("rolled_back")) == (0, 2)
    assert rollups.fold() == 1 and (turns_rolled_up(), turns_rolled_up("rolled_back")) == (0, 2)
    assert TurnRecord.objects.get(pk=folded.pk).status == "rolled_back"


def test_a_worker_beat_once_a_minute_folds_the_ended_records():
    record("w1")
    heartbeat.beat("worker:h:1:x", timezone.now(), 0, purge=False)
    assert turns_rolled_up() == 0  # an ordinary beat does not fold
    heartbeat.beat("worker:h:1:x", timezone.now(), 0, purge=True)
    assert turns_rolled_up() == 1


@postgresql_only
def test_a_record_committed_after_a_fold_with_a_lower_id_is_counted_exactly_once():
    inserted, commit = threading.Event(), threading.Event()

    def operator_transaction() -> int:  # a record written inside a longer transaction
        with transaction.atomic():
            pk = record("slow", started_at=timezone.now() - timedelta(minutes=30)).pk
            inserted.set()
            assert commit.wait(30)
        return pk

    slow = InThread(operator_transaction)
    assert inserted.wait(30)
    later = record("quick")
    assert rollups.fold() == 1 and turns_read() == 1  # the uncommitted one is not visible yet
    commit.set()
    lower = slow.join()
    assert lower < later.pk
    assert turns_read() == 2  # counted live at once
    assert rollups.fold() == 1 and rollups.fold() == 0
    assert (turns_rolled_up(), turns_read()) == (2, 2)


@postgresql_only
def test_two_folders_at_once_never_count_a_record_twice():
    for n in range(30):
        record(f"r{n}")
    folded, release = threading.Event(), threading.Event()

    def first_folder() -> int:
        with transaction.atomic():  # its fold done but not committed: it holds the lock and the records
            counted = rollups.fold()
            folded.set()
            assert release.wait(30)
        return counted

    first = InThread(first_folder)
    assert folded.wait(30)
    second = InThread(rollups.fold)
    while not waiting_on_a_lock():  # the second folder has reached the lock
        threading.Event().wait(0.01)
    release.set()
    assert (first.join(), second.join()) == (30, 0)
    assert turns_rolled_up() == 30 and turns_read() == 30


@postgresql_only
def test_a_fold_skips_a_record_another_transaction_holds_and_takes_it_later():
    held, release = threading.Event(), threading.Event()
    busy = record("busy")
    record("free")

    def holder() -> None:
        with transaction.atomic():
            TurnRecord.objects.filter(pk=busy.pk).update(error="being edited")
            held.set()
            assert release.wait(30)

    thread = InThread(holder)
    assert held.wait(30)
    assert rollups.fold() == 1  # did not wait behind the holder
    release.set()
    thread.join()
    assert rollups.fold() == 1 and turns_rolled_up() == 2


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite keeps its statistics until told")
def test_after_a_large_fold_the_read_of_the_unfolded_records_uses_their_index_again():
    TurnRecord.objects.bulk_create(TurnRecord(session_id=f"st{n}", owner="h:1:st:", status="completed")
                                   for n in range(2000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # statistics taken while every record was unfolded
    try:
        assert rollups.fold() == 2000
        plan = TurnRecord.objects.filter(folded=False).exclude(status="running").order_by().values("status").explain()
        assert "USING INDEX idx_turn_records_unfolded" in plan
    finally:  # the connection's planner keeps statistics past the test's rollback: the next test gets none
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM sqlite_stat1")
            cursor.execute("ANALYZE sqlite_schema")
