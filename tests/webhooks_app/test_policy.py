"""The worker's turn policy: what a delivery's turn asks about held sessions and failed turns is the policy the
worker was given (takeover's, installed by its app; none: nothing is ever held), not an import of takeover_app."""

from __future__ import annotations

import asyncio

import pytest

from chatflow_agent.core.gate import TurnDecision, TurnGate
from takeover_app import gate
from takeover_app.models import SessionMode
from tests.webhooks_app import payloads as p
from tests.webhooks_app.fakes import FakeProviderAPI
from tests.webhooks_app.test_endpoints import post_wa
from webhooks_app import policy
from webhooks_app.models import InboundDelivery
from webhooks_app.worker import FALLBACK_REPLY, UNSUPPORTED_REPLY, Worker, no_model_call

pytestmark = pytest.mark.django_db(transaction=True)

AUDIO = {"from": "15550100", "id": "wamid.V", "type": "audio", "audio": {"id": "media1"}}


@pytest.fixture
def wa(settings):
    settings.CHATFLOW_AGENTS = "tests.webhooks_app.agents.build"
    with FakeProviderAPI() as wa, FakeProviderAPI() as tg:
        settings.WHATSAPP_API_BASE = wa.base
        settings.TELEGRAM_API_BASE = tg.base
        yield wa


class Spy:
    """A turn policy that holds every session's fixed-answer messages and hands a session over at its first
    failure, recording what it was asked."""

    held_session_sql = "c.session_id = 'held-everywhere'"

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def answered_gate(self, answer: str) -> TurnGate:
        self.asked.append(("answered_gate", answer))
        return lambda session, text: TurnDecision(hold=True)

    def note_failed_turn(self, session_id: str) -> bool:
        self.asked.append(("note_failed_turn", session_id))
        return True


def drain(turn_policy: policy.TurnPolicy | None = None) -> int:
    return asyncio.run(Worker(slots=1, poll=0.05, policy=turn_policy).run(drain=True))


def test_the_site_installs_takeovers_policy_and_the_held_lane_asks_it():
    assert policy.installed() is gate.POLICY
    assert Worker(slots=1).policy is gate.POLICY
    assert no_model_call() == no_model_call(gate.POLICY)
    assert gate.HELD_SESSION_SQL in no_model_call()
    assert no_model_call(policy.HOLDS_NOTHING) == "c.kind IN ('unsupported', 'reset')"
    assert no_model_call(Spy()).endswith(" OR c.session_id = 'held-everywhere'")


def test_a_delivery_turn_asks_the_workers_policy(client, wa, settings):
    spy = Spy()
    post_wa(client, p.whatsapp(AUDIO))
    post_wa(client, p.whatsapp(p.wa_text("wamid.F", "help [fail]")))
    drain(spy)
    assert spy.asked == [("answered_gate", UNSUPPORTED_REPLY), ("note_failed_turn", "15550100")]
    audio, failed = InboundDelivery.objects.order_by("id")
    assert (audio.status, audio.reply_status) == ("done", "held")  # the spy's gate held it: nothing sent
    assert failed.status == "failed"
    # The spy said the failure handed the session over: the holding message, not the fallback.
    assert [b["text"]["body"] for b in wa.bodies()] == [settings.CHATFLOW_HOLDING_MESSAGE]


def test_the_default_policy_answers_the_fixed_answer_and_sends_the_fallback(client, wa, settings):
    settings.CHATFLOW_HUMAN_AFTER_FAILED_TURNS = 1  # takeover's policy would hand the session over now
    post_wa(client, p.whatsapp(AUDIO))
    post_wa(client, p.whatsapp(p.wa_text("wamid.F", "help [fail]")))
    drain(policy.HOLDS_NOTHING)
    assert [b["text"]["body"] for b in wa.bodies()] == [UNSUPPORTED_REPLY, FALLBACK_REPLY]
    assert not SessionMode.objects.exclude(mode="bot").exists()
