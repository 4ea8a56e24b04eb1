"""Nothing held is forgotten (issue 39, item 3): the hand-back dialog offers the customer messages held since the
last reply; "let the bot answer" plays one turn with them through the site's Runner and sends one reply on the
customer's channel, that turn replacing the held ones (the customer's words stored, and seen by the model, once);
a failed turn leaves them as they were; "answered" plays nothing; a hand-back that says neither flags the session
in the list."""

from __future__ import annotations

import re

import pytest

from sessions_app.models import OperatorAction
from takeover_app import service
from takeover_app.models import OperatorReply, SessionMode
from tests.sessions_app import personas
from tests.takeover_app import agents
from tests.takeover_app.conftest import drain, texts, wa_message
from turns_app.models import TurnRecord

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
    before, transcript = sent(env), texts(SID)
    held_ids = [pk for pk, _ in service.held_messages(SID)]
    c = personas.client_for(held)
    r = c.post(HANDBACK, {"held": "bot_answers"}, HTTP_HX_REQUEST="true")
    assert (r.status_code, r.headers.get("HX-Refresh")) == (200, "true"), r.content  # the held rows are gone
    assert "The bot answered the held messages: reply sent" in c.get(f"/sessions/{SID}/").content.decode()
    joined = "thanks, also my invoice?\nand the delivery date?"
    assert calls() == ["hello", joined]  # one model call, the held lines together
    assert sent(env) == [*before, f"answer to {joined}"]  # one reply, on WhatsApp
    # The held turns are replaced by that one turn: each held line stored once, in its USER message.
    assert transcript[-2:] == [("user", "thanks, also my invoice?"), ("user", "and the delivery date?")]
    assert texts(SID) == [*transcript[:-2], ("user", joined), ("model", f"answer to {joined}")]
    [model_saw] = [call for call in agents.CALLS if call[-1] == ("user", joined)]
    assert sum("invoice" in c for _, c in model_saw) == 1 and sum("delivery date" in c for _, c in model_saw) == 1
    # Their turn records are marked as a rollback marks the turns it removes.
    assert set(TurnRecord.objects.filter(first_message_id__in=held_ids).values_list("status", flat=True)) == {
        "rolled_back"}
    assert service.held_messages(SID) == []
    [reply] = OperatorReply.objects.filter(author_username="")
    assert (reply.status, reply.provider, reply.text) == ("sent", "whatsapp", f"answer to {joined}")
    entry = OperatorAction.objects.filter(action="hand_back").get()
    assert entry.after["held"]["choice"] == "bot_answers" and len(entry.after["held"]["messages"]) == 2
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.held_unanswered) == ("bot", 0)
    drain()  # nothing queued plays it again
    assert sent(env) == [*before, f"answer to {joined}"] and len(calls()) == 2


def test_a_failed_bot_turn_leaves_the_held_messages_as_they_were_and_flags_them(client, held, env):
    wa_message(client, "wamid.5", "[fail] and a refund?")
    drain()
    before, rows = sent(env), list(service.held_messages(SID))
    transcript = texts(SID)
    assert [t for _, t in rows] == ["thanks, also my invoice?", "and the delivery date?", "[fail] and a refund?"]
    r = personas.client_for(held).post(HANDBACK, {"held": "bot_answers"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and "failed" in r.content.decode()
    assert len(calls()) == 2 and sent(env) == before  # the model was called, its turn failed: nothing sent
    assert service.held_messages(SID) == rows and texts(SID) == transcript  # the same rows, the same ids
    assert not OperatorReply.objects.filter(author_username="").exists()
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.held_unanswered) == ("bot", 3)
    assert "held unanswered" in personas.client_for(held).get("/sessions/").content.decode()


def test_a_message_answered_after_the_hand_back_first_leaves_the_held_ones_flagged(client, held, env, monkeypatch):
    """A worker plays a new customer message between the hand-back's commit and the held messages' turn: that
    turn replaces nothing (the session no longer ends with them), fails, and they are flagged as they were."""
    rows, arrival = list(service.held_messages(SID)), service.arrival

    def a_message_first(session_id):  # read by the hand-back after its commit, before the held turn
        wa_message(client, "wamid.6", "hello again")
        drain()
        return arrival(session_id)

    monkeypatch.setattr(service, "arrival", a_message_first)
    r = personas.client_for(held).post(HANDBACK, {"held": "bot_answers"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and "HeldChanged" in r.content.decode()
    assert calls()[-1] == "hello again" and len(calls()) == 2  # no model call for the held turn
    assert texts(SID)[-4:] == [*((("user", t) for _, t in rows)), ("user", "hello again"),
                               ("model", "answer to hello again")]
    assert SessionMode.objects.get(pk=SID).held_unanswered == 2


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
