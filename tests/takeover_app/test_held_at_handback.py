"""Nothing held is forgotten (issue 39, item 3): the hand-back dialog offers the customer messages held since the
last reply; "let the bot answer" plays one turn with them through the site's Runner and sends one reply on the
customer's channel; "answered" plays nothing; a hand-back that says neither flags the session in the list."""

from __future__ import annotations

import re

import pytest

from sessions_app.models import OperatorAction
from takeover_app import service
from takeover_app.models import OperatorReply, SessionMode
from tests.sessions_app import personas
from tests.takeover_app import agents
from tests.takeover_app.conftest import drain, texts, wa_message

pytestmark = pytest.mark.django_db(transaction=True)

SID = "15550100"
HANDBACK = f"/actions/handback/{SID}/"
DIALOG = f"/actions/handback-confirm/{SID}/"


def calls() -> list[str]:
    """The USER text of each model call, in order (the recording agent's engine, in this process)."""
    return [next(c for r, c in reversed(call) if r == "user") for call in agents.CALLS]


@pytest.fixture
def held(client, env, settings):
    """A WhatsApp session an operator took over and answered once; then two customer lines, held."""
    settings.CHATFLOW_AGENTS = "tests.takeover_app.agents.build"
    agents.CALLS.clear()
    wa_message(client, "wamid.1", "hello")
    drain()
    olga = personas.operator()
    service.take_over(olga, SID)
    wa_message(client, "wamid.2", "where is my parcel?")
    drain()
    service.send_reply(olga, SID, "Olga here: it left today.")
    wa_message(client, "wamid.3", "thanks, also my invoice?")
    wa_message(client, "wamid.4", "and the delivery date?")
    drain()
    assert calls() == ["hello"]
    return olga


def sent(env) -> list[str]:
    return [b["text"]["body"] for b in env.wa.bodies()]


def test_the_hand_back_dialog_offers_the_messages_held_since_the_last_operator_reply(held):
    c = personas.client_for(held)
    for kwargs in ({"HTTP_HX_REQUEST": "true"}, {}):
        body = c.get(DIALOG, **kwargs).content.decode()
        listed = re.search(r'<section class="held-messages".*?</section>', body, re.S).group(0)
        assert "thanks, also my invoice?" in listed and "and the delivery date?" in listed
        assert "where is my parcel?" not in listed  # the operator's reply answered it
        assert 'name="held" value="bot_answers"' in body and 'name="held" value="answered"' in body
    assert service.held_messages(SID)[0][1] == "thanks, also my invoice?"


def test_let_the_bot_answer_plays_one_turn_with_them_and_replies_once(held, env):
    before = sent(env)
    r = personas.client_for(held).post(HANDBACK, {"held": "bot_answers"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200, r.content
    joined = "thanks, also my invoice?\nand the delivery date?"
    assert calls() == ["hello", joined]  # one model call, the held lines together
    assert sent(env) == [*before, f"answer to {joined}"]  # one reply, on WhatsApp
    assert texts(SID)[-2:] == [("user", joined), ("model", f"answer to {joined}")]
    [reply] = OperatorReply.objects.filter(author_username="")
    assert (reply.status, reply.provider, reply.text) == ("sent", "whatsapp", f"answer to {joined}")
    entry = OperatorAction.objects.filter(action="hand_back").get()
    assert entry.after["held"]["choice"] == "bot_answers" and len(entry.after["held"]["messages"]) == 2
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.held_unanswered) == ("bot", 0)
    drain()  # nothing queued plays it again
    assert sent(env) == [*before, f"answer to {joined}"] and len(calls()) == 2


def test_answered_hand_back_plays_nothing(held, env):
    before = sent(env)
    r = personas.client_for(held).post(HANDBACK, {"held": "answered"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert calls() == ["hello"] and sent(env) == before
    assert OperatorAction.objects.get(action="hand_back").after["held"]["choice"] == "answered"
    assert SessionMode.objects.get(pk=SID).held_unanswered == 0
    assert "held unanswered" not in personas.client_for(held).get("/sessions/").content.decode()


def test_an_unknown_choice_is_refused(held):
    r = personas.client_for(held).post(HANDBACK, {"held": "later"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 400 and SessionMode.objects.get(pk=SID).mode == "human"


def test_a_hand_back_leaving_them_unanswered_is_flagged_in_the_list_until_the_next_takeover(held, env):
    c = personas.client_for(held)
    assert c.post(HANDBACK).status_code == 302  # a form without the choice (no JavaScript, an old page)
    assert calls() == ["hello"]
    assert OperatorAction.objects.get(action="hand_back").after["held"]["choice"] == "unanswered"
    assert SessionMode.objects.get(pk=SID).held_unanswered == 2
    assert "held unanswered" in c.get("/sessions/").content.decode()
    service.take_over(held, SID)
    assert "held unanswered" not in c.get("/sessions/").content.decode()
