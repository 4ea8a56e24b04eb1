"""Demo data shows human takeover at once: `chatflow_demo --takeover 4` (what `dev.py serve` seeds) makes
sessions waiting for a person, one taken over by the demo colleague with her reply and a held customer
message, one handed back with a private note — all through the real turn path and the takeover service."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from sessions_app import runtime
from sessions_app.models import ChatMessage, OperatorAction
from takeover_app.models import OperatorReply, SessionMode

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_runtime():
    runtime.reset()
    yield
    runtime.reset()


def test_the_demo_seeds_waiting_taken_over_and_handed_back_sessions():
    out = io.StringIO()
    call_command("chatflow_demo", sessions=2, takeover=4, seed=5, stdout=out, stderr=io.StringIO())
    assert "and 4 human takeover demos" in out.getvalue()
    modes = {row.session_id: row for row in SessionMode.objects.all()}
    waiting = [r for r in modes.values() if r.mode == "waiting"]
    assert len(waiting) == 2 and {r.trigger for r in waiting} == {"phrase"}
    for row in waiting:  # the holding message went out, and the wait dates from the customer's words
        last_user = ChatMessage.objects.filter(session_id=row.session_id, role="user").latest("id")
        assert row.waiting_since == last_user.created_at
    [human] = [r for r in modes.values() if r.mode == "human"]
    assert human.owner_username == "dana.demo" and human.unread == 1
    newest = ChatMessage.objects.filter(session_id=human.session_id).latest("id")
    assert newest.role == "user" and "refund go back to my card" in newest.content  # held: no bot answer
    [handed_back] = [r for r in modes.values() if r.mode == "bot"]
    assert "re-issued" in handed_back.last_note
    replies = OperatorReply.objects.order_by("id")
    assert [(r.author_username, r.status) for r in replies] == [("dana.demo", "sent"), ("dana.demo", "sent")]
    assert set(OperatorAction.objects.values_list("action", flat=True)) >= {"take_over", "operator_reply",
                                                                           "hand_back"}


def test_without_takeover_the_demo_is_unchanged():
    call_command("chatflow_demo", sessions=2, seed=5, stdout=io.StringIO(), stderr=io.StringIO())
    assert not SessionMode.objects.exclude(mode="bot").exists()
