"""Take over (after the running turn, or now), hand back, races, permissions, CSRF, fragments, audit."""

from __future__ import annotations

import threading
import time

import pytest

from chatflow_agent.core.reports import TurnReport
from chatflow_agent.exceptions import SessionBusyError
from chatflow_agent.types import ModelCallUsage
from sessions_app.actions import site_store
from sessions_app.models import ChatSession, OperatorAction, SessionLease
from takeover_app import service
from takeover_app.models import SessionMode
from tests.sessions_app import personas
from tests.takeover_app.conftest import BackgroundTurn, drain, texts, wa_message, wait_until
from turns_app import records
from turns_app.models import SessionTotals, TurnRecord

pytestmark = pytest.mark.django_db(transaction=True)

SID = "15550100"


@pytest.fixture
def session(client, env):
    wa_message(client, "wamid.first", "hello")
    drain()
    assert texts(SID) == [("user", "hello"), ("model", "echo: hello")]
    return SID


def url(verb: str, session_id: str = SID) -> str:
    return f"/actions/{verb}/{session_id}/"


def test_an_operator_takes_over_and_hands_back_audited(session):
    olga = personas.operator()
    c = personas.client_for(olga)
    r = c.post(url("takeover"), {"when": "after_turn"})
    assert r.status_code == 302 and r["Location"] == f"/sessions/{SID}/"
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.owner_username, row.previous_agent, row.trigger) == ("human", "olga.operator", "Echo",
                                                                                "operator")
    r = c.post(url("handback"), {"note": "Offer the 10% voucher."}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and b'id="takeover-panel"' in r.content and b"<html" not in r.content
    row.refresh_from_db()
    assert (row.mode, row.owner_username, row.pending_note, row.last_note) == (
        "bot", "", "Offer the 10% voucher.", "Offer the 10% voucher.")
    kinds = list(OperatorAction.objects.filter(session_id=SID).order_by("id").values_list("action", "actor_username"))
    assert kinds == [("take_over", "olga.operator"), ("hand_back", "olga.operator")]
    assert OperatorAction.objects.get(action="hand_back").after["note"] == "Offer the 10% voucher."


def test_the_htmx_takeover_returns_the_panel_fragment(session):
    c = personas.client_for(personas.operator())
    r = c.post(url("takeover"), {"when": "now"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert b'data-mode="human"' in r.content and b"<html" not in r.content
    assert r["HX-Retarget"] == "#takeover-panel"


def test_a_second_operator_gets_409_naming_the_owner(session):
    olga, otto = personas.operator(), personas.operator("otto.operator")
    assert personas.client_for(olga).post(url("takeover")).status_code == 302
    r = personas.client_for(otto).post(url("takeover"), HTTP_HX_REQUEST="true")
    assert r.status_code == 409 and b"olga.operator took this session over" in r.content
    r = personas.client_for(otto).post(url("takeover"))  # a plain POST: the page, same status
    assert r.status_code == 409 and b"olga.operator took this session over" in r.content
    assert personas.client_for(otto).post(url("handback")).status_code == 409
    assert personas.client_for(otto).post(url("reply"), {"text": "hi"}).status_code == 409
    assert SessionMode.objects.get(pk=SID).owner_username == "olga.operator"
    assert OperatorAction.objects.filter(action="take_over").count() == 1


@pytest.mark.parametrize("when", ["after_turn", "now"])
def test_two_operators_racing_one_wins_the_other_is_refused(session, when):
    olga, otto = personas.operator(), personas.operator("otto.operator")
    results: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def race(user):
        from django.db import connections

        barrier.wait()
        try:
            results[user.username] = service.take_over(user, SID, when=when).owner_username
        except service.TakenOver as err:
            results[user.username] = err
        finally:
            connections.close_all()

    threads = [threading.Thread(target=race, args=(u,)) for u in (olga, otto)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [name for name, result in results.items() if isinstance(result, str)]
    losers = [result for result in results.values() if isinstance(result, service.TakenOver)]
    assert len(winners) == 1 and len(losers) == 1
    assert losers[0].owner == winners[0] and losers[0].status == 409
    assert SessionMode.objects.get(pk=SID).owner_username == winners[0]
    assert OperatorAction.objects.filter(action="take_over").count() == 1


@pytest.mark.parametrize("verb", ["takeover", "handback", "reply", "cancel-turn"])
def test_viewers_are_refused_and_anonymous_users_sent_to_login(session, verb):
    assert personas.client_for(personas.viewer()).post(url(verb), {"text": "x"}).status_code == 403
    assert personas.client_for(personas.outsider()).post(url(verb), {"text": "x"}).status_code == 403
    r = personas.client_for(None).post(url(verb), {"text": "x"})
    assert r.status_code == 302 and "/accounts/login/" in r["Location"]
    assert personas.client_for(personas.operator()).get(url(verb)).status_code == 405
    assert not SessionMode.objects.filter(mode="human").exists()


def test_actions_need_csrf(session):
    c = personas.client_for(personas.operator(), csrf=True)
    assert c.post(url("takeover")).status_code == 403
    assert not SessionMode.objects.filter(pk=SID).exists()


def test_unknown_session_and_bad_input_are_clear_4xx(session):
    c = personas.client_for(personas.operator())
    assert c.post(url("takeover", "nope"), HTTP_HX_REQUEST="true").status_code == 404
    r = c.post(url("takeover"), {"when": "tomorrow"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 400 and b"after_turn" in r.content
    r = c.post(url("handback"), HTTP_HX_REQUEST="true")
    assert r.status_code == 400 and b"already answered by the bot" in r.content
    c.post(url("takeover"))
    r = c.post(url("handback"), {"agent": "Nobody"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 400 and b"Unknown agent" in r.content
    assert c.post(url("reply"), {"text": "   "}, HTTP_HX_REQUEST="true").status_code == 400
    assert c.post("/actions/reply-resend/999/", HTTP_HX_REQUEST="true").status_code == 404
    for missing in ("999", "99999999999999999999999"):  # a plain form post gets the site's 404 page
        r = c.post(f"/actions/reply-resend/{missing}/")
        assert r.status_code == 404 and b"No such reply." in r.content
    assert not ChatSession.objects.filter(pk="nope").exists()


def test_take_over_after_the_turn_waits_for_the_running_turn(session, env):
    env.block.touch()
    turn = BackgroundTurn(SID, "second [block]").start_and_wait_for_lease()
    olga = personas.operator()
    taking = threading.Thread(target=lambda: service.take_over(olga, SID, when="after_turn"))
    taking.start()
    assert not SessionMode.objects.filter(pk=SID, mode="human").exists()  # queued behind the turn
    env.block.unlink()
    turn.join(60)
    taking.join(60)
    assert turn.error is None and turn.result.content == "echo: second [block]"
    assert texts(SID)[-2:] == [("user", "second [block]"), ("model", "echo: second [block]")]
    assert SessionMode.objects.get(pk=SID).mode == "human"


def test_take_over_now_stops_the_running_turn_and_rolls_it_back(session, env):
    env.block.touch()
    turn = BackgroundTurn(SID, "second [block]").start_and_wait_for_lease()
    row = service.take_over(personas.operator(), SID, when="now")  # returns while the engine is still blocked
    assert env.block.exists() and row.mode == "human"
    turn.join(60)
    assert isinstance(turn.error, SessionBusyError)
    assert texts(SID) == [("user", "hello"), ("model", "echo: hello")]  # nothing of the stopped turn
    cancel = OperatorAction.objects.get(action="cancel_turn")
    assert cancel.actor_username == "olga.operator" and cancel.before["lease_owner"]
    env.block.unlink()


def test_a_cancelled_turns_record_ends_cancelled_when_another_turn_takes_the_lease_before_it_rolls_back(session):
    backend = site_store().backend
    cancelled = TurnReport(source="api", user_text="stuck", owner="otherhost:1:cancelled:1")
    cancelled.started_at = time.time()
    assert backend.acquire_lease(SID, cancelled.owner, 30.0, False, cancelled)  # a turn of another process
    before = SessionTotals.objects.get(pk=SID)

    assert service.cancel_turn(personas.operator(), SID, "stuck") is True
    following = TurnReport(source="api", user_text="next", owner="otherhost:1:next:1")
    following.started_at = time.time()
    assert backend.acquire_lease(SID, following.owner, 30.0, False, following)  # before the cancelled one rolled back
    record = TurnRecord.objects.get(owner=cancelled.owner)
    assert (record.status, record.error) == ("cancelled", "Cancelled by olga.operator: stuck")
    assert TurnRecord.objects.get(owner=following.owner).status == "running"
    assert SessionTotals.objects.get(pk=SID).last_error == "Cancelled by olga.operator: stuck"

    cancelled.calls.append(ModelCallUsage(provider="p", model="m", input_tokens=7, output_tokens=3))
    cancelled.ended_by(SessionBusyError(SID))
    backend.release_lease(SID, cancelled.owner, cancelled)  # its late close: no lease, its record cancelled
    backend.release_lease(SID, cancelled.owner, cancelled)  # (twice: changes nothing more)

    record = TurnRecord.objects.get(owner=cancelled.owner)
    assert (record.status, record.input_tokens, record.output_tokens) == ("cancelled", 7, 3)
    assert record.error == "Cancelled by olga.operator: stuck"  # who and why, not the turn's SessionBusyError
    assert TurnRecord.objects.get(owner=following.owner).status == "running"
    totals = SessionTotals.objects.get(pk=SID)
    # Counted once (the totals sum the known counts: the fixture's scripted turns reported none).
    assert (totals.turns, totals.input_tokens) == (before.turns + 1, (before.input_tokens or 0) + 7)
    assert totals.last_error == "Cancelled by olga.operator: stuck"
    backend.release_lease(SID, following.owner)


def test_a_fold_between_the_cancel_and_the_turns_late_close_waits_for_its_figures(session):
    from datetime import timedelta

    from django.utils import timezone

    from turns_app import rollups

    backend = site_store().backend
    rollups.fold()
    cancelled = TurnReport(source="api", user_text="stuck", owner="otherhost:1:cancelled:1")
    cancelled.started_at = time.time()
    assert backend.acquire_lease(SID, cancelled.owner, 30.0, False, cancelled)
    assert service.cancel_turn(personas.operator(), SID, "stuck") is True

    assert rollups.fold() == 0  # the heartbeat's fold lands here: the record waits for its turn's figures
    live = rollups.read(timezone.now() - timedelta(hours=2)).cells
    assert sum(c.turns for (_, status), c in live.items() if status == "cancelled") == 1  # counted live meanwhile
    cancelled.calls.append(ModelCallUsage(provider="p", model="m", input_tokens=7, output_tokens=3))
    cancelled.ended_by(SessionBusyError(SID))
    backend.release_lease(SID, cancelled.owner, cancelled)  # its late close
    assert rollups.fold() == 1

    cells = rollups.read(timezone.now() - timedelta(hours=2)).cells
    [cell] = [c for (_, status), c in cells.items() if status == "cancelled"]
    assert (cell.turns, cell.input_tokens) == (1, 7)  # as the record and the session's totals say


def test_a_cancelled_turn_whose_process_died_counts_once_its_close_can_no_longer_come(session):
    backend = site_store().backend
    cancelled = TurnReport(source="api", user_text="stuck", owner="otherhost:1:dead:1")
    cancelled.started_at = time.time()
    assert backend.acquire_lease(SID, cancelled.owner, 30.0, False, cancelled)
    before = SessionTotals.objects.get(pk=SID)
    assert service.cancel_turn(personas.operator(), SID, "stuck") is True
    assert backend.mark_interrupted(time.time(), cancelled_before=time.time() - 30) == 0  # its close may still come
    assert SessionTotals.objects.get(pk=SID).turns == before.turns

    backend.mark_interrupted(time.time(), cancelled_before=time.time() + 1)  # a lease TTL later: it cannot

    record = TurnRecord.objects.get(owner=cancelled.owner)
    assert record.status == "cancelled"
    assert record.error == f"Cancelled by olga.operator: stuck {records.CANCELLED_UNREPORTED_ERROR}"
    totals = SessionTotals.objects.get(pk=SID)
    assert (totals.turns, totals.cost_known) == (before.turns + 1, False)  # a turn of unknown spend
    assert totals.last_error == record.error
    cancelled.ended_by(SessionBusyError(SID))
    backend.release_lease(SID, cancelled.owner, cancelled)  # a close after all: changes nothing
    assert SessionTotals.objects.get(pk=SID).turns == before.turns + 1


def test_cancel_turn_releases_a_stale_lease_and_says_when_nothing_ran(session):
    c = personas.client_for(personas.operator())
    r = c.post(url("cancel-turn"), HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and b"No turn was running" in r.content
    SessionLease.objects.create(session_id=SID, owner="deadhost:1:abc:1", expires_at=0.0)
    assert service.cancel_turn(None, SID, "stale") is True
    assert not SessionLease.objects.filter(session_id=SID).exists()
    wait_until(lambda: OperatorAction.objects.filter(action="cancel_turn").exists(), "the audit entry")
