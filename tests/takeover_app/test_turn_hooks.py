"""The work a site turn carries into its commit is read from the turn's own hooks: none for a plain turn, the
takeover gate's mode change for a held one, a delivery's settle for a webhook's."""

from __future__ import annotations

import asyncio

import pytest

from chatflow_agent.core.hooks import TurnHooks
from sessions_app import runtime
from sessions_app.models import ChatSession
from takeover_app import service
from takeover_app.gate import ModeChange
from takeover_app.models import SessionMode
from tests.sessions_app import personas
from tests.takeover_app.conftest import texts
from webhooks_app import settle
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db(transaction=True)


def play(session_id: str, text: str) -> TurnHooks:
    hooks = TurnHooks()
    asyncio.run(runtime.site_runner().run_async(session_id, text, hooks=hooks))
    return hooks


def test_a_turn_with_no_takeover_and_no_webhook_runs_no_settle_or_gate_code_in_its_commit(env):
    assert play("web:plain", "hello").on_commit == []  # the turn that creates the session
    assert play("web:plain", "again").on_commit == []  # and one on a stored session
    assert texts("web:plain") == [("user", "hello"), ("model", "echo: hello"), ("user", "again"),
                                  ("model", "echo: again")]
    assert not SessionMode.objects.filter(pk="web:plain").exists()


def test_a_session_in_bot_mode_with_nothing_to_change_carries_no_hook(env):
    play("web:bot", "hello")
    SessionMode.objects.create(session_id="web:bot", mode=SessionMode.Mode.BOT)
    assert play("web:bot", "again").on_commit == []


def test_a_held_turn_carries_the_gates_mode_change_and_its_commit_counts_it_unread(env):
    play("web:held", "hello")
    service.take_over(personas.operator(), "web:held")
    hooks = play("web:held", "are you there?")
    assert [(type(h.__self__), h.__self__.held) for h in hooks.on_commit] == [(ModeChange, True)]  # type: ignore[attr-defined]
    assert SessionMode.objects.get(pk="web:held").unread == 1
    assert texts("web:held")[-1] == ("user", "are you there?")


def test_a_customer_asking_for_a_person_carries_the_request_into_the_commit(env, settings):
    hooks = play("web:ask", "I want to talk to a human")
    (hook,) = hooks.on_commit
    assert isinstance(hook.__self__, ModeChange) and hook.__self__.request is not None  # type: ignore[attr-defined]
    assert SessionMode.objects.get(pk="web:ask").mode == SessionMode.Mode.WAITING
    assert ChatSession.objects.filter(pk="web:ask").exists()


def test_a_deliverys_turn_carries_its_settle_alone():
    delivery = InboundDelivery(session_id="web:1")
    play_ = settle.Playing(delivery, "worker:1", replies_out=False)
    assert play_.hooks().on_commit == [play_.settle]
