"""The session page's takeover presentation: the mode badge, the takeover panel (the choice while a turn
runs), the hand-back dialog (its agent defaulting to the one before the takeover), the reply composer
for the owner only, operator messages with their delivery and Resend; Viewers see no form."""

from __future__ import annotations

import re
import time

import pytest

from sessions_app.models import SessionLease
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.takeover_app import page_states

pytestmark = pytest.mark.django_db


def page(client, session_id: str, **extra) -> str:
    response = client.get(f"/sessions/{session_id}/", **extra)
    assert response.status_code == 200
    return response.content.decode()


def test_a_bot_session_offers_take_over_and_no_composer():
    cv.store("web-1", [cv.user("hi"), cv.model("hello")], metadata={"channel": "web"})
    html = page(personas.client_for(personas.operator()), "web-1")
    assert '<span id="mode-badge" class="badge mode-bot">Bot</span>' in html
    form = re.search(r'<form class="takeover-form".*?</form>', html, re.S).group(0)
    assert 'name="when" value="after_turn">Take over</button>' in form and 'value="now"' not in form
    assert 'name="csrfmiddlewaretoken"' in form
    assert "data-composer" not in html


def test_while_a_turn_runs_the_operator_chooses_after_this_turn_or_stop_it_now():
    cv.store("web-2", [cv.user("hi")], metadata={"channel": "web"})
    SessionLease.objects.create(session_id="web-2", owner="host:1", acquired_at=time.time(),
                                expires_at=time.time() + 60)
    html = page(personas.client_for(personas.operator()), "web-2")
    form = re.search(r'<form class="takeover-form".*?</form>', html, re.S).group(0)
    assert ">Take over after this turn</button>" in form and ">Stop it now and take over</button>" in form
    assert 'value="now" class="danger"' in form and "rolled back" in form


def test_a_waiting_session_shows_since_when_and_why():
    page_states.waiting("+15550111", reason="asked for a human")
    html = page(personas.client_for(personas.operator()), "+15550111")
    assert 'class="badge mode-waiting">Waiting for a person</span>' in html
    panel = re.search(r'<section class="card takeover".*?</section>', html, re.S).group(0)
    assert "The customer asked for a person: <bdi>asked for a human</bdi>" in panel and "2026-01-10" in panel
    assert "Take over</button>" in panel


def test_the_owner_gets_the_composer_and_the_hand_back_link():
    olga = personas.operator()
    page_states.human("+15550100", olga, note="Refund approved, tell them politely")
    html = page(personas.client_for(olga), "+15550100")
    assert "Operator: olga.operator since" in html
    composer = re.search(r'<form class="card composer".*?</form>', html, re.S).group(0)
    assert '<textarea id="reply-text" name="text"' in composer and "Enter sends, Shift+Enter" in composer
    # Its metadata says whatsapp, but no webhook delivered it: nothing can go out (the arrival decides).
    assert "on whatsapp" not in composer and "no webhook delivered this session's messages" in composer
    assert "Hand back to an agent…</a>" in html
    assert "Refund approved" not in html  # a note of an earlier hand-back is not this takeover's


def test_another_operator_sees_who_answers_and_no_composer():
    page_states.human("+15550100", personas.operator())
    html = page(personas.client_for(personas.operator("otto.operator")), "+15550100")
    assert "olga.operator answers</strong>" in html and "only they can reply" in html
    assert "data-composer" not in html
    assert "Hand back to an agent" not in html  # only the owner may (anyone else would get a 409)


def test_a_viewer_sees_the_mode_but_no_takeover_form():
    page_states.human("+15550100", personas.operator())
    viewer = personas.client_for(personas.viewer())
    html = page(viewer, "+15550100")
    assert "Operator: olga.operator" in html
    assert "takeover-form" not in html and "data-composer" not in html and "Hand back to an agent" not in html
    assert viewer.get("/actions/handback-confirm/+15550100/").status_code == 403


def test_operator_messages_show_their_author_and_delivery_with_resend_when_failed():
    olga = personas.operator()
    page_states.human("+15550100", olga)
    page_states.operator_reply("+15550100", olga, "Your refund is on its way", status="sent")
    failed = page_states.operator_reply("+15550100", olga, "Anything else?", status="failed",
                                        error="ProviderError: 503")
    html = page(personas.client_for(olga), "+15550100")
    sent_html, failed_html = re.findall(r'<article class="msg model operator".*?</article>', html, re.S)
    assert '<span class="author">Operator · olga.operator</span>' in sent_html
    assert 'data-delivery="sent">sent</span>' in sent_html and "Resend" not in sent_html
    assert 'data-delivery="failed">failed</span>' in failed_html and "ProviderError: 503" in failed_html
    assert f'id="reply-{failed.pk}"' in failed_html and ">Resend</button>" in failed_html
    # not the agent's answer, and another operator cannot resend it
    other = page(personas.client_for(personas.operator("otto.operator")), "+15550100")
    assert ">Resend</button>" not in other


def test_a_reply_whose_sender_died_is_shown_as_unknown():
    olga = personas.operator()
    page_states.human("+15550100", olga)
    reply = page_states.operator_reply("+15550100", olga, "Hello?", status="sending")
    reply.attempted_at = cv.T0  # long ago: its sender stopped
    reply.save()
    html = page(personas.client_for(olga), "+15550100")
    assert 'data-delivery="unknown">unknown' in html and ">Resend</button>" in html


@pytest.mark.parametrize("htmx", [False, True])
def test_the_hand_back_dialog_defaults_to_the_agent_before_the_takeover(htmx):
    olga = personas.operator()
    page_states.human("+15550100", olga)
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = personas.client_for(olga).get("/actions/handback-confirm/+15550100/", **extra)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<option value="Support" selected>Support (before the takeover)</option>' in html
    assert '<textarea id="hb-note" name="note"' in html and "the customer never sees it" in html
    if htmx:
        assert response["HX-Retarget"] == "#dialog" and "<html" not in html
    else:
        assert '<dialog id="action-dialog" aria-label="Session action" open>' in html


def test_a_customers_session_points_to_take_over_instead_of_the_live_chat():
    cv.store("tg:1", [cv.user("hi")], metadata={"channel": "telegram"})
    cv.store("web-9", [cv.user("hi")], metadata={"channel": "web"})
    client = personas.client_for(personas.operator())
    html = page(client, "tg:1")
    assert "Open in live chat" not in html and '<a href="#takeover-panel">Answer this telegram customer' in html
    assert "Open in live chat" in page(client, "web-9")
    chat = client.get("/chat/", {"session": "tg:1"}).content.decode()
    assert "take the session over on its console page" in chat
    assert '<a href="/sessions/tg:1/#takeover-panel">Take over this session</a>' in chat


def test_the_forms_post_to_the_takeover_endpoints_and_the_page_rereads_its_workspace():
    olga = personas.operator()
    page_states.human("+15550100", olga)
    reply = page_states.operator_reply("+15550100", olga, "Hi", status="failed")
    client = personas.client_for(olga)
    html = page(client, "+15550100")
    assert 'hx-post="/actions/reply/+15550100/"' in html and 'data-error-target="#reply-error"' in html
    assert f'action="/actions/reply-resend/{reply.pk}/"' in html
    dialog = client.get("/actions/handback-confirm/+15550100/").content.decode()
    assert 'action="/actions/handback/+15550100/"' in dialog and 'id="handback-error"' in dialog
    panel = client.get("/sessions/+15550100/", {"panel": "1"}, HTTP_HX_REQUEST="true").content.decode()
    assert panel.lstrip().startswith('<div id="session-panel"') and 'id="reply-box"' in panel


def test_a_waiting_session_can_go_back_to_the_bot_without_a_takeover():
    page_states.waiting("+15550111")
    html = page(personas.client_for(personas.operator()), "+15550111")
    assert "Back to the bot…</a>" in html and 'action="/actions/takeover/+15550111/"' in html


def test_the_private_note_is_shown_after_its_hand_back_only():
    from takeover_app import service

    olga = personas.operator()
    client = personas.client_for(olga)
    cv.store("web-3", [cv.user("hi"), cv.model("hello")], metadata={"channel": "web"})
    service.take_over(olga, "web-3")
    service.hand_back(olga, "web-3", note="Refund approved, tell them politely")
    assert "Private note for the agent</span> Refund approved, tell them politely" in page(client, "web-3")

    service.take_over(olga, "web-3")
    assert "Refund approved" not in page(client, "web-3")  # a new takeover
    service.hand_back(olga, "web-3")
    assert "Refund approved" not in page(client, "web-3")  # a hand-back without a note


def test_a_waiting_reason_ends_its_sentence_once():
    page_states.waiting("+15550112", reason="The customer wrote 'real person'.")
    html = page(personas.client_for(personas.operator()), "+15550112")
    line = re.search(r'<p class="mode-line".*?</p>', html, re.S).group(0)
    assert "The customer asked for a person: <bdi>The customer wrote &#x27;real person&#x27;.</bdi>" in line
    assert ".." not in line and "the bot does not answer." in line


def test_the_mode_fact_names_the_operator_once():
    owner = personas.operator("operator")
    page_states.human("+15550100", owner)
    html = page(personas.client_for(owner), "+15550100")
    assert "<dt>Mode</dt><dd>taken over by <bdi>operator</bdi></dd>" in html
    assert "operator operator" not in html


ARABIC = "العميل يريد التحدث مع موظف"


def test_right_to_left_reasons_are_isolated_in_chips_and_the_mode_line():
    page_states.waiting("+15550113", reason=ARABIC)
    cv.store("web-4", [cv.user("hi"), cv.model(None, [cv.call("h1", "transfer_to_billing", reason=ARABIC)]),
                       cv.results(cv.handoff_result("h1", "Support", "الفوترة", reason=ARABIC)), cv.model("ok")],
             metadata={"channel": "web"})
    operator = personas.client_for(personas.operator())
    waiting = page(operator, "+15550113")
    chip = re.search(r'<div class="handoff chip".*?</div>', page(operator, "web-4"), re.S).group(0)
    assert f"<bdi>{ARABIC}</bdi>" in re.search(r'<p class="mode-line".*?</p>', waiting, re.S).group(0)
    assert f" · <bdi>{ARABIC}</bdi>" in chip
