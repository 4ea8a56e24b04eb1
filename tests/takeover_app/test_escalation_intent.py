"""Escalation that needs intent (issue 39, item 2): the default phrases ask for a person, a site's list replaces
them, each escalation records what fired it (shown on the session page), the agents page's "would this
escalate?" tester, "not needed" marks (audited, permission-checked) and the dashboard's escalations by trigger."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from sessions_app.models import OperatorAction
from takeover_app import escalations, service
from takeover_app.gate import asks_for_human
from takeover_app.models import SessionMode
from tests.processes import REPO
from tests.sessions_app import personas
from tests.takeover_app.conftest import drain, texts, wa_message

SID = "15550100"


@pytest.mark.parametrize("text", [
    "My travel agent booked order A-1001, where is it?",
    "Which mobile operator do you ship SIM cards for?",
    "Is humanity doomed?", "the agents list", "Mi agente de viajes reservó el pedido",
])
def test_the_defaults_do_not_escalate_a_message_about_other_agents_or_operators(text):
    assert asks_for_human(text) == ""


@pytest.mark.parametrize("text, phrase", [
    ("I want to talk to a person", "talk to a person"),
    ("quero falar com um atendente", "falar com um atendente"),
    ("QUERO FALAR COM UM  ATENDENTE!", "falar com um atendente"),  # case and spacing
    ("Quiero ATENCIÓN HUMANA, por favor", "atencion humana"),  # accents
    ("Hablar con una persona real", "hablar con una persona"),
    ("I want a human please", "want a human"),
])
def test_the_defaults_escalate_a_request_for_a_person_in_any_case_and_accents(text, phrase):
    assert asks_for_human(text) == phrase


def test_a_sites_list_replaces_the_defaults(settings):
    settings.CHATFLOW_HUMAN_PHRASES = ["agent", "Atenção"]
    assert asks_for_human("My travel agent booked order A-1001") == "agent"
    assert asks_for_human("preciso de atencao") == "Atenção"  # reported as configured
    assert asks_for_human("I want to talk to a person") == ""


def test_the_configuration_page_lists_the_default_phrases_as_settings_has_them():
    row = next(line for line in (REPO / "docs" / "configuration.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `CHATFLOW_HUMAN_PHRASES`"))
    documented = [p.strip() for part in re.findall(r"`([^`]+)`", row.split("|")[2]) for p in part.split(",")]
    assert documented == django_settings.CHATFLOW_HUMAN_PHRASES  # the tests run without the variable set


@pytest.mark.django_db(transaction=True)
def test_an_escalation_records_the_phrase_and_the_session_page_shows_it(client, env):
    wa_message(client, "wamid.1", "My travel agent booked order A-1001, where is it?")
    wa_message(client, "wamid.2", "Which mobile operator do you ship SIM cards for?")
    drain()
    assert SessionMode.objects.filter(pk=SID).first() is None or SessionMode.objects.get(pk=SID).mode == "bot"
    wa_message(client, "wamid.3", "I want to talk to a person")
    drain()
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.trigger) == ("waiting", "phrase")
    entry = OperatorAction.objects.get(action="human_requested")
    assert (entry.after["trigger"], entry.after["phrase"]) == ("phrase", "talk to a person")
    assert texts(SID)[-1] == ("model", django_settings.CHATFLOW_HOLDING_MESSAGE)
    page = personas.client_for(personas.operator()).get(f"/sessions/{SID}/").content.decode()
    assert "matched the phrase \u201ctalk to a person\u201d" in page
    assert "Escalation not needed" in page


@pytest.mark.django_db(transaction=True)
def test_an_agents_request_human_call_is_recorded_with_its_reason(client, env, settings):
    settings.CHATFLOW_AGENTS = "agents_app.demo_team.build"
    settings.CHATFLOW_ENGINE = "demo"
    settings.CHATFLOW_HUMAN_PHRASES = ["zzz-never"]  # the words reach the agent, not the phrase trigger
    wa_message(client, "wamid.1", "Can I talk to a person?")
    drain()
    entry = OperatorAction.objects.get(action="human_requested")
    assert entry.after["trigger"] == "tool" and entry.after["tool"] == "request_human"
    assert entry.after["tool_reason"]
    assert escalations.latest(SID).fired.startswith("an agent called request_human")


# ---- the tester ----------------------------------------------------------------------------------
CHECK = "/agents/escalation-check/"


@pytest.mark.django_db
@pytest.mark.parametrize("text, escalates", [("My travel agent booked order A-1001, where is it?", False),
                                             ("quero falar com um atendente", True)])
def test_the_tester_says_whether_a_text_escalates_and_which_phrase_matched(text, escalates):
    c = personas.client_for(personas.operator())
    fragment = c.get(CHECK, {"text": text}, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200 and b"<html" not in fragment.content
    body = fragment.content.decode()
    assert ("Escalates" in body and "\u201cfalar com um atendente\u201d" not in body  # a <q>, not quotes
            and "<q>falar com um atendente</q>" in body) if escalates else "Does not escalate" in body
    page = c.get(CHECK, {"text": text})
    assert page.status_code == 200 and b"<html" in page.content and b'id="takeover-settings"' in page.content


@pytest.mark.django_db
@pytest.mark.parametrize("params", [{}, {"text": "   "}, {"text": "x" * 4001}])
def test_the_tester_answers_bad_input_with_400(params):
    c = personas.client_for(personas.operator())
    assert c.get(CHECK, params, HTTP_HX_REQUEST="true").status_code == 400
    assert c.get(CHECK, params).status_code == 400


@pytest.mark.django_db
def test_the_agents_page_shows_the_takeover_settings_and_the_tester_to_operators_only():
    page = personas.client_for(personas.operator()).get("/agents/").content.decode()
    assert 'id="escalation-check"' in page and "<q>falar com um atendente</q>" in page
    viewer = personas.client_for(personas.viewer())
    shown = viewer.get("/agents/").content.decode()
    assert 'id="takeover-settings"' in shown and 'id="escalation-check"' not in shown
    assert viewer.get(CHECK, {"text": "talk to a human"}).status_code == 403


# ---- not needed, and the dashboard ---------------------------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_not_needed_is_audited_permission_checked_once_and_counted(client, env):
    wa_message(client, "wamid.1", "hello")
    drain()
    url = f"/actions/escalation-not-needed/{SID}/"
    olga = personas.operator()
    c = personas.client_for(olga)
    assert c.post(url, HTTP_HX_REQUEST="true").status_code == 400  # never escalated
    wa_message(client, "wamid.2", "I want to talk to a person")
    drain()
    assert personas.client_for(personas.viewer()).post(url).status_code == 403
    r = c.post(url, {"reason": "they wanted the opening hours"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    mark = OperatorAction.objects.get(action="escalation_not_needed")
    escalated = OperatorAction.objects.get(action="human_requested")
    assert (mark.actor_username, mark.after["escalation"], mark.after["trigger"]) == (
        "olga.operator", escalated.pk, "phrase")
    again = c.post(url, HTTP_HX_REQUEST="true")
    assert again.status_code == 400 and b"already marked" in again.content
    assert OperatorAction.objects.filter(action="escalation_not_needed").count() == 1
    # A second escalation, not marked: the rate is one in two.
    service.take_over(olga, SID)
    service.hand_back(olga, SID)
    wa_message(client, "wamid.3", "quero falar com um atendente")
    drain()
    now = timezone.now()
    [phrase] = escalations.counts(now - timedelta(hours=1), now + timedelta(seconds=1))
    assert (phrase.trigger, phrase.escalations, phrase.not_needed, phrase.not_needed_rate) == ("phrase", 2, 1, 50.0)
    board = c.get("/dashboard/").content.decode()
    assert 'id="chart-escalations"' in board
    assert re.search(r"<th scope=\"row\">The customer asked for a person</th><td class=\"num\">2</td>"
                     r"<td class=\"num\">1</td><td class=\"num\">50.0 %</td>", board)
