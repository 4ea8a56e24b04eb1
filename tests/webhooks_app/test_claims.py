"""The queue's one-statement claim under concurrent claimers, and complete's two outcomes."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from django.db import OperationalError, connections, transaction
from django.utils import timezone

from sessions_app.models import ProcessedMessage
from webhooks_app import inbox, taskqueue
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db(transaction=True)

Status, Reply = InboundDelivery.Status, InboundDelivery.Reply


def queue(session_id: str, n: int, start: int = 0) -> list[InboundDelivery]:
    messages = [inbox.Inbound(provider="generic", provider_message_id=f"{session_id}.{i}", session_id=session_id,
                              text=f"message {i}") for i in range(start, start + n)]
    return inbox.accept(messages).queued


def test_four_concurrent_claimers_keep_each_sessions_deliveries_in_order_and_one_at_a_time():
    sessions = [f"s{k}" for k in range(3)]
    for round_ in range(6):  # interleaved arrival: s0.0, s1.0, s2.0, s0.1, …
        for sid in sessions:
            queue(sid, 1, start=round_)
    events: list[tuple[str, str, int]] = []  # (what, session, delivery id) in the order they happened
    mutex = threading.Lock()
    errors: list[BaseException] = []

    def claimer(owner: str) -> None:
        try:
            idle = 0
            while idle < 20:
                d = taskqueue.claim_next(owner, 30)
                if d is None:
                    idle += 1
                    time.sleep(0.01)
                    continue
                idle = 0
                with mutex:
                    events.append(("claimed", d.session_id, d.pk))
                time.sleep(0.005)  # the turn: gives the other claimers a chance to take the same session
                with mutex:  # recorded before the write: the next claim of the session can only come after it
                    events.append(("finished", d.session_id, d.pk))
                assert taskqueue.finish(d, owner, "ok", Reply.NONE)
        except BaseException as err:  # noqa: BLE001 - reported by the test thread
            errors.append(err)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(f"worker:{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert InboundDelivery.objects.filter(status=Status.DONE).count() == 18
    for sid in sessions:
        mine = [(what, pk) for what, s, pk in events if s == sid]
        ids = sorted(InboundDelivery.objects.filter(session_id=sid).values_list("pk", flat=True))
        # claimed, finished, claimed, finished … in id order: never two of a session open at once
        assert mine == [(what, pk) for pk in ids for what in ("claimed", "finished")]
    claims = [pk for what, _, pk in events if what == "claimed"]
    assert len(claims) == len(set(claims)) == 18  # no delivery claimed twice


def test_a_claim_returns_the_leased_row_with_its_sessions_marker():
    (d,) = queue("m1", 1)
    claimed = taskqueue.claim_next("worker:a", 30)
    assert claimed.pk == d.pk and (claimed.status, claimed.attempts, claimed.lease_owner) == ("running", 1, "worker:a")
    assert claimed.lease_expires_at is not None and claimed.text == "message 0"
    assert not taskqueue.played_before(claimed)  # the session does not exist yet
    assert taskqueue.claim_next("worker:b", 30) is None  # leased: invisible to other claimers
    assert taskqueue.claim(d.pk, "worker:b", 30) is None


def test_complete_marks_done_or_failed_with_the_claim_released():
    ok, bad = queue("c1", 1) + queue("c2", 1)
    a = taskqueue.claim_next("worker:a", 30)
    b = taskqueue.claim_next("worker:a", 30)
    assert {a.pk, b.pk} == {ok.pk, bad.pk}
    a, b = (a, b) if a.pk == ok.pk else (b, a)
    assert taskqueue.finish(a, "worker:a", "answer", Reply.SENDING)
    assert taskqueue.fail(b, "worker:a", "RuntimeError: down", "sorry", Reply.SENDING)
    taskqueue.complete(a, "worker:other", Reply.SENT)  # not the lease owner: changes nothing
    assert InboundDelivery.objects.get(pk=a.pk).status == Status.RUNNING
    taskqueue.complete(a, "worker:a", Reply.SENT)
    taskqueue.complete(b, "worker:a", Reply.SENT)
    a, b = InboundDelivery.objects.get(pk=a.pk), InboundDelivery.objects.get(pk=b.pk)
    assert (a.status, a.reply_status, a.answer, a.finished_at is not None) == ("done", "sent", "answer", True)
    assert (b.status, b.reply_status, b.error) == ("failed", "sent", "RuntimeError: down")
    assert ProcessedMessage.objects.filter(pk=a.claim_key).exists()
    assert not ProcessedMessage.objects.filter(pk=b.claim_key).exists()  # a failure gives its id back


@contextlib.contextmanager
def locked_elsewhere(pk: int, then: Callable[[], object] = lambda: None) -> Iterator[None]:
    """Another connection (a thread) holds delivery ``pk``'s row lock for the ``with`` body, runs ``then`` in
    its transaction as the body ends, and commits."""
    locked, release = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                InboundDelivery.objects.select_for_update().get(pk=pk)
                locked.set()
                release.wait(30)  # a hang guard
                then()
        finally:
            connections.close_all()

    holding = threading.Thread(target=holder)
    holding.start()
    try:
        assert locked.wait(30)
        yield
    finally:
        release.set()
        holding.join()


def in_a_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """``call()`` on a thread of its own (its own connection), started; the list gets its result."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(call())
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


@pytest.mark.skipif(connections["default"].vendor != "postgresql", reason="the PostgreSQL claim's row lock")
def test_a_delivery_being_finished_while_a_claim_runs_is_not_leased_again():
    """Connection 1 is a worker finishing a delivery whose lease expired (it holds the row's lock); connection
    2's claim runs meanwhile; connection 1 marks the delivery done and commits: the claim did not take it,
    and did not wait for the worker either."""
    (d,) = queue("r1", 1)
    assert taskqueue.claim_next("worker:old", 30).pk == d.pk
    InboundDelivery.objects.filter(pk=d.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    def finish() -> None:
        InboundDelivery.objects.filter(pk=d.pk).update(status=Status.DONE, finished_at=timezone.now())

    with locked_elsewhere(d.pk, then=finish):
        claiming, claimed = in_a_thread(lambda: taskqueue.claim_next("worker:new", 30))
        claiming.join(30)  # returns while connection 1 still holds the row: locked rows are skipped
        assert not claiming.is_alive() and claimed == [None]
    d.refresh_from_db()
    assert (d.status, d.lease_owner) == (Status.DONE, "worker:old")
    assert taskqueue.claim_next("worker:new", 30) is None  # finished: not claimable once the lock is gone


def _statuses(*deliveries: InboundDelivery) -> list[str]:
    return [InboundDelivery.objects.get(pk=d.pk).status for d in deliveries]


def test_complete_and_claim_next_completes_then_claims_another_sessions_delivery():
    first, second = queue("cc1", 2)
    (other,) = queue("cc2", 1)
    a = taskqueue.claim_next("worker:a", 30)
    assert a.pk == first.pk
    b = taskqueue.complete_and_claim_next(a, "worker:a", Reply.SENT, "", 30)
    assert b.pk in (second.pk, other.pk) and (b.status, b.lease_owner, b.attempts) == ("running", "worker:a", 1)
    c = taskqueue.complete_and_claim_next(b, "worker:a", Reply.SENT, "", 30)
    assert {b.pk, c.pk} == {second.pk, other.pk}  # each claimed once, the session's own in order
    assert taskqueue.complete_and_claim_next(c, "worker:a", Reply.SENT, "", 30) is None
    assert _statuses(first, second, other) == ["done", "done", "done"]
    assert InboundDelivery.objects.get(pk=first.pk).reply_status == Reply.SENT


def test_complete_and_claim_next_claims_the_same_sessions_next_delivery_when_it_is_the_only_one():
    first, second = queue("cs1", 2)
    a = taskqueue.claim_next("worker:a", 30)
    b = taskqueue.complete_and_claim_next(a, "worker:a", Reply.NONE, "", 30)
    assert (a.pk, b.pk) == (first.pk, second.pk)
    assert _statuses(first, second) == ["done", "running"]


def test_complete_and_claim_next_records_a_failure_and_releases_its_id():
    bad, ok = queue("cf1", 1) + queue("cf2", 1)
    a = taskqueue.claim_next("worker:a", 30)
    assert a.pk == bad.pk
    assert taskqueue.fail(a, "worker:a", "RuntimeError: down", "sorry", Reply.SENDING)
    b = taskqueue.complete_and_claim_next(a, "worker:a", Reply.SENT, "", 30)
    assert b.pk == ok.pk
    a = InboundDelivery.objects.get(pk=bad.pk)
    assert (a.status, a.reply_status, a.error) == ("failed", "sent", "RuntimeError: down")
    assert not ProcessedMessage.objects.filter(pk=a.claim_key).exists()


def test_complete_and_claim_next_by_a_worker_that_lost_the_lease_changes_nothing_but_still_claims():
    (lost,) = queue("cl1", 1)
    (other,) = queue("cl2", 1)
    a = taskqueue.claim_next("worker:a", 30)
    assert a.pk == lost.pk
    b = taskqueue.complete_and_claim_next(a, "worker:gone", Reply.SENT, "", 30)
    assert b.pk == other.pk and b.lease_owner == "worker:gone"
    assert _statuses(lost) == ["running"]


def test_complete_and_claim_next_never_claims_back_the_delivery_it_completes():
    """Its own lease expired (a slow reply): the completion still lands, and the delivery is not leased again."""
    (d,) = queue("ce1", 1)
    a = taskqueue.claim_next("worker:a", 30)
    InboundDelivery.objects.filter(pk=d.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert taskqueue.complete_and_claim_next(a, "worker:a", Reply.SENT, "", 30) is None
    d.refresh_from_db()
    assert (d.status, d.attempts, d.reply_status) == ("done", 1, "sent")


# The one-statement completion of this database, waiting for a row lock.
WAITING_COMPLETION = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                      "AND wait_event_type = 'Lock' AND query LIKE 'WITH done AS%%'")


@pytest.mark.skipif(connections["default"].vendor != "postgresql", reason="the PostgreSQL one-statement completion")
def test_complete_and_claim_next_locks_nothing_new_while_its_completion_waits():
    """The delivery being completed is locked by another transaction (a worker that claimed it after its
    lease expired, in the middle of its claim): the completion waits for it, and while it waits the
    statement holds no lock on the delivery it is about to claim. Locking that one first could deadlock
    with a second worker completing it and claiming this one."""
    (mine,) = queue("cd1", 1)
    (other,) = queue("cd2", 1)
    a = taskqueue.claim_next("worker:a", 30)
    assert a.pk == mine.pk
    with locked_elsewhere(mine.pk):
        worker, claimed = in_a_thread(lambda: taskqueue.complete_and_claim_next(a, "worker:a", Reply.SENT, "", 30))
        deadline = time.monotonic() + 30
        with connections["default"].cursor() as cursor:  # until the completion waits for the holder's lock
            while not cursor.execute(WAITING_COMPLETION).fetchone()[0]:
                assert time.monotonic() < deadline, "the completion never waited for the row's lock"
                time.sleep(0.01)
        with transaction.atomic():  # the delivery it will claim is not locked meanwhile
            free = InboundDelivery.objects.select_for_update(nowait=True).filter(pk=other.pk)
            assert [d.pk for d in free] == [other.pk]
    worker.join(30)
    assert not worker.is_alive() and [c.pk for c in claimed] == [other.pk]
    assert _statuses(mine, other) == ["done", "running"]


@pytest.mark.skipif(connections["default"].vendor != "postgresql",
                    reason="the one-statement completion claims before a failure is recorded on PostgreSQL only")
def test_complete_and_claim_next_gives_back_what_it_claimed_when_recording_a_failure_fails(monkeypatch):
    """Recording the completed delivery's failure raises (the database went away between the two writes):
    the error propagates, and the delivery the same call had claimed is back in the queue, not left leased
    to a worker that never plays it until its lease runs out."""
    bad, waiting = queue("cg1", 1) + queue("cg2", 1)
    a = taskqueue.claim_next("worker:a", 30)
    assert a.pk == bad.pk
    assert taskqueue.fail(a, "worker:a", "RuntimeError: down", "sorry", Reply.SENDING)

    def gone(key: str) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(taskqueue, "release_claim", gone)
    with pytest.raises(OperationalError):
        taskqueue.complete_and_claim_next(a, "worker:a", Reply.SENT, "", 30)
    w = InboundDelivery.objects.get(pk=waiting.pk)
    assert (w.status, w.lease_owner, w.attempts) == ("queued", "", 0)
    assert _statuses(bad) == ["running"]  # its failure was not recorded: played again after its lease
    monkeypatch.undo()
    assert taskqueue.complete_and_claim_next(a, "worker:a", Reply.SENT, "", 30).pk == waiting.pk
    assert _statuses(bad, waiting) == ["failed", "running"]
