"""Hand back with a private note (the next model call gets it, the transcript never does); the triggers that
make a session wait for an operator (phrases, the request_human tool, failed turns) and the idle return."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from console_app import export
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from sessions_app.runtime import site_store
from takeover_app import service
from takeover_app.gate import asks_for_human
from takeover_app.models import SessionMode
from tests.sessions_app import personas
from tests.takeover_app import agents
from tests.takeover_app.conftest import drain, texts, wa_message, wait_until
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db(transaction=True)

SID = "15550100"
NOTE = "Private: the customer was promised a 10% voucher; confirm it."


@pytest.fixture
def recording(env, settings):
    settings.CHATFLOW_AGENTS = "tests.takeover_app.agents.build"
    agents.CALLS.clear()
    return agents.CALLS


def test_the_hand_back_note_reaches_the_next_model_call_only_and_never_the_transcript(client, env, recording):
    wa_message(client, "wamid.1", "hello")
    drain()
    olga = personas.operator()
    service.take_over(olga, SID)
    service.send_reply(olga, SID, "Olga here, sorted.")
    service.hand_back(olga, SID, agent_name="Billing", note=NOTE)
    assert ChatSession.objects.get(pk=SID).active_agent_name == "Billing"
    wa_message(client, "wamid.2", "thanks")
    wa_message(client, "wamid.3", "bye")
    drain()
    assert len(recording) == 3
    assert not any(NOTE in content for _role, content in recording[0])
    assert [content for role, content in recording[1] if NOTE in content and role == "system"]
    assert not any(NOTE in content for _role, content in recording[2])  # one turn only
    assert [c for r, c in texts(SID)][-2:] == ["bye", "answer to bye"]
    assert SessionMode.objects.get(pk=SID).pending_note == ""
    assert SessionMode.objects.get(pk=SID).last_note == NOTE  # kept for operators
    session = ChatSession.objects.get(pk=SID)
    assert NOTE not in json.dumps(export.transcript(session), ensure_ascii=False)
    assert NOTE not in b"".join(export.transcript_md(session)).decode()
    assert not ChatMessage.objects.filter(content__contains="voucher").exists()


def test_hand_back_defaults_to_the_agent_active_before_the_takeover(client, env, recording):
    wa_message(client, "wamid.1", "hello")
    drain()
    olga = personas.operator()
    service.take_over(olga, SID)
    row = service.hand_back(olga, SID)
    assert row.mode == "bot" and ChatSession.objects.get(pk=SID).active_agent_name == "Support"
    wa_message(client, "wamid.2", "again")
    drain()
    assert texts(SID)[-1] == ("model", "answer to again")
    assert len(recording) == 2


@pytest.mark.parametrize("text, found", [
    ("I want to talk to a HUMAN please", "human"), ("quero um atendente", "atendente"), ("humano!", "humano"),
    ("is there an agent?", "agent"), ("the agents list", ""), ("humanity", ""), ("reagent", ""),
])
def test_a_sites_phrases_match_whole_words_in_any_case(text, found, settings):
    settings.CHATFLOW_HUMAN_PHRASES = ["human", "agent", "atendente", "humano"]
    assert asks_for_human(text) == found


def test_a_customer_asking_for_a_human_gets_one_holding_message_and_the_session_waits(client, env, recording,
                                                                                        settings):
    settings.CHATFLOW_HOLDING_MESSAGE = "One moment, a colleague will answer."
    wa_message(client, "wamid.1", "I want a human")
    wa_message(client, "wamid.2", "hello?")
    drain()
    assert recording == []  # no model call
    assert [b["text"]["body"] for b in env.wa.bodies()] == ["One moment, a colleague will answer."]
    assert texts(SID) == [("user", "I want a human"), ("model", "One moment, a colleague will answer."),
                          ("user", "hello?")]
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.trigger, row.unread) == ("waiting", "phrase", 1)
    assert row.waiting_since is not None
    entry = OperatorAction.objects.get(action="human_requested")
    assert entry.actor is None and entry.after["mode"] == "waiting"
    assert list(InboundDelivery.objects.order_by("id").values_list("reply_status", flat=True)) == ["sent", "held"]


def test_the_demo_agent_calls_request_human_and_the_holding_message_goes_out(client, env, settings):
    settings.CHATFLOW_AGENTS = "agents_app.demo_team.build"
    settings.CHATFLOW_ENGINE = "demo"
    settings.CHATFLOW_HUMAN_PHRASES = ["human"]  # so the words below reach the agent, not the phrase trigger
    wa_message(client, "wamid.1", "Can I talk to a person?")
    drain()
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.trigger) == ("waiting", "tool")
    assert [b["text"]["body"] for b in env.wa.bodies()] == [settings.CHATFLOW_HOLDING_MESSAGE]
    roles = [r for r, _c in texts(SID)]
    assert roles == ["user", "model", "tool", "model"]  # the tool call, its result, the holding answer
    wa_message(client, "wamid.2", "where is order 404?")
    drain()
    assert len(env.wa.bodies()) == 1  # waiting: held, not answered by the bot


def test_consecutive_failed_turns_make_the_session_wait(client, env, recording, settings):
    settings.CHATFLOW_HUMAN_AFTER_FAILED_TURNS = 2
    wa_message(client, "wamid.1", "hello")
    wa_message(client, "wamid.2", "x [fail]")
    drain()
    assert SessionMode.objects.get(pk=SID).mode == "bot"
    wa_message(client, "wamid.3", "y [fail]")
    drain()
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.trigger) == ("waiting", "failures")
    bodies = [b["text"]["body"] for b in env.wa.bodies()]
    assert bodies[-1] == settings.CHATFLOW_HOLDING_MESSAGE and bodies.count(settings.CHATFLOW_HOLDING_MESSAGE) == 1


def test_a_successful_turn_resets_the_failure_count(client, env, recording, settings):
    settings.CHATFLOW_HUMAN_AFTER_FAILED_TURNS = 2
    for i, text in enumerate(["a [fail]", "fine", "b [fail]"]):
        wa_message(client, f"wamid.{i}", text)
        drain()
    assert SessionMode.objects.get(pk=SID).mode == "bot"


def test_idle_sessions_return_to_the_bot_only_when_the_setting_is_on(client, env, recording, settings):
    wa_message(client, "wamid.1", "hello")
    drain()
    service.take_over(personas.operator(), SID)
    later = timezone.now() + timedelta(minutes=31)
    assert service.idle_sweep(later) == 0  # off by default
    settings.CHATFLOW_TAKEOVER_IDLE_MINUTES = 30
    assert service.idle_sweep(timezone.now()) == 0  # not idle yet
    assert service.idle_sweep(later) == 1
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.trigger, row.owner_username) == ("bot", "idle", "")
    assert OperatorAction.objects.get(action="takeover_idle").actor is None


def test_a_delivery_whose_turn_is_stopped_by_a_takeover_is_held_not_answered_with_the_fallback(client, env):
    wa_message(client, "wamid.1", "hello")
    drain()
    env.block.touch()
    wa_message(client, "wamid.2", "slow one [block]")
    worker = threading.Thread(target=drain)
    worker.start()
    wait_until(lambda: InboundDelivery.objects.filter(provider_message_id="wamid.2", status="running").exists()
               and ChatSession.objects.filter(pk=SID).exists() and _leased(), "the delivery's turn")
    service.take_over(personas.operator(), SID, when="now")
    worker.join(60)
    env.block.unlink()
    d = InboundDelivery.objects.get(provider_message_id="wamid.2")
    assert (d.status, d.reply_status) == ("done", "held")
    assert texts(SID) == [("user", "hello"), ("model", "echo: hello"), ("user", "slow one [block]")]
    assert [b["text"]["body"] for b in env.wa.bodies()] == ["echo: hello"]  # no fallback


def test_a_delivery_whose_turn_is_cancelled_learns_who_cancelled_it_from_the_store_not_the_audit_log(client, env):
    """The worker learns that its turn was cancelled for good, by whom and why, from the lease the cancel took
    away (the store's ``cancel_of``): with no audit entry at all, the delivery ends failed with the cancel's
    text, is not played again and nothing is sent."""
    wa_message(client, "wamid.1", "hello")
    drain()
    env.block.touch()
    wa_message(client, "wamid.2", "slow one [block]")
    worker = threading.Thread(target=drain)
    worker.start()
    wait_until(lambda: len(env.engine_calls()) == 2 and _leased(), "the delivery's turn to reach the engine")
    assert site_store().cancel_turn(SID, "Cancelled by olga.operator: stuck") is not None
    worker.join(60)
    env.block.unlink()
    assert not OperatorAction.objects.exists()
    d = InboundDelivery.objects.get(provider_message_id="wamid.2")
    assert (d.status, d.error, d.reply_status) == ("failed", "Cancelled by olga.operator: stuck", "none")
    assert texts(SID) == [("user", "hello"), ("model", "echo: hello")]
    assert len(env.engine_calls()) == 2  # not played again
    assert [b["text"]["body"] for b in env.wa.bodies()] == ["echo: hello"]


@pytest.mark.slow
def test_a_takeover_now_stops_a_worker_process_turn_at_once_and_a_quick_hand_back_waits_for_it(client, env):
    """A worker process plays the session's turn (its lease is long: its next renewal is minutes away); an
    operator takes over "now" in this process and hands back at once. The worker finds its lease gone within
    about a second and plays the message again while the operator has the session: held, not answered. The
    hand-back waits for that, so the bot never answers the stopped message after the operator's reply."""
    from tests.processes import stop
    from tests.webhooks_app import servers as s

    wa_message(client, "wamid.1", "hello")
    env.block.touch()
    wa_message(client, "wamid.2", "slow one [block]")
    worker = s.start_worker(s.child_env(env.wa.base, env.tg.base, env.tmp, CHATFLOW_LEASE_SECONDS="600",
                                        CHATFLOW_WORKER_NICE="0", CHATFLOW_WORKER_CPU="off"),
                            env.tmp / "worker.log", "--slots", "1")
    try:
        wait_until(lambda: len(env.engine_calls()) == 2 and _leased(), "the second turn to start in the worker")
        operator = personas.operator()
        service.take_over(operator, SID, when="now")
        service.hand_back(operator, SID)
        assert SessionMode.objects.get(pk=SID).mode == "bot"
        d = InboundDelivery.objects.get(provider_message_id="wamid.2")
        assert (d.status, d.reply_status) == ("done", "held")  # before the hand-back
    finally:
        env.block.unlink()
        stop(worker)
        worker.stdout.close()
    assert texts(SID) == [("user", "hello"), ("model", "echo: hello"), ("user", "slow one [block]")]
    assert [b["text"]["body"] for b in env.wa.bodies()] == ["echo: hello"]


def test_a_delivery_whose_worker_died_does_not_hold_up_a_hand_back(client, env):
    """A delivery of the session is left running by a worker that died (its lease ran out): nothing is being
    played, so the hand-back goes through at once (another worker plays that message again later)."""
    from webhooks_app import taskqueue

    wa_message(client, "wamid.1", "hello")
    drain()
    wa_message(client, "wamid.2", "are you there?")
    dead = taskqueue.claim_next("worker:dead", 30)
    operator = personas.operator()
    service.take_over(operator, SID)
    InboundDelivery.objects.filter(pk=dead.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert service.hand_back(operator, SID).mode == "bot"


def _leased() -> bool:
    from sessions_app.models import SessionLease

    return SessionLease.objects.filter(session_id=SID).exists()


def test_the_sweep_command_says_when_it_is_off_and_counts_when_on(client, env, recording, settings):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("chatflow_takeover_sweep", stdout=out)
    assert "is 0" in out.getvalue()
    wa_message(client, "wamid.1", "hello")
    drain()
    service.take_over(personas.operator(), SID)
    SessionMode.objects.filter(pk=SID).update(updated_at=timezone.now() - timedelta(hours=2))
    ChatMessage.objects.filter(session_id=SID).update(created_at=timezone.now() - timedelta(hours=2))
    settings.CHATFLOW_TAKEOVER_IDLE_MINUTES = 60
    out = StringIO()
    call_command("chatflow_takeover_sweep", stdout=out)
    assert "Returned 1 idle session" in out.getvalue()
    assert SessionMode.objects.get(pk=SID).mode == "bot"


def test_a_failed_turn_does_not_use_up_the_hand_back_note(client, env, recording, settings):
    # The failed turn counts towards CHATFLOW_HUMAN_AFTER_FAILED_TURNS: that count's own commit (an operator-
    # side write on the session) must not apply what the rolled-back turn had decided.
    settings.CHATFLOW_HUMAN_AFTER_FAILED_TURNS = 3
    wa_message(client, "wamid.1", "hello")
    drain()
    olga = personas.operator()
    service.take_over(olga, SID)
    service.hand_back(olga, SID, note=NOTE)
    wa_message(client, "wamid.2", "[fail] please")  # this turn is given the note, then fails (rolled back)
    drain()

    row = SessionMode.objects.get(pk=SID)
    assert row.pending_note == NOTE and row.failed_turns == 1  # the note waits for a turn that commits
    wa_message(client, "wamid.3", "and now?")
    drain()
    assert SessionMode.objects.get(pk=SID).pending_note == ""
    assert NOTE in str(recording[-1])
