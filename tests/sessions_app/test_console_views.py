"""Console screens: session list (search, filters, sort, keyset pages), session detail (turns, tool pairs,
handoffs, pages of turns), audit log and agents page — each htmx view as a fragment and as a full page."""

from __future__ import annotations

import base64
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from sessions_app import actions
from sessions_app.models import ChatMessage, ChatSession, OperatorAction
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas

pytestmark = pytest.mark.django_db

WEIRD_IDS = ["+15550100", "tg:998877", "a/b", "olá 👋", "x" * 255, "spaces and ?query#hash", "50% off/", "a//b",
             "line1\nline2", "cr\r\nlf\n", "tab\there"]


@pytest.fixture
def op_client():
    return personas.client_for(personas.operator())


def is_fragment(response) -> bool:
    return b"<html" not in response.content and b"<body" not in response.content


def list_ids(response) -> list[str]:
    return re.findall(r'<td class="sid"><a href="[^"]*"[^>]*><span class="id">([^<]*)</span>',
                      response.content.decode())


def many_sessions(n: int, *, same_time: bool = False) -> list[str]:
    ids = [f"s{i:04d}" for i in range(n)]
    ChatSession.objects.bulk_create([
        ChatSession(session_id=sid, active_agent_name="Support", metadata={"channel": "web"},
                    created_at=cv.T0, updated_at=cv.T0 + (timedelta() if same_time else timedelta(seconds=i)))
        for i, sid in enumerate(ids)
    ])
    return ids


# ---- front door and list ---------------------------------------------------------------------
def test_the_front_door_redirects_to_the_session_list(op_client):
    response = op_client.get("/")
    assert response.status_code == 302 and response["Location"] == "/sessions/"


def test_the_list_renders_as_a_full_page_and_as_a_fragment(op_client):
    cv.store("tg:998877", cv.support_story(), metadata={"channel": "telegram"})

    full = op_client.get("/sessions/")
    fragment = op_client.get("/sessions/", HTTP_HX_REQUEST="true")

    assert full.status_code == fragment.status_code == 200
    assert b"<html" in full.content and b'role="search"' in full.content and b'id="session-table"' in full.content
    assert is_fragment(fragment) and fragment.content.lstrip().startswith(b'<div id="session-table"')
    assert b'role="search"' not in fragment.content
    for response in (full, fragment):
        assert list_ids(response) == ["tg:998877"]
        assert "HX-Request" in response["Vary"]
    body = full.content.decode()
    assert "telegram" in body and ">3<" in body  # channel, turns
    assert "Sorry, the invoice service is down." in body  # last message preview


def test_a_history_restore_request_gets_the_full_page(op_client):
    response = op_client.get("/sessions/", HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert b"<html" in response.content


def test_it_searches_session_ids_metadata_values_and_message_text(op_client):
    cv.store("+15550100", [cv.user("hello")], metadata={"profile_name": "Ana Lima"})
    cv.store("tg:1", [cv.user("my parcel is lost")])
    cv.store("web:2", [cv.user("nothing here")])

    def search(q):
        return list_ids(op_client.get("/sessions/", {"q": q}, HTTP_HX_REQUEST="true"))

    assert search("5550") == ["+15550100"]
    assert search("ana lima") == ["+15550100"]
    assert search("PARCEL") == ["tg:1"]
    assert search("nobody") == []


def test_it_filters_by_active_agent_channel_and_updated_range(op_client):
    cv.store("a", [], agent="Billing", metadata={"channel": "whatsapp"}, updated=cv.T0)
    cv.store("b", [], agent="Support", metadata={"channel": "whatsapp"}, updated=cv.T0 + timedelta(days=2))
    cv.store("c", [], agent="Billing", metadata={"channel": "web"}, updated=cv.T0 + timedelta(days=5))

    def ids(**params):
        return sorted(list_ids(op_client.get("/sessions/", params)))

    assert ids(agent="Billing") == ["a", "c"]
    assert ids(channel="whatsapp") == ["a", "b"]
    assert ids(updated_from="2026-01-11", updated_to="2026-01-13") == ["b"]
    assert ids(updated_from="2026-01-12") == ["b", "c"]
    assert ids(agent="Billing", channel="web") == ["c"]
    assert ids(channel="WhatsApp") == ["a", "b"]  # the channel matches case-insensitively


@pytest.mark.parametrize("same_time", [False, True], ids=["distinct-times", "one-timestamp"])
@pytest.mark.parametrize("sort", ["-updated", "updated", "-created"])
def test_keyset_pages_visit_every_session_once_in_order(op_client, sort, same_time):
    ids = many_sessions(120, same_time=same_time)
    seen, url, pages = [], f"/sessions/?sort={sort}", 0
    while url:
        response = op_client.get(url, HTTP_HX_REQUEST="true")
        seen += list_ids(response)
        pages += 1
        match = re.search(r'<a href="([^"]*)"[^>]*>Next page', response.content.decode())
        url = match.group(1).replace("&amp;", "&") if match else None
    assert pages == 3 and sorted(seen) == ids and len(seen) == len(set(seen))
    if sort == "-updated":
        assert seen == sorted(ids, reverse=True)  # by updated then id, both descending
    if sort == "updated":
        assert seen == ids


def test_a_page_costs_the_same_queries_whatever_the_number_of_rows_and_counts_a_bounded_number(op_client):
    cv.store("first", cv.support_story())

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            assert op_client.get("/sessions/", HTTP_HX_REQUEST="true").status_code == 200
        return [q["sql"] for q in ctx.captured_queries]

    small = queries()
    many_sessions(60)
    ChatMessage.objects.bulk_create([ChatMessage(session_id="s0001", role="user", content=f"m{i}",
                                                 message_json=cv.user(f"m{i}").model_dump_json()) for i in range(50)])
    large = queries()
    assert len(small) == len(large)
    session_queries = [q for q in large if 'FROM "chatflow_sessions"' in q]
    assert len(session_queries) == 2
    page, count = sorted(session_queries, key=lambda q: q.lstrip().startswith("SELECT COUNT("))
    assert page.rstrip().endswith(" LIMIT 51")
    # "500+": never a count over every session
    assert count.lstrip().startswith("SELECT COUNT(") and " LIMIT 501" in count


@pytest.mark.parametrize("cursor", [
    "!!not-base64",
    base64.urlsafe_b64encode(b"[" * 1490).decode(),  # nested deeper than the JSON parser goes (RecursionError)
])
@pytest.mark.parametrize("param", ["after", "before"])
def test_a_malformed_cursor_is_refused_with_400_naming_it(op_client, param, cursor):
    many_sessions(3)
    response = op_client.get("/sessions/", {param: cursor})
    assert response.status_code == 400 and list_ids(response) == []
    assert f"{param}: " in response.content.decode() and "Previous and Next page links" in response.content.decode()


def test_the_last_message_preview_is_truncated(op_client):
    cv.store("long", [cv.user("word " * 100)])
    body = op_client.get("/sessions/").content.decode()
    assert "word " * 20 in body and "word " * 30 not in body and "…" in body


# ---- detail ----------------------------------------------------------------------------------
@pytest.mark.parametrize("session_id", WEIRD_IDS)
def test_every_session_id_round_trips_through_its_url(op_client, session_id):
    cv.store(session_id, cv.support_story())
    url = reverse("sessions-show-session", args=[session_id])

    response = op_client.get(url)

    assert response.status_code == 200
    assert response.context["s"].session_id == session_id
    assert url in list_page_links(op_client)


def list_page_links(client) -> str:
    return client.get("/sessions/").content.decode().replace("&amp;", "&")


def test_an_unknown_session_is_404(op_client):
    assert op_client.get("/sessions/nope/").status_code == 404


@pytest.mark.parametrize("url", [
    "/sessions/a%00b/", "/actions/rollback-preview/a%00b/?turn=1", "/actions/delete-confirm/a%00b/",
    "/webhooks/ledger/a%00b/",
])
def test_a_session_id_with_nul_is_404_not_a_500_on_postgresql(op_client, url):
    assert op_client.get(url).status_code == 404


@pytest.mark.parametrize("url", ["/actions/handoff/a%00b/", "/actions/rollback/a%00b/", "/actions/delete/a%00b/"])
def test_an_action_on_a_session_id_with_nul_is_404(op_client, url):
    assert op_client.post(url, {"agent": "Billing", "turn": "1"}).status_code == 404


@pytest.mark.parametrize("url", ["/audit/?session=a%00b", "/audit/?actor=a%00b"])
def test_nul_in_a_filter_is_dropped_not_a_500(op_client, url):
    assert op_client.get(url).status_code == 200


def test_nul_in_the_chat_session_is_refused_with_the_reason_not_a_500(op_client):
    page = op_client.get("/chat/?session=a%00b")
    assert page.status_code == 400  # an id is never cleaned into another one
    assert "This session id holds a control" in page.content.decode()


def test_the_detail_renders_as_a_full_page_and_its_history_as_a_fragment(op_client):
    cv.store("tg:998877", cv.support_story(), metadata={"channel": "telegram", "user": {"id": 7}})

    full = op_client.get("/sessions/tg:998877/")
    fragment = op_client.get("/sessions/tg:998877/?order=oldest", HTTP_HX_REQUEST="true")

    assert b"<html" in full.content and b'id="session-panel"' in full.content and b'id="history"' in full.content
    assert is_fragment(fragment) and fragment.content.lstrip().startswith(b'<section id="history"')
    body = full.content.decode()
    facts = ("telegram", "Support", "<dt>Turns</dt><dd>3</dd>", "<dt>Messages</dt><dd>15</dd>", "&quot;id&quot;: 7")
    for fact in facts:
        assert fact in body


def test_the_history_is_grouped_by_turn_with_tool_calls_paired_and_problems_flagged(op_client):
    story = cv.support_story() + [
        cv.user("Check order 7"),
        cv.model(None, [cv.call("c9", "check_order_status", order_id="7")]),  # never answered
        cv.results(cv.result("zz", "get_invoice", {"ghost": True})),  # answers no call
    ]
    cv.store("s", story)

    body = op_client.get("/sessions/s/?order=oldest").content.decode()

    assert body.index('class="pinned card"') < body.index('id="turn-1"') < body.index('id="turn-2"')
    assert "Be kind." in body[body.index('class="pinned card"'):body.index('id="turn-1"')]
    turn1 = body[body.index('id="turn-1"'):body.index('id="turn-2"')]
    assert turn1.index("check_order_status") < turn1.index("&quot;status&quot;: &quot;shipped&quot;")
    assert turn1.index("&quot;shipped&quot;") < turn1.index("Order 42 has shipped.")
    turn2 = body[body.index('id="turn-2"'):body.index('id="turn-3"')]
    assert "Handoff <strong>Support</strong> → <strong>Billing</strong> · <bdi>refund</bdi>" in turn2
    turn3 = body[body.index('id="turn-3"'):body.index('id="turn-4"')]
    assert '<span class="badge error">error</span>' in turn3 and "backend timeout" in turn3
    turn4 = body[body.index('id="turn-4"'):]
    assert "orphan: no result" in turn4 and "orphan: no matching call" in turn4
    assert "needs attention" in turn4


def test_history_pages_hold_twenty_turns_from_the_newest_or_the_oldest_end_each_read_chronologically(op_client):
    cv.store("long", [m for i in range(1, 46) for m in (cv.user(f"question {i}"), cv.model(f"answer {i}"))])

    def turns(**params):
        response = op_client.get("/sessions/long/", params, HTTP_HX_REQUEST="true")
        return [int(n) for n in re.findall(r'id="turn-(\d+)"', response.content.decode())]

    assert turns() == list(range(26, 46))  # the newest turns, oldest first: the newest at the bottom
    assert turns(page=3) == list(range(1, 6))
    assert turns(order="oldest") == list(range(1, 21))
    assert turns(order="oldest", page=3) == list(range(41, 46))
    assert turns(page=99) == list(range(1, 6))  # clamped to the last page (a link made before a rollback)
    assert turns(order="", page="") == list(range(26, 46))  # empty, as a form sends it: not given


@pytest.mark.parametrize(("params", "message"), [
    ({"page": "abc"}, "page must be a whole number from 1"),
    ({"page": "0"}, "page must be a whole number from 1"),
    ({"page": "-2"}, "page must be a whole number from 1"),
    ({"page": "1.5"}, "page must be a whole number from 1"),
    ({"page": "٣"}, "page must be a whole number from 1"),  # a digit, but not 0-9
    ({"page": "9" * 5000}, "page must be a whole number from 1"),  # more digits than int() reads
    ({"order": "bogus"}, "order must be newest or oldest"),
])
@pytest.mark.parametrize("htmx", [False, True], ids=["page", "htmx"])
def test_a_malformed_history_page_or_order_is_refused_with_400_naming_it(op_client, params, message, htmx, caplog):
    cv.store("long", [m for i in range(1, 46) for m in (cv.user(f"question {i}"), cv.model(f"answer {i}"))])
    extra = {"HTTP_HX_REQUEST": "true"} if htmx else {}

    with caplog.at_level("WARNING", logger="django.request"):
        response = op_client.get("/sessions/long/", params, **extra)

    assert response.status_code == 400
    html = response.content.decode()
    assert message in html and 'id="turn-' not in html
    assert (b"<html" in response.content) is not htmx  # the site's 400 page, or its refusal alone for htmx
    assert ('<a href="/sessions/long/">Open the session at its newest turns</a>' in html) is not htmx  # a way on
    (record,) = [r for r in caplog.records if r.name == "django.request"]
    assert record.exc_info is None  # one line, no traceback


def test_a_ten_thousand_message_session_opens_with_a_bounded_number_of_queries(op_client):
    session = ChatSession.objects.create(session_id="big", active_agent_name="Support")
    rows = []
    for i in range(2500):
        for m in (cv.user(f"q{i}"), cv.model(None, [cv.call(f"c{i}", "check_order_status", order_id=str(i))]),
                  cv.results(cv.result(f"c{i}", "check_order_status", {"ok": i})), cv.model(f"a{i}")):
            rows.append(ChatMessage(session=session, role=m.role.value, content=m.content,
                                    message_json=m.model_dump_json()))
    ChatMessage.objects.bulk_create(rows, batch_size=1000)

    with CaptureQueriesContext(connection) as ctx:
        response = op_client.get("/sessions/big/")

    assert response.status_code == 200
    assert len(re.findall(r'id="turn-(\d+)"', response.content.decode())) == 20
    assert "<dt>Messages</dt><dd>10000</dd>" in response.content.decode()
    # A fixed number, whatever the session's length: the page's own reads, the takeover panel's mode
    # and the turn records' (records of the page's turns, ended turns, the session's totals).
    assert len(ctx.captured_queries) < 24


def test_force_handoffs_show_in_the_timeline_as_operator_events(op_client):
    cv.store("s", cv.support_story())
    op_client.post("/actions/handoff/s/", {"agent": "Tech", "reason": "device problem"})

    body = op_client.get("/sessions/s/").content.decode()

    assert "Force handoff" in body
    assert "<strong>Support</strong> → <strong>Tech</strong> · <bdi>device problem</bdi>" in body
    assert ChatMessage.objects.filter(session_id="s").count() == 15  # no chat message invented


# ---- audit and agents ------------------------------------------------------------------------
def test_the_audit_log_renders_as_a_page_and_a_fragment_and_filters(op_client):
    cv.store("a/b", cv.support_story())
    cv.store("c", cv.support_story())
    op_client.post("/actions/handoff/a/b/", {"agent": "Billing"})
    op_client.post("/actions/rollback/c/", cv.rollback_form("c", 1))

    full = op_client.get("/audit/")
    fragment = op_client.get("/audit/", {"action": "rollback"}, HTTP_HX_REQUEST="true")
    by_session = op_client.get("/audit/", {"session": "a/b"})
    by_actor = op_client.get("/audit/", {"actor": "somebody.else"})

    assert b"<html" in full.content and full.content.count(b"<tr>") == 3
    assert is_fragment(fragment) and fragment.content.count(b"<tr>") == 2 and b"Roll back" in fragment.content
    assert by_session.content.count(b"<tr>") == 2 and b'href="/sessions/a/b/"' in by_session.content
    assert b"No operator actions match." in by_actor.content


def test_the_audit_log_filters_by_every_recorded_action_retry_delivery_included(op_client):
    from webhooks_app.models import InboundDelivery

    cv.store("s", cv.support_story())
    op_client.post("/actions/handoff/s/", {"agent": "Billing"})
    failed = InboundDelivery.objects.create(provider="whatsapp", provider_message_id="wamid.R", claim_key="wa:R",
                                            session_id="s", status="failed", error="ProviderDown", token="t")
    assert op_client.post(f"/webhooks/deliveries/{failed.pk}/retry/").status_code == 302

    full = op_client.get("/audit/", {"action": "retry_delivery"})
    fragment = op_client.get("/audit/", {"action": "retry_delivery"}, HTTP_HX_REQUEST="true")
    unknown = op_client.get("/audit/", {"action": "no_such_action"})

    page = full.content.decode()
    assert full.status_code == fragment.status_code == 200
    assert page.count("<tr>") == fragment.content.count(b"<tr>") == 2  # the header row and the one entry
    assert "<td>Retry delivery</td>" in page and "Force handoff</td>" not in page
    options = re.findall(r'<option value="([^"]*)"( selected)?>', page)
    assert ("retry_delivery", " selected") in options
    assert {"force_handoff", "rollback", "delete", "export"} <= {value for value, _ in options}
    assert b"No operator actions match." in unknown.content


def test_a_bulk_export_entry_names_no_session_link(op_client):
    """The API's bulk export is audited with session id "*": not a session, so no link to /sessions/*/ (a 404)."""
    user = personas.operator("otto.exporter")
    actions.audit(user, "export", "*", {}, {"via": "session", "format": "jsonl", "bulk": True})
    actions.audit(user, "export", "s1", {}, {"via": "session", "format": "md"})

    body = op_client.get("/audit/").content.decode()

    assert 'href="/sessions/*/"' not in body and 'href="/sessions/%2A/"' not in body
    assert 'href="/sessions/s1/"' in body


def test_the_session_detail_links_to_its_audit_entries(op_client):
    cv.store("olá 👋", [cv.user("hi")])
    body = op_client.get(reverse("sessions-show-session", args=["olá 👋"])).content.decode()
    assert 'href="/audit/?session=ol%C3%A1%20%F0%9F%91%8B"' in body


def test_the_agents_page_shows_agents_tools_handoffs_and_the_graph(op_client):
    body = op_client.get("/agents/").content.decode()

    for name in ("Support", "Billing", "Tech", "check_order_status", "refund_order", "diagnose_device",
                 "transfer_to_billing", "&quot;order_id&quot;"):
        assert name in body
    assert "<svg" in body and body.count('<g class="node') == 3
    assert body.count('<line class="edge"') == 4  # Support↔Billing, Support↔Tech
    assert "starting agent" in body


def test_the_site_store_is_one_per_process():
    assert actions.site_store() is actions.site_store()


@pytest.mark.parametrize("method, url", [
    ("get", "/sessions/gone/"), ("get", "/actions/rollback-preview/gone/?turn=1"),
    ("get", "/actions/delete-confirm/gone/"), ("post", "/actions/handoff/gone/"),
    ("post", "/actions/rollback/gone/"), ("post", "/actions/delete/gone/"),
])
def test_a_missing_session_is_a_404_message_as_a_fragment_or_a_page_never_djangos_404_page(op_client, settings,
                                                                                           method, url):
    settings.DEBUG = True  # the technical 404 page would show here
    fragment = getattr(op_client, method)(url, HTTP_HX_REQUEST="true")
    full = getattr(op_client, method)(url)

    assert fragment.status_code == full.status_code == 404
    assert fragment["HX-Retarget"] == "#dialog" and fragment["HX-Reselect"] == "unset"
    assert b'id="session-gone"' in fragment.content and b"<html" not in fragment.content
    assert b"Session not found" in full.content and b"URLconf" not in full.content


def test_a_missing_session_says_whether_it_was_deleted_by_whom_or_never_existed(op_client):
    cv.store("s", cv.support_story())
    actions.delete_session(personas.operator("dora.deleter"), "s")

    deleted = op_client.get("/sessions/s/").content.decode()
    unknown = op_client.get("/sessions/never/", HTTP_HX_REQUEST="true").content.decode()

    assert "It was deleted by dora.deleter at " in deleted and "never got" not in deleted
    assert "No session ever had this id here" in unknown and "deleted" not in unknown


def test_exports_are_listed_in_the_inspector_not_inside_a_turn(op_client):
    from sessions_app.actions import audit

    cv.store("s", cv.support_story())
    audit(None, OperatorAction.Kind.EXPORT, "s", {}, {"format": "md", "redact": "contacts"})

    body = op_client.get("/sessions/s/").content.decode()

    turns = body[body.index('<div id="turns"'):body.index('id="live-turn"')]
    assert "Export transcript" not in turns
    inspector = body[body.index('<aside id="inspector"'):]
    assert "· md (redacted) ·" in inspector
    for fmt in ("json", "jsonl", "csv", "md"):
        assert f'name="format" value="{fmt}"' in inspector
    assert 'action="/api/v1/sessions/s/transcript"' in inspector and 'name="redact" value="contacts"' in inspector


def test_a_long_message_is_collapsed_with_show_all_and_messages_name_their_agent(op_client):
    cv.store("s", [cv.user("q"), cv.model("z" * 5000)])

    body = op_client.get("/sessions/s/").content.decode()

    assert '<details class="more"><summary>Show all (5000 characters)</summary>' in body
    assert '<span class="author">Support</span>' in body


def test_older_turns_load_above_and_newer_ones_are_linked_below(op_client):
    cv.store("long", [m for i in range(1, 46) for m in (cv.user(f"question {i}"), cv.model(f"answer {i}"))])

    newest = op_client.get("/sessions/long/").content.decode()
    middle = op_client.get("/sessions/long/", {"page": 2}, HTTP_HX_REQUEST="true").content.decode()

    older = newest[newest.index('<div id="turns"'):newest.index('id="turn-26"')]
    assert ('<p class="older" id="older-turns"><a href="/sessions/long/?order=newest&amp;page=2" '
            'hx-get="/sessions/long/?order=newest&amp;page=2" hx-select="#turns &gt; *" hx-target="#older-turns" '
            'hx-swap="outerHTML">Load older turns</a></p>') in older
    assert "Newer turns" not in newest  # the newest page
    assert middle.index('id="older-turns"') < middle.index('id="turn-6"') < middle.index('id="turn-25"')
    assert middle.index('id="turn-25"') < middle.index("Newer turns")


@pytest.mark.parametrize("extra", [{}, {"HTTP_HX_REQUEST": "true"}], ids=["page", "fragment"])
def test_the_session_page_is_never_stored_so_back_loads_it_again(op_client, extra):
    cv.store("s", [cv.user("hi"), cv.model("hello")])
    shown = op_client.get("/sessions/s/", **extra)
    op_client.post("/actions/delete/s/")
    gone = op_client.get("/sessions/s/", **extra)

    assert shown.status_code == 200 and "no-store" in shown["Cache-Control"]
    assert gone.status_code == 404 and "no-store" in gone["Cache-Control"]
