"""Deleting a session forgets what every app held of it: a customer who writes again starts a new conversation
with the bot, with no owner, no old note, no old replies; every table is walked after the delete."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from django.contrib.auth.models import User
from django.db import connections, transaction

from chatflow_agent.core import sql
from sessions_app import actions, holdings, runtime
from sessions_app.models import ChatMessage, ChatSession, OperatorAction, ProcessedMessage
from sessions_app.store import driver_cursor
from takeover_app import service
from takeover_app.models import OperatorReply, SessionMode
from tests.sessions_app import personas
from tests.takeover_app import agents
from tests.takeover_app.conftest import drain, texts, wa_message
from tests.takeover_app.test_api_export import bearer, body
from turns_app.models import TurnRecord
from webhooks_app import taskqueue
from webhooks_app.worker import no_model_call

pytestmark = pytest.mark.django_db(transaction=True)

SID = "15550100"
CUSTOMER = "hello, CUSTOMER-SECRET here"
HELD = "are you there? HELD-SECRET"
REPLY = "Olga here: REPLY-SECRET is on its way"
NOTE = "Private: NOTE-SECRET was promised"
REASON = "REASON-SECRET screen"
SECRETS = ("CUSTOMER-SECRET", "HELD-SECRET", "REPLY-SECRET", "NOTE-SECRET", "REASON-SECRET")


@pytest.fixture
def recording(env, settings):
    settings.CHATFLOW_AGENTS = "tests.takeover_app.agents.build"
    agents.CALLS.clear()
    return agents.CALLS


def taken_over_handed_back_and_taken_again(client) -> User:
    """A WhatsApp customer answered by the bot; an operator takes the session over, replies, hands it back to
    Billing with a private note, forces a handoff with a reason and takes it over again; the customer's next
    message is held for her."""
    wa_message(client, "wamid.1", CUSTOMER)
    drain()
    olga = personas.operator()
    service.take_over(olga, SID)
    service.send_reply(olga, SID, REPLY)
    service.hand_back(olga, SID, agent_name="Billing", note=NOTE)
    actions.force_handoff(olga, SID, "Support", reason=REASON)
    service.take_over(olga, SID)
    wa_message(client, "wamid.2", HELD)
    drain()
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.owner_username, row.pending_note, row.unread) == ("human", "olga.operator", NOTE, 1)
    return olga


def project_rows() -> dict[str, list[dict]]:
    """Every row of every table of the project's own apps (the three chatflow tables included), as text."""
    models = [m for c in holdings.project_apps() for m in c.get_models()]
    assert {ChatSession, ChatMessage, ProcessedMessage} <= set(models)
    return {m._meta.db_table: [json.loads(json.dumps(r, default=str)) for r in m.objects.values()] for m in models}


def test_deleting_a_session_leaves_nothing_of_it_but_what_is_kept_on_purpose(client, env, recording):
    taken_over_handed_back_and_taken_again(client)
    before = json.dumps(project_rows(), ensure_ascii=False)
    assert [s for s in SECRETS if s in before] == list(SECRETS)

    entry = actions.delete_session(personas.operator("dora.deleter"), SID)

    rows = project_rows()
    everything = json.dumps(rows, ensure_ascii=False)
    assert [s for s in SECRETS if s in everything] == []
    kept = {m._meta.db_table for h in holdings.holdings() if h.kept for m in h.models}
    assert kept == {"chatflow_operator_actions", "chatflow_inbound_deliveries", "chatflow_session_leases",
                    "chatflow_session_waiters", "chatflow_turn_records", "chatflow_session_totals"}
    for model in holdings.session_models():
        left = [r for r in rows[model._meta.db_table] if r.get("session_id") == SID]
        if model._meta.db_table not in kept:
            assert left == [], model  # deleted with the session
    assert {r["session_id"] for r in rows["chatflow_turn_records"]} == {""}  # figures kept, no session id
    assert rows["chatflow_session_totals"] == [] and rows["chatflow_session_leases"] == []
    # Kept on purpose: the claims and the redacted deliveries (a redelivery stays a duplicate), the audit trail.
    assert len(rows["chatflow_processed_messages"]) == 2
    assert [(d["status"], d["text"]) for d in rows["chatflow_inbound_deliveries"]] == [("done", "")] * 2
    audit = OperatorAction.objects.filter(session_id=SID).exclude(pk=entry.pk)
    assert {e.action for e in audit} == {"take_over", "operator_reply", "hand_back", "force_handoff"}
    handed = audit.get(action="hand_back")
    assert (handed.after["note"], handed.after["mode"], handed.after["active_agent"]) == (
        holdings.REDACTED, "bot", "Billing")
    assert entry.after["session_modes_deleted"] == 1 and entry.after["operator_replies_deleted"] == 1
    assert entry.after["audit_entries_redacted"] == 3  # the reply, the note, the handoff's reason


def test_a_customer_who_writes_again_after_the_delete_starts_a_new_conversation(client, env, recording):
    olga = taken_over_handed_back_and_taken_again(client)
    actions.delete_session(olga, SID)
    calls_before = len(recording)

    wa_message(client, "wamid.3", "a new conversation")
    drain()

    assert texts(SID) == [("user", "a new conversation"), ("model", "answer to a new conversation")]
    assert len(recording) == calls_before + 1
    assert not any("NOTE-SECRET" in content for _role, content in recording[-1])  # no old note as instructions
    assert not SessionMode.objects.filter(pk=SID).exclude(mode="bot").exists()  # the bot answers, nobody owns it
    assert not OperatorReply.objects.filter(session_id=SID).exists()
    transcript = json.loads(body(client.get(f"/api/v1/sessions/{SID}/transcript", {"view": "operator"},
                                            **bearer(olga))))
    assert transcript["operator_view"]["replies"] == [] and transcript["operator_view"]["owner"] in ("", None)
    audit_page = personas.client_for(personas.viewer()).get("/audit/", {"session": SID}).content.decode()
    assert "Take over" in audit_page  # the trail stays
    assert [s for s in SECRETS if s in audit_page] == []


def test_a_reply_whose_session_is_deleted_while_it_is_sent_is_a_404_not_a_500(client, env, recording):
    wa_message(client, "wamid.1", CUSTOMER)
    drain()
    olga = personas.operator()
    service.take_over(olga, SID)
    env.wa.requests.clear()
    env.wa.arrived.clear()
    env.wa.hold = threading.Event()
    answered: list = []

    def reply() -> None:
        try:
            answered.append(personas.client_for(olga).post(f"/actions/reply/{SID}/", {"text": REPLY}))
        finally:
            connections.close_all()

    sending = threading.Thread(target=reply)
    sending.start()
    assert env.wa.arrived.wait(20)
    actions.delete_session(personas.operator("dora.deleter"), SID)
    env.wa.hold.set()
    sending.join(20)

    assert answered and answered[0].status_code == 404
    assert not OperatorReply.objects.exists()


def _store_delete() -> None:
    assert runtime.site_runner().session_store.delete(SID) is True


def _store_adelete() -> None:
    assert asyncio.run(runtime.site_runner().session_store.adelete(SID)) is True


def _store_clear() -> None:
    runtime.site_runner().session_store.clear()


STORE_DELETES = {"delete": _store_delete, "adelete": _store_adelete, "clear": _store_clear}


@pytest.mark.parametrize("deleting", STORE_DELETES.values(), ids=STORE_DELETES.keys())
def test_the_stores_own_delete_forgets_what_every_app_held_too(client, env, recording, deleting):
    """A bot sharing the site's store deletes through its public API, not the console's action."""
    taken_over_handed_back_and_taken_again(client)

    deleting()

    everything = json.dumps(project_rows(), ensure_ascii=False)
    assert [s for s in SECRETS if s in everything] == []
    assert not TurnRecord.objects.filter(session_id=SID).exists()
    wa_message(client, "wamid.3", "a new conversation")
    drain()
    assert texts(SID) == [("user", "a new conversation"), ("model", "answer to a new conversation")]
    mode = service.mode_of(SID)
    assert (mode.mode, mode.owner_username, mode.unread, mode.pending_note) == ("bot", "", 0, "")
    assert not OperatorReply.objects.filter(session_id=SID).exists()


def test_a_mode_left_by_a_process_that_deleted_only_the_store_tables_does_not_govern_the_new_session(
        client, env, recording):
    """A chatflow-agent 0.3.4 bot on the same file deletes the session with its own statements: its mode row
    and replies stay behind, but the customer's next message starts a conversation the bot answers."""
    taken_over_handed_back_and_taken_again(client)
    with transaction.atomic(), driver_cursor() as (cursor, dialect):
        assert sql.delete_session(cursor, dialect, SID)
    assert SessionMode.objects.filter(pk=SID, mode="human").exists()

    wa_message(client, "wamid.3", "a new conversation")
    drain()

    assert texts(SID) == [("user", "a new conversation"), ("model", "answer to a new conversation")]
    assert not any("NOTE-SECRET" in content for _role, content in recording[-1])
    assert not SessionMode.objects.filter(session_id=SID).exclude(mode="bot").exists()
    assert not OperatorReply.objects.filter(session_id=SID).exists()
    wa_message(client, "wamid.4", "still the bot?")
    drain()
    assert texts(SID)[-1] == ("model", "answer to still the bot?")


def test_a_mode_left_by_such_a_process_does_not_send_the_next_message_to_the_held_lane(client, env, recording):
    """The worker's lane for messages that need no model call counts a mode row only while its session exists."""
    taken_over_handed_back_and_taken_again(client)
    with transaction.atomic(), driver_cursor() as (cursor, dialect):
        assert sql.delete_session(cursor, dialect, SID)

    wa_message(client, "wamid.3", "a new conversation")

    assert taskqueue.claim_next("held-lane", 30.0, no_model_call()) is None
    assert taskqueue.claim_next("a-slot", 30.0).provider_message_id == "wamid.3"
