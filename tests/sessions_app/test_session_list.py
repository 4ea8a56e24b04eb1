"""The session list's columns and filters: customer name, flags, bounded count, sort headers, the channel
select, refused filter values (400 with the reasons), previous and next pages."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from console_app import listing
from sessions_app.models import ChatSession
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.test_console_views import list_ids, many_sessions
from webhooks_app.models import InboundDelivery

pytestmark = pytest.mark.django_db


@pytest.fixture
def op_client():
    return personas.client_for(personas.operator())


def _links(html: str, text: str) -> list[str]:
    return [u.replace("&amp;", "&") for u in re.findall(rf'<a href="([^"]*)"[^>]*>{re.escape(text)}[ <]', html)]


def test_a_row_shows_the_customer_name_channel_and_a_time_with_its_zone(op_client):
    cv.store("+15550100", [cv.user("hello")], metadata={"channel": "whatsapp", "profile_name": "Ana Lima"})
    cv.store("web-1", [cv.user("hi"), cv.model("Hello!")], metadata={"channel": "web", "display_name": "Bruno"})
    body = op_client.get("/sessions/").content.decode()
    assert '<span class="customer">Ana Lima</span>' in body and '<span class="customer">Bruno</span>' in body
    assert "chan-whatsapp" in body and "chan-web" in body
    assert re.search(r'<time datetime="2026-01-10T09:00:00\+00:00" title="2026-01-10 09:00:00 UTC">', body)
    assert "MODEL" not in body and "Customer:</span> hello" in body


def test_the_result_count_is_bounded(op_client, monkeypatch):
    many_sessions(7)
    assert "7 sessions" in op_client.get("/sessions/").content.decode()
    monkeypatch.setattr(listing, "COUNT_LIMIT", 5)
    monkeypatch.setattr(listing.bounded_count, "__defaults__", (5,))
    assert "5+ sessions" in op_client.get("/sessions/").content.decode()


def test_markers_show_a_running_turn_a_failed_reply_and_a_failed_last_turn(op_client):
    for sid in ("idle", "reply", "turn"):
        cv.store(sid, [cv.user("hi")], metadata={"channel": "telegram"})
    common = {"provider": "telegram", "kind": "text", "token": "t", "answer": "Hello"}
    InboundDelivery.objects.create(provider_message_id="1", claim_key="1", session_id="reply", status="done",
                                   reply_status="failed", **common)
    InboundDelivery.objects.create(provider_message_id="2", claim_key="2", session_id="turn", status="failed", **common)
    html = op_client.get("/sessions/").content.decode()
    rows = dict(re.findall(r'<span class="id">([^<]*)</span>.*?<td class="status">(.*?)</td>', html, re.S))
    assert "idle" in rows["idle"] and "badge" not in rows["idle"]
    assert "reply failed" in rows["reply"] and "last turn failed" not in rows["reply"]
    assert "last turn failed" in rows["turn"]
    # a later delivery that worked clears "last turn failed"
    InboundDelivery.objects.create(provider_message_id="3", claim_key="3", session_id="turn", status="done", **common)
    html = op_client.get("/sessions/").content.decode()
    assert "last turn failed" not in html


def test_sort_headers_sort_and_keep_the_other_filters(op_client):
    cv.store("b", [], agent="Billing", metadata={"channel": "web"}, updated=cv.T0)
    cv.store("a", [], agent="Support", metadata={"channel": "web"}, updated=cv.T0 + timedelta(days=1))
    cv.store("c", [], agent="Billing", metadata={"channel": "telegram"}, updated=cv.T0 + timedelta(days=2))
    html = op_client.get("/sessions/", {"channel": "web"}).content.decode()
    (session_url,) = _links(html, "Session")
    assert "channel=web" in session_url and "sort=session" in session_url
    assert list_ids(op_client.get(session_url)) == ["a", "b"]
    again = _links(op_client.get(session_url).content.decode(), "Session")[0]
    assert "sort=-session" in again and list_ids(op_client.get(again)) == ["b", "a"]
    assert list_ids(op_client.get("/sessions/", {"sort": "agent"})) == ["b", "c", "a"]
    assert 'aria-sort="ascending"' in op_client.get(session_url).content.decode()


def test_the_channel_is_a_select_of_known_channels_matched_case_insensitively(op_client):
    cv.store("t", [], metadata={"channel": "telegram"})
    cv.store("w", [], metadata={"channel": "Web"})
    response = op_client.get("/sessions/", {"channel": "Telegram"})
    assert list_ids(response) == ["t"]
    html = response.content.decode()
    assert '<select id="f-channel" name="channel">' in html
    assert '<option value="telegram" selected>' in html and '<option value="whatsapp">' in html
    assert list_ids(op_client.get("/sessions/", {"channel": "web"})) == ["w"]


@pytest.mark.parametrize(("params", "message"), [
    ({"updated_from": "not a date"}, "Updated from: &#x27;not a date&#x27; is not a date"),
    ({"updated_to": "2026-02-30"}, "Updated to: &#x27;2026-02-30&#x27; is not a date"),
    ({"updated_from": "2026-03-01", "updated_to": "2026-02-01"}, "Updated to is before Updated from."),
    ({"sort": "bogus"}, "Unknown sort &#x27;bogus&#x27;"),
    # A page cursor is only ever one of the list's own Previous/Next links: anything else is refused, not read as
    # "the first page" (the same rule as the API's ``cursor``).
    ({"after": "garbage"}, "after: &#x27;garbage&#x27; is not a page cursor of this list"),
    ({"before": "garbage"}, "before: &#x27;garbage&#x27; is not a page cursor of this list"),
    ({"sort": "tokens", "after": listing.encode_cursor("abc", "a")}, "after: "),  # a number sort's cursor
])
def test_an_invalid_filter_is_a_form_error_not_ignored(op_client, params, message):
    cv.store("a", [])
    for extra in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = op_client.get("/sessions/", params, **extra)
        assert response.status_code == 400
        html = response.content.decode()
        assert 'id="filter-errors"' in html and message in html and list_ids(response) == []


def test_previous_and_next_pages_walk_both_ways(op_client):
    ids = many_sessions(120)
    newest_first = sorted(ids, reverse=True)
    first = op_client.get("/sessions/").content.decode()
    assert not _links(first, "‹ Previous page")
    second_url = _links(first, "Next page ›")[0]
    second = op_client.get(second_url)
    assert list_ids(second) == newest_first[50:100]
    third_url = _links(second.content.decode(), "Next page ›")[0]
    third = op_client.get(third_url)
    assert list_ids(third) == newest_first[100:]
    assert not _links(third.content.decode(), "Next page ›")
    back = op_client.get(_links(third.content.decode(), "‹ Previous page")[0])
    assert list_ids(back) == newest_first[50:100]
    back_html = back.content.decode()
    front = op_client.get(_links(back_html, "‹ Previous page")[0])
    assert list_ids(front) == newest_first[:50]
    assert not _links(front.content.decode(), "‹ Previous page")
    assert _links(front.content.decode(), "Next page ›")


def test_the_previous_page_works_for_text_sorts_too(op_client):
    ids = many_sessions(60)
    page2 = op_client.get("/sessions/", {"sort": "session"})
    nxt = _links(page2.content.decode(), "Next page ›")[0]
    assert list_ids(op_client.get(nxt)) == ids[50:]
    prev = _links(op_client.get(nxt).content.decode(), "‹ Previous page")[0]
    assert list_ids(op_client.get(prev)) == ids[:50]


def test_search_as_you_type_is_debounced_and_pushes_the_url(op_client):
    html = op_client.get("/sessions/").content.decode()
    form = re.search(r'<form class="filters[^>]*>', html).group(0)
    assert 'hx-push-url="true"' in form and "keyup changed delay:300ms" in form


def test_the_row_partial_renders_for_live_updates_with_flags(op_client):
    from console_app.fragments import list_row_from_db

    cv.store("+1", [cv.user("hi")], metadata={"channel": "whatsapp", "profile_name": "Ana"})
    (html,) = list_row_from_db("+1", top=False)
    assert '<span class="customer">Ana</span>' in html and "<time" in html
    assert ChatSession.objects.count() == 1
