"""Rollback as one operation on the live session: the preview is the rollback without its commit, and the
console, the transcript export and the rollback number a session's turns alike."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from api_app.models import ApiToken
from chatflow_agent.types import Message, Role
from sessions_app import actions, registry
from sessions_app.models import ChatMessage, ChatSession, OperatorAction, SessionLease
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from turns_app.models import TurnRecord

pytestmark = pytest.mark.django_db


@pytest.fixture
def olga():
    return personas.operator()


@pytest.fixture
def op_client(olga):
    return personas.client_for(olga)


def stored(session_id: str) -> list[tuple[int, str, str | None]]:
    return list(ChatMessage.objects.filter(session_id=session_id).order_by("id").values_list("id", "role", "content"))


def page_turns(client, session_id: str) -> dict[int, list[int]]:
    """Turn number → the row ids the session page shows in it."""
    html = client.get(f"/sessions/{session_id}/?order=oldest").content.decode()
    return {int(n): [int(i) for i in ids.split()]
            for n, ids in re.findall(r'id="turn-(\d+)" data-message-ids="([\d ]*)"', html)}


def test_the_preview_is_the_rollback_without_its_commit(op_client, olga):
    cv.store("s", cv.support_story(), agent="Billing")
    before = stored("s")

    preview = actions.plan_rollback("s", 1)
    dialog = op_client.get("/actions/rollback-preview/s/?turn=1", HTTP_HX_REQUEST="true").content.decode()

    assert stored("s") == before and not OperatorAction.objects.exists() and not SessionLease.objects.exists()
    assert not TurnRecord.objects.exists()  # a preview is no turn of the session's
    assert f"Messages removed: <strong>{len(preview.removed_ids)}</strong>" in dialog
    assert f'name="fingerprint" value="{preview.fingerprint}"' in dialog

    plan, entry = actions.rollback(olga, "s", 1, preview.fingerprint)

    assert plan == preview  # the same plan, made the same way
    left = [rid for rid, _role, _content in stored("s")]
    assert left == preview.kept_ids
    assert sorted({rid for rid, _role, _content in before} - set(left)) == preview.removed_ids
    assert entry.after["removed_message_ids"] == preview.removed_ids
    live = actions.site_store().get("s")
    assert len(live.turns) == preview.turn and live.active_agent.name == preview.agent_after == "Support"


def test_the_preview_waits_for_no_turn_it_would_race(op_client):
    """Planned under the session's turn lock, as the rollback is: while a turn holds the session, the preview
    is refused as the confirmation is, instead of showing a plan the running turn is about to change."""
    cv.store("s", cv.support_story())
    form = cv.rollback_form("s", 1)

    with actions.site_store().sync_turn("s", registry.starting_agent()):
        preview = op_client.get("/actions/rollback-preview/s/?turn=1", HTTP_HX_REQUEST="true")
        confirmation = op_client.post("/actions/rollback/s/", form, HTTP_HX_REQUEST="true")

    assert preview.status_code == confirmation.status_code == 409
    assert b"A turn is running" in preview.content and b"A turn is running" in confirmation.content
    assert op_client.get("/actions/rollback-preview/s/?turn=1", HTTP_HX_REQUEST="true").status_code == 200


def test_console_export_and_rollback_agree_on_turn_numbers(op_client, olga):
    """A session with rows before its first turn, a SYSTEM message between turns, tool calls and a handoff."""
    story = cv.support_story()
    cv.store("s", [cv.model("Welcome back!"), *story[:5], Message(role=Role.SYSTEM, content="Late rule."),
                   *story[5:]], agent="Billing")
    roles = {rid: role for rid, role, _content in stored("s")}
    contents = {rid: content for rid, _role, content in stored("s")}
    token, secret = ApiToken.issue("tests", olga)
    response = Client().get("/api/v1/sessions/s/transcript?format=json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    exported = json.loads(b"".join(response.streaming_content) if response.streaming else response.content)

    page = page_turns(op_client, "s")
    plan = actions.plan_rollback("s", 1)

    assert sorted(page) == [t["number"] for t in exported["turns"]] == [1, 2, 3] and plan.turn_count == 3
    for turn in exported["turns"]:
        n = turn["number"]
        shown = [(roles[rid], contents[rid]) for rid in page[n]]
        assert [(m["role"], m.get("content")) for m in turn["messages"] if m["role"] != "system"] == shown
        assert plan.first_message_id(n) == page[n][0] and contents[page[n][0]] == turn["messages"][0]["content"]
    calls = {(n, c["name"]) for t in exported["turns"] for n in [t["number"]] for c in t["tool_calls"]
             if not c["handoff"]}
    assert {(c.turn, c.name) for c in plan.side_effects} == {(n, name) for n, name in calls if n > 1}
    assert [(h["turn"], h["to"]) for h in plan.handoffs_undone] == [
        (t["number"], h["to"]) for t in exported["turns"] for h in t["handoffs"]] == [(2, "Billing")]
    leading = [rid for rid, role, _content in stored("s") if rid < page[1][0] and role != "system"]
    assert plan.removed_ids == sorted(leading + page[2] + page[3])

    actions.rollback(olga, "s", 1, plan.fingerprint)

    assert page_turns(op_client, "s") == {1: page[1]}
    assert ChatSession.objects.get(pk="s").active_agent_name == "Support"
