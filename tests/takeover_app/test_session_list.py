"""The session list's takeover columns: mode and unread badges, the mode filter (bot / waiting / human),
the sort by time waiting (keyset pages both ways), the navigation's badge of waiting sessions, and the
live row and badge fragments."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from console_app import listing
from console_app.templatetags.console_nav import waiting_badge
from takeover_app.models import SessionMode
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.test_console_views import list_ids, many_sessions
from tests.takeover_app import page_states

pytestmark = pytest.mark.django_db


@pytest.fixture
def op_client():
    return personas.client_for(personas.operator())


def _links(html: str, text: str) -> list[str]:
    return [u.replace("&amp;", "&") for u in re.findall(rf'<a href="([^"]*)"[^>]*>{re.escape(text)}[ <]', html)]


def test_rows_show_the_mode_owner_and_unread_count(op_client):
    cv.store("web-1", [cv.user("hi")], metadata={"channel": "web"})
    page_states.waiting("+15550111")
    page_states.human("+15550100", personas.operator("otto.operator"), unread=3)
    html = op_client.get("/sessions/").content.decode()
    rows = dict(re.findall(r'<span class="id">([^<]*)</span>.*?<td class="status">(.*?)</td>', html, re.S))
    assert "idle" in rows["web-1"] and "mode-" not in rows["web-1"]
    assert '<span class="badge mode-waiting">waiting for a person</span>' in rows["+15550111"]
    assert "operator: otto.operator</span>" in rows["+15550100"] and ">3 unread</span>" in rows["+15550100"]
    assert 'data-mode="waiting"' in html and 'data-mode="human"' in html


@pytest.mark.parametrize(("mode", "expected"), [("bot", ["web-1", "back"]), ("waiting", ["+15550111"]),
                                                ("human", ["+15550100"]), ("", None)])
def test_the_mode_filter(op_client, mode, expected):
    cv.store("web-1", [], metadata={"channel": "web"}, updated=cv.T0 + timedelta(days=1))
    page_states.waiting("+15550111")
    page_states.human("+15550100", personas.operator("otto.operator"))
    cv.store("back", [], metadata={"channel": "web"})  # handed back: its row stays, in mode bot
    SessionMode.objects.create(session_id="back", mode="bot", previous_agent="Support")
    response = op_client.get("/sessions/", {"mode": mode})
    assert response.status_code == 200
    ids = list_ids(response)
    assert ids == expected if expected is not None else len(ids) == 4
    assert f'<option value="{mode}" selected>' in response.content.decode() or not mode


def test_an_unknown_mode_is_refused_with_the_reason(op_client):
    for extra in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = op_client.get("/sessions/", {"mode": "asleep"}, **extra)
        assert response.status_code == 400
        assert "Unknown mode &#x27;asleep&#x27;; choose one of bot, waiting, human." in response.content.decode()


def test_sorting_by_time_waiting_puts_the_longest_wait_first_and_the_others_last(op_client):
    page_states.waiting("+1-late", minutes=30)
    page_states.waiting("+1-early", minutes=5)
    cv.store("web-1", [], metadata={"channel": "web"})
    html = op_client.get("/sessions/").content.decode()
    (waiting_url,) = _links(html, "Waiting")
    assert "sort=waiting" in waiting_url
    assert list_ids(op_client.get(waiting_url)) == ["+1-early", "+1-late", "web-1"]
    assert list_ids(op_client.get("/sessions/", {"sort": "-waiting"})) == ["+1-late", "+1-early", "web-1"]


def test_the_waiting_sort_pages_with_keyset_cursors_both_ways(op_client):
    ids = many_sessions(55)
    SessionMode.objects.bulk_create([
        SessionMode(session_id=sid, mode="waiting", waiting_since=cv.T0 + timedelta(seconds=i), since=cv.T0)
        for i, sid in enumerate(ids[:52])])
    first = op_client.get("/sessions/", {"sort": "waiting"})
    assert list_ids(first) == ids[:50]
    nxt = _links(first.content.decode(), "Next page ›")[0]
    second = op_client.get(nxt)
    assert list_ids(second) == ids[50:52] + sorted(ids[52:])  # the not-waiting ones after, by id
    prev = _links(second.content.decode(), "‹ Previous page")[0]
    assert list_ids(op_client.get(prev)) == ids[:50]


def test_the_navigation_counts_the_waiting_sessions(op_client):
    html = op_client.get("/sessions/").content.decode()
    assert '<span id="nav-waiting"></span>' in html
    page_states.waiting("+15550111")
    page_states.waiting("+15550112")
    page_states.human("+15550100", personas.operator("otto.operator"))
    html = op_client.get("/audit/").content.decode()  # on every console page
    assert re.search(r'<a id="nav-waiting" class="badge mode-waiting" href="/sessions/\?mode=waiting&amp;'
                     r'sort=waiting">2 waiting</a>', html)
    assert listing.waiting_count() == 2
    assert waiting_badge(0, oob=True) == '<span id="nav-waiting" hx-swap-oob="true"></span>'


def test_the_notification_opt_in_is_a_button_hidden_until_scripts_check_support(op_client):
    html = op_client.get("/sessions/").content.decode()
    button = re.search(r'<button[^>]*id="notify-optin"[^>]*>[^<]*</button>', html).group(0)
    assert "hidden" in button and 'type="button"' in button


def test_the_live_row_carries_the_mode():
    from console_app.fragments import list_row_from_db

    page_states.waiting("+15550111")
    (html,) = list_row_from_db("+15550111", top=False)
    assert 'data-mode="waiting"' in html and "waiting for a person" in html
