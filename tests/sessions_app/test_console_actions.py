"""Operator actions through the console: force handoff, roll back to a turn (preview first), delete —
each in one transaction with its audit entry, refused with 409 while a turn holds the session."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connections
from django.urls import reverse

from sessions_app import actions, registry
from sessions_app.models import ChatMessage, ChatSession, OperatorAction, SessionLease
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas

pytestmark = pytest.mark.django_db

FIXTURE_DB = Path(__file__).resolve().parents[1] / "fixtures" / "chatflow_034.db"
WEIRD_IDS = ["+15550100", "tg:998877", "a/b", "olá 👋", "x" * 255]


@pytest.fixture
def olga():
    return personas.operator()


@pytest.fixture
def op_client(olga):
    return personas.client_for(olga)


def url(name: str, session_id: str) -> str:
    return reverse(name, args=[session_id])


def snapshot(session_id: str) -> tuple:
    row = ChatSession.objects.filter(pk=session_id).values_list("active_agent_name", "metadata").first()
    ids = list(ChatMessage.objects.filter(session_id=session_id).values_list("id", "message_json"))
    return row, ids


def foreign_lease(session_id: str) -> None:
    """A turn running in another process: it holds the session's lease."""
    SessionLease.objects.create(session_id=session_id, owner="bot-host:4242:turn", expires_at=time.time() + 60)


# ---- force handoff ---------------------------------------------------------------------------
def test_force_handoff_sets_the_active_agent_and_is_audited(op_client, olga):
    cv.store("tg:998877", cv.support_story())

    response = op_client.post(url("sessions-handoff-session", "tg:998877"), {"agent": "Tech", "reason": "screen"})

    assert response.status_code == 302 and response["Location"] == url("sessions-show-session", "tg:998877")
    assert ChatSession.objects.get(pk="tg:998877").active_agent_name == "Tech"
    entry = OperatorAction.objects.get()
    assert (entry.actor, entry.actor_username, entry.action, entry.session_id) == (
        olga, "olga.operator", "force_handoff", "tg:998877")
    assert entry.before == {"active_agent": "Support"}
    assert entry.after == {"active_agent": "Tech", "reason": "screen"}
    assert actions.site_store().get("tg:998877").active_agent is registry.get_agent("Tech")


def test_a_handoff_reason_with_nul_is_audited_without_it_not_a_500(op_client):
    # PostgreSQL's jsonb refuses \u0000: the audit entry's JSON is made safe before it is written.
    cv.store("s", cv.support_story())

    response = op_client.post(url("sessions-handoff-session", "s"), {"agent": "Tech", "reason": "scr\x00een"})

    assert response.status_code == 302
    assert OperatorAction.objects.get().after == {"active_agent": "Tech", "reason": "screen"}
    assert ChatSession.objects.get(pk="s").active_agent_name == "Tech"


def test_a_handoff_to_the_active_agent_is_refused_and_not_audited(op_client):
    cv.store("s", cv.support_story())

    response = op_client.post("/actions/handoff/s/", {"agent": "Support"})
    page = op_client.get(url("sessions-show-session", "s")).content.decode()

    assert response.status_code == 400
    assert "Support is already the active agent of this session." in response.content.decode()
    assert not OperatorAction.objects.exists()
    assert '<option value="Support">' not in page and '<option value="Billing">' in page


def test_force_handoff_over_htmx_returns_the_updated_session_panel(op_client):
    cv.store("s", cv.support_story())

    response = op_client.post("/actions/handoff/s/", {"agent": "Billing"}, HTTP_HX_REQUEST="true")

    assert response.status_code == 200 and response["HX-Retarget"] == "#session-panel"
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="session-panel" class="workspace">') and "<html" not in body
    assert "Handed off from Support to Billing." in body
    assert "<dt>Active agent</dt><dd><strong>Billing</strong>" in body


def test_an_unknown_agent_is_refused_with_400_and_changes_nothing(op_client):
    cv.store("s", cv.support_story())
    before = snapshot("s")

    full = op_client.post("/actions/handoff/s/", {"agent": "Nobody"})
    fragment = op_client.post("/actions/handoff/s/", {"agent": "<b>x</b>"}, HTTP_HX_REQUEST="true")

    assert full.status_code == fragment.status_code == 400
    assert "Unknown agent &#x27;Nobody&#x27;; registered agents: Support, Billing, Tech." in full.content.decode()
    assert b"<html" in full.content
    assert fragment["HX-Retarget"] == "#handoff-error" and b'role="alert"' in fragment.content
    assert b"&lt;b&gt;x&lt;/b&gt;" in fragment.content
    assert snapshot("s") == before and not OperatorAction.objects.exists()


# ---- busy sessions ---------------------------------------------------------------------------
@pytest.mark.parametrize("post", [
    ("sessions-handoff-session", {"agent": "Tech"}),
    ("sessions-rollback-session", {"turn": "1"}),
], ids=["handoff", "rollback"])
@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_actions_on_a_session_whose_turn_runs_in_another_process_are_409_and_change_nothing(op_client, post, htmx):
    cv.store("+15550100", cv.support_story())
    data = cv.rollback_form("+15550100", 1) if post[0] == "sessions-rollback-session" else post[1]
    foreign_lease("+15550100")
    before = snapshot("+15550100")
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}

    response = op_client.post(url(post[0], "+15550100"), data, **extra)

    assert response.status_code == 409
    assert "A turn is running on session &#x27;+15550100&#x27;" in response.content.decode()
    assert snapshot("+15550100") == before and not OperatorAction.objects.exists()
    assert SessionLease.objects.get().owner == "bot-host:4242:turn"  # the running turn keeps its lease


def test_a_rollback_while_a_turn_runs_in_this_process_is_409_and_changes_nothing(op_client):
    cv.store("s", cv.support_story())
    before = snapshot("s")
    store = actions.site_store()
    form = cv.rollback_form("s", 1)

    with store.sync_turn("s", registry.starting_agent()) as session:
        response = op_client.post("/actions/rollback/s/", form)
        assert len(session.history) == 15

    assert response.status_code == 409 and b"A turn is running" in response.content
    assert snapshot("s") == before and not OperatorAction.objects.exists()


def test_an_expired_lease_does_not_block_an_action(op_client):
    cv.store("s", cv.support_story())
    SessionLease.objects.create(session_id="s", owner="dead-process", expires_at=time.time() - 1)

    assert op_client.post("/actions/handoff/s/", {"agent": "Tech"}).status_code == 302
    assert not SessionLease.objects.exists()


# ---- rollback --------------------------------------------------------------------------------
def test_the_rollback_preview_lists_what_goes_and_what_is_not_undone(op_client):
    cv.store("s", cv.support_story(), agent="Billing")

    full = op_client.get("/actions/rollback-preview/s/?turn=1")
    fragment = op_client.get("/actions/rollback-preview/s/?turn=1", HTTP_HX_REQUEST="true")

    assert full.status_code == fragment.status_code == 200
    assert b"<html" in full.content and b'id="rollback-preview"' in full.content
    assert fragment.content.lstrip().startswith(b'<div class="card preview" id="rollback-preview">')
    body = fragment.content.decode()
    assert "Turns removed: <strong>2</strong> (turn 2–3)" in body
    assert "Messages removed: <strong>10</strong>" in body
    assert "Active agent afterwards: <strong>Support</strong> (now Billing)" in body
    effects = body[body.index("<em>not</em> undone"):body.index("Handoffs undone")]
    assert "refund_order" in effects and "get_invoice" in effects and ">error<" in effects
    assert "transfer_to_billing" not in effects
    assert "Turn 2: Support → Billing · <bdi>refund</bdi>" in body
    assert 'name="fingerprint"' in body and "Roll back: remove 10 messages" in body


def test_rollback_preview_and_result_agree(op_client, olga):
    cv.store("s", cv.support_story(), agent="Billing")
    plan = actions.plan_rollback("s", 2)
    all_ids = list(ChatMessage.objects.filter(session_id="s").order_by("id").values_list("id", flat=True))

    response = op_client.post("/actions/rollback/s/", {"turn": "2", "fingerprint": plan.fingerprint},
                              HTTP_HX_REQUEST="true")

    assert response.status_code == 200 and response["HX-Retarget"] == "#session-panel"
    assert "Rolled back to turn 2: 4 messages removed; active agent Billing." in response.content.decode()
    left = list(ChatMessage.objects.filter(session_id="s").order_by("id").values_list("id", flat=True))
    assert left == plan.kept_ids and sorted(set(all_ids) - set(left)) == plan.removed_ids
    assert ChatSession.objects.get(pk="s").active_agent_name == plan.agent_after == "Billing"
    entry = OperatorAction.objects.get()
    assert entry.action == "rollback" and entry.actor == olga
    assert entry.before == {"turn_count": 3, "active_agent": "Billing", "fingerprint": plan.fingerprint}
    assert entry.after["removed_message_ids"] == plan.removed_ids and entry.after["turn_count"] == 2
    assert [c["name"] for c in entry.after["tool_calls_not_undone"]] == ["get_invoice"]
    fresh = actions.site_store().get("s")
    assert len(fresh.turns) == 2 and fresh.active_agent.name == "Billing"


def test_rollback_to_a_turn_before_a_handoff_restores_the_agent_that_ended_it(op_client):
    cv.store("s", cv.support_story(), agent="Billing")

    op_client.post("/actions/rollback/s/", cv.rollback_form("s", 1))

    assert ChatSession.objects.get(pk="s").active_agent_name == "Support"
    assert ChatMessage.objects.filter(session_id="s").count() == 5  # system + turn 1


def test_rollback_to_turn_zero_keeps_only_system_messages(op_client):
    cv.store("s", cv.support_story())
    op_client.post("/actions/rollback/s/", cv.rollback_form("s", 0))
    assert list(ChatMessage.objects.filter(session_id="s").values_list("role", flat=True)) == ["system"]


@pytest.mark.parametrize("turn", ["3", "-1", "99"])
def test_rollback_to_a_turn_that_does_not_exist_is_400(op_client, turn):
    cv.store("s", cv.support_story())
    before = snapshot("s")
    fingerprint = cv.rollback_form("s", 0)["fingerprint"]

    response = op_client.post("/actions/rollback/s/", {"turn": turn, "fingerprint": fingerprint})
    preview = op_client.get("/actions/rollback-preview/s/", {"turn": turn}, HTTP_HX_REQUEST="true")

    assert response.status_code == preview.status_code == 400
    assert b"Cannot roll back to turn" in response.content and b"choose a turn from 0 to 2" in preview.content
    assert snapshot("s") == before


def test_a_rollback_confirmed_after_the_session_changed_is_refused(op_client):
    cv.store("s", cv.support_story())
    plan = actions.plan_rollback("s", 1)
    ChatMessage.objects.create(session_id="s", role="user", content="new turn",
                               message_json=cv.user("new turn").model_dump_json())
    before = snapshot("s")

    response = op_client.post("/actions/rollback/s/", {"turn": "1", "fingerprint": plan.fingerprint})

    assert response.status_code == 409 and b"changed since the preview" in response.content
    assert snapshot("s") == before and not OperatorAction.objects.exists()


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_a_rollback_without_the_previews_fingerprint_is_refused(op_client, htmx):
    cv.store("s", cv.support_story())
    before = snapshot("s")
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}

    response = op_client.post("/actions/rollback/s/", {"turn": "1"}, **extra)
    empty = op_client.post("/actions/rollback/s/", {"turn": "1", "fingerprint": ""}, **extra)

    assert response.status_code == empty.status_code == 400
    assert b"The rollback needs the fingerprint of its preview" in response.content
    assert b"The rollback needs the fingerprint of its preview" in empty.content
    assert snapshot("s") == before and not OperatorAction.objects.exists()


@pytest.mark.parametrize("turn", ["abc", "", "1.5", "9" * 5000])
def test_a_turn_that_is_not_a_number_is_a_clear_400(op_client, turn):
    cv.store("s", cv.support_story())
    before = snapshot("s")
    fingerprint = cv.rollback_form("s", 1)["fingerprint"]

    preview = op_client.get("/actions/rollback-preview/s/", {"turn": turn}, HTTP_HX_REQUEST="true")
    response = op_client.post("/actions/rollback/s/", {"turn": turn, "fingerprint": fingerprint})

    assert preview.status_code == response.status_code == 400
    for body in (preview.content.decode(), response.content.decode()):
        assert "turn must be a number" in body and "turn -1" not in body
    assert snapshot("s") == before and not OperatorAction.objects.exists()


def test_a_stale_confirmation_says_changed_even_when_its_turn_no_longer_exists(op_client):
    cv.store("s", cv.support_story())
    form = cv.rollback_form("s", 2)
    assert op_client.post("/actions/rollback/s/", cv.rollback_form("s", 1)).status_code == 302  # now 1 turn

    response = op_client.post("/actions/rollback/s/", form)

    assert response.status_code == 409 and b"changed since the preview" in response.content
    assert b"choose a turn" not in response.content and OperatorAction.objects.count() == 1


def test_the_audit_entry_names_turns_by_their_first_message_id_too(op_client, settings):
    """Once the window is full, turn numbers shift as old turns are pruned; message ids do not."""
    settings.CHATFLOW_MAX_TURNS = 3
    cv.store("s", [m for i in range(1, 6) for m in (cv.user(f"q{i}"), cv.model(f"a{i}"))])
    first_ids = dict(ChatMessage.objects.filter(session_id="s", role="user").values_list("content", "id"))

    assert op_client.post("/actions/rollback/s/", cv.rollback_form("s", 4)).status_code == 302

    after = OperatorAction.objects.get().after
    assert after["turn"] == 4 and after["turn_first_message_id"] == first_ids["q4"]
    assert after["removed_turns"] == [1, 2, 5]
    assert after["removed_turn_first_message_ids"] == [first_ids["q1"], first_ids["q2"], first_ids["q5"]]
    # The page now numbers q4's turn 2; its first message is still the one the audit entry names.
    assert ChatMessage.objects.get(pk=after["turn_first_message_id"]).content == "q4"


def test_rolling_back_to_turn_zero_names_no_first_message(op_client):
    cv.store("s", cv.support_story())
    users = ChatMessage.objects.filter(session_id="s", role="user")
    first_ids = list(users.order_by("id").values_list("id", flat=True))

    op_client.post("/actions/rollback/s/", cv.rollback_form("s", 0))

    after = OperatorAction.objects.get().after
    assert after["turn_first_message_id"] is None and after["removed_turn_first_message_ids"] == first_ids


@pytest.mark.django_db(transaction=True)
def test_parallel_confirmations_of_one_preview_give_one_rollback_and_409s(olga):
    """Ten operators confirm the same preview at once: one rollback, nine "changed since the preview"."""
    cv.store("s", cv.support_story())
    form = cv.rollback_form("s", 1)
    clients = [personas.client_for(olga) for _ in range(10)]
    start = threading.Barrier(len(clients))

    def confirm(client):
        try:
            start.wait()
            response = client.post("/actions/rollback/s/", form)
            return response.status_code, response.content.decode()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(len(clients)) as pool:
        results = list(pool.map(confirm, clients))

    statuses = sorted(status for status, _body in results)
    assert statuses == [302] + [409] * 9, results
    assert all("changed since the preview" in body for status, body in results if status == 409)
    assert OperatorAction.objects.filter(action="rollback").count() == 1
    assert ChatMessage.objects.filter(session_id="s").count() == 5  # system + turn 1


def test_turns_outside_the_runtime_window_are_shown_as_removed_and_cannot_be_targets(op_client, settings):
    settings.CHATFLOW_MAX_TURNS = 3
    cv.store("s", [m for i in range(1, 6) for m in (cv.user(f"q{i}"), cv.model(f"a{i}"))])

    fingerprint = cv.rollback_form("s", 3)["fingerprint"]
    assert op_client.post("/actions/rollback/s/", {"turn": "1", "fingerprint": fingerprint}).status_code == 400
    preview = op_client.get("/actions/rollback-preview/s/", {"turn": "3"}).content.decode()
    assert "turns 1–2, outside the runtime's window of 3 turns" in preview
    detail = op_client.get("/sessions/s/").content.decode()
    assert detail.count("outside the window") == 2
    assert "end of turn 3" in detail and "end of turn 2" not in detail
    plan = actions.plan_rollback("s", 3)

    assert op_client.post("/actions/rollback/s/", {"turn": "3", "fingerprint": fingerprint}).status_code == 302

    contents = list(ChatMessage.objects.filter(session_id="s").order_by("id").values_list("content", flat=True))
    assert contents == ["q3", "a3"]
    assert plan.removed_turns == [1, 2, 4, 5]


def load_034_session(session_id: str) -> None:
    """Copy one session of the 0.3.4 fixture database into the test database, rows and ids as written."""
    source = sqlite3.connect(f"file:{FIXTURE_DB}?mode=ro", uri=True)
    try:
        agent, metadata, created, updated = source.execute(
            "SELECT active_agent_name, metadata_json, created_at, updated_at FROM chatflow_sessions "
            "WHERE session_id = ?", (session_id,)).fetchone()
        messages = source.execute("SELECT id, role, content, message_json, created_at FROM chatflow_messages "
                                  "WHERE session_id = ? ORDER BY id", (session_id,)).fetchall()
    finally:
        source.close()

    def utc(text: str) -> datetime:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)

    ChatSession.objects.create(session_id=session_id, active_agent_name=agent, metadata=json.loads(metadata),
                               created_at=utc(created), updated_at=utc(updated))
    ChatMessage.objects.bulk_create([
        ChatMessage(id=rid, session_id=session_id, role=role, content=content, message_json=raw, created_at=utc(at))
        for rid, role, content, raw, at in messages
    ])


def test_a_session_written_by_chatflow_agent_034_rolls_back(op_client):
    load_034_session("tg:998877")
    plan = actions.plan_rollback("tg:998877", 1)
    assert plan.agent_after == "Billing" and plan.removed_ids == [11, 12]

    detail = op_client.get(url("sessions-show-session", "tg:998877")).content.decode()
    assert ("Handoff <strong>Support</strong> → <strong>Billing</strong> · <bdi>Duplicate subscription charge</bdi>"
            in detail)

    response = op_client.post(url("sessions-rollback-session", "tg:998877"),
                              {"turn": "1", "fingerprint": plan.fingerprint})

    assert response.status_code == 302
    assert list(ChatMessage.objects.filter(session_id="tg:998877").values_list("id", flat=True)) == [7, 8, 9, 10]
    assert ChatSession.objects.get(pk="tg:998877").active_agent_name == "Billing"


def test_rolling_back_to_turn_zero_before_a_034_handoff_gives_the_starting_agent(op_client):
    load_034_session("tg:998877")
    assert actions.plan_rollback("tg:998877", 0).agent_after == "Support"


# ---- delete ----------------------------------------------------------------------------------
def test_the_delete_confirmation_shows_counts_as_a_page_and_a_fragment(op_client):
    cv.store("s", cv.support_story())

    full = op_client.get("/actions/delete-confirm/s/")
    fragment = op_client.get("/actions/delete-confirm/s/", HTTP_HX_REQUEST="true")

    assert b"<html" in full.content
    assert fragment.content.lstrip().startswith(b'<div class="card preview" id="delete-confirm">')
    assert b"its <strong>15</strong> messages in <strong>3</strong> turns" in fragment.content
    assert ChatSession.objects.filter(pk="s").exists()


@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_delete_removes_the_session_through_the_store_and_is_audited(op_client, olga, htmx):
    cv.store("s", cv.support_story(), metadata={"channel": "web"})
    live = actions.site_store().get("s")
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}

    response = op_client.post("/actions/delete/s/", **extra)

    if htmx:
        assert response.status_code == 200 and response["HX-Redirect"] == "/sessions/"
    else:
        assert response.status_code == 302 and response["Location"] == "/sessions/"
    assert not ChatSession.objects.filter(pk="s").exists()
    assert not ChatMessage.objects.filter(session_id="s").exists()
    assert live.deleted  # a live session object (a turn holding it) gets SessionDeletedError
    entry = OperatorAction.objects.get()
    assert (entry.action, entry.actor, entry.session_id) == ("delete", olga, "s")
    assert entry.before["messages"] == 15 and entry.before["turns"] == 3
    assert entry.before["metadata"] == {"channel": "web"}
    assert entry.after == {"deleted": True, "deliveries_cancelled": 0, "deliveries_redacted": 0,
                           "session_modes_deleted": 0, "audit_entries_redacted": 0, "turn_records_redacted": 0,
                           "operator_replies_deleted": 0}
    assert op_client.get("/sessions/s/").status_code == 404
    assert op_client.post("/actions/delete/s/").status_code == 404


# ---- weird ids -------------------------------------------------------------------------------
@pytest.mark.parametrize("session_id", WEIRD_IDS)
def test_weird_session_ids_open_hand_off_roll_back_and_delete(op_client, session_id):
    cv.store(session_id, cv.support_story())
    cv.store(session_id + "-other", cv.support_story())

    assert op_client.get(url("sessions-show-session", session_id)).status_code == 200
    assert op_client.get(url("sessions-preview-rollback", session_id), {"turn": 1}).status_code == 200
    assert op_client.post(url("sessions-handoff-session", session_id), {"agent": "Tech"}).status_code == 302
    rollback = cv.rollback_form(session_id, 1)
    assert op_client.post(url("sessions-rollback-session", session_id), rollback).status_code == 302
    assert ChatMessage.objects.filter(session_id=session_id).count() == 5
    assert op_client.get(url("sessions-confirm-delete", session_id)).status_code == 200
    assert op_client.post(url("sessions-delete-session", session_id)).status_code == 302

    assert not ChatSession.objects.filter(pk=session_id).exists()
    assert ChatMessage.objects.filter(session_id=session_id + "-other").count() == 15  # the neighbour is intact
    assert list(OperatorAction.objects.order_by("id").values_list("action", "session_id")) == [
        ("force_handoff", session_id), ("rollback", session_id), ("delete", session_id)]
