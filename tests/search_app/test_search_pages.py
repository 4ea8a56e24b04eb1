"""The search through its public doors: the session list (hits with snippet, turn and a link to the turn), the
REST API's ``q`` (same sessions, with snippets, in the OpenAPI document), the syntax, and hostile queries."""

from __future__ import annotations

import html
import re
from urllib.parse import quote

import pytest
from django.test import Client

from search_app import search
from search_app.query import parse
from search_app.search import snippet
from tests.sessions_app import conversations as cv
from tests.sessions_app import personas
from tests.sessions_app.test_export_api import bearer_for

pytestmark = pytest.mark.django_db

HOSTILE = [
    "AND", "OR NOT", "NEAR(refund order)", '"', '""', '"unclosed refund', "*", "refund*", "^refund", "body:refund",
    "-refund", "(", ")", "{body tools}: refund", "\x00", "ref\x00und", "refund " * 1500, "x" * 10240, "🙂",
    "👨‍👩‍👧 refund", "مرحبا بالعالم", "שלום", "\u202erefund", "'; DROP TABLE chatflow_messages; --", "%", "_", "\\",
    "tool:", 'tool:"', "tool:%", "agent:", "channel:%_", "\ud800", "a:b:c", "NOT refund", "refund AND", "::",
]


@pytest.fixture
def op_client():
    return personas.client_for(personas.operator())


def shop_sessions() -> None:
    cv.store("+5511987654321", [cv.user("Quero o reembolso da minha ação, pedido A-77812"),
                                cv.model(calls=[cv.call("c1", "check_order_status", order="A-77812")]),
                                cv.results(cv.result("c1", "check_order_status", {"status": "shipped"})),
                                cv.model("Seu pedido foi enviado."),
                                cv.user("<b>refund</b> please & thanks"), cv.model("Done.")],
             agent="Billing", metadata={"channel": "whatsapp", "profile_name": "João Silva"})
    cv.store("web-7", [cv.user("Where is my parcel?"), cv.model("On its way.")],
             agent="Support", metadata={"channel": "web"})


def listed(client: Client, q: str) -> list[str]:
    response = client.get("/sessions/", {"q": q})
    assert response.status_code == 200
    return [html.unescape(s) for s in re.findall(r'<span class="id">([^<]*)</span>', response.content.decode())]


def test_the_syntax_reads_words_phrases_and_filters():
    query = parse('refund "order status" tool:Check_Order agent:Billing channel:WhatsApp "unclosed')
    assert query.terms == ("refund", "order status", "unclosed")
    assert (query.tools, query.agents, query.channels) == (("check_order",), ("Billing",), ("whatsapp",))
    assert parse("* 🙂 ...").text == () and not parse("* 🙂").searches


def test_words_phrases_tools_agents_channels_and_fragments_find_their_sessions(op_client):
    shop_sessions()
    assert listed(op_client, "reembolso acao") == ["+5511987654321"]  # all words, accents folded
    assert listed(op_client, "reembolso parcel") == []  # each word must match
    assert listed(op_client, '"pedido foi enviado"') == ["+5511987654321"]
    assert listed(op_client, '"enviado foi pedido"') == []
    assert listed(op_client, "tool:check_order_status") == ["+5511987654321"]
    assert listed(op_client, "shipped") == ["+5511987654321"]  # a tool result
    assert listed(op_client, "parcel agent:Support channel:web") == ["web-7"]
    assert listed(op_client, "parcel agent:Billing") == []
    assert listed(op_client, "98765") == ["+5511987654321"]  # a phone-number fragment of the id
    assert listed(op_client, "joao") == ["+5511987654321"]  # a metadata value
    assert listed(op_client, "channel:whatsapp") == ["+5511987654321"]


def test_search_combines_with_the_lists_filters(op_client):
    shop_sessions()
    cv.store("web-8", [cv.user("my parcel is late")], agent="Billing", metadata={"channel": "web"})
    assert sorted(listed(op_client, "parcel")) == ["web-7", "web-8"]
    response = op_client.get("/sessions/", {"q": "parcel", "agent": "Billing"})
    assert "web-8" in response.content.decode() and "web-7" not in response.content.decode()


def test_a_hit_shows_its_snippet_turn_and_links_to_the_turn(op_client):
    shop_sessions()
    body = op_client.get("/sessions/", {"q": "refund"}).content.decode()
    hits = re.search(r'<tr class="search-hits".*?</tr>', body, re.S).group(0)
    assert "&lt;b&gt;<mark>refund</mark>&lt;/b&gt; please &amp; thanks" in hits  # escaped, the mark kept
    link = html.unescape(re.search(r'<a href="([^"]*)" class="hit-turn">Turn 2</a>', hits).group(1))
    assert link.startswith("/sessions/+5511987654321/?order=oldest&page=1&hit=") and link.endswith("#turn-2")
    page = op_client.get(link)
    assert page.status_code == 200
    message_id = re.search(r"hit=(\d+)", link).group(1)
    assert f'data-message-id="{message_id}"' in page.content.decode()


def test_the_snippet_escapes_the_text_and_marks_accent_folded_matches():
    marked = snippet('<script>alert("x")</script> A ação & "co"', ["acao"])
    assert marked == '&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; A <mark>ação</mark> &amp; &quot;co&quot;'
    assert snippet("a " * 300 + "needle", ["needle"]).endswith("<mark>needle</mark>")
    assert "<mark>" not in snippet("<mark>", ["zzz"])


@pytest.mark.parametrize("q", HOSTILE)
def test_a_hostile_query_is_a_page_or_an_empty_list_never_an_error(op_client, q):
    shop_sessions()
    raw = quote(q.encode("utf-8", "surrogatepass"))  # as a browser sends it (a lone surrogate too)
    response = op_client.get(f"/sessions/?q={raw}")
    assert response.status_code == 200
    api = Client().get(f"/api/v1/sessions?q={raw}", **bearer_for(personas.operator("api.caller")))
    assert api.status_code == 200
    assert isinstance(api.json()["items"], list)


def test_the_api_q_has_the_lists_semantics_and_returns_snippets():
    shop_sessions()
    auth = bearer_for(personas.operator())
    items = Client().get("/api/v1/sessions", {"q": "refund"}, **auth).json()["items"]
    assert [i["session_id"] for i in items] == ["+5511987654321"]
    search = items[0]["search"]
    assert search["total"] == 1 and search["hits"][0]["turn"] == 2 and search["hits"][0]["role"] == "user"
    assert "<mark>refund</mark>" in search["hits"][0]["snippet_html"]
    redacted = Client().get("/api/v1/sessions", {"q": "refund", "redact": "contacts"}, **auth).json()["items"]
    assert redacted[0]["search"]["hits"][0]["snippet_html"] is None
    plain = Client().get("/api/v1/sessions", **auth).json()["items"]
    assert all(i["search"] is None for i in plain)
    schema = Client().get("/api/v1/openapi.json", **auth).json()
    assert "tool:check_order_status" in str(schema) and "snippet_html" in str(schema)


def test_a_common_word_is_checked_per_session_with_the_same_results(op_client, monkeypatch):
    shop_sessions()
    monkeypatch.setattr(search, "FEW", 0)  # every part counts as common: the per-session EXISTS path
    assert listed(op_client, "reembolso acao") == ["+5511987654321"]
    assert listed(op_client, "98765") == ["+5511987654321"]
    assert listed(op_client, "parcel agent:Support") == ["web-7"]
    assert listed(op_client, "reembolso parcel") == []
    assert listed(op_client, "🙂") == []


def test_find_in_session_lists_matches_on_every_page_as_a_fragment_and_as_a_page(op_client):
    messages = []
    for n in range(1, 46):  # three pages of 20 turns
        messages += [cv.user(f"turn {n} " + ("<i>needle</i>" if n in (3, 44) else "hay")), cv.model("ok")]
    cv.store("long", messages)
    detail = op_client.get("/sessions/long/").content.decode()
    assert 'action="/find/long/"' in detail and 'id="find-results"' in detail

    fragment = op_client.get("/find/long/", {"q": "needle"}, HTTP_HX_REQUEST="true").content.decode()
    page = op_client.get("/find/long/", {"q": "needle"}).content.decode()

    assert fragment.lstrip().startswith('<div id="find-results"') and "<html" not in fragment
    assert "<html" in page and 'id="find-results"' in page
    for body in (fragment, page):
        assert re.findall(r'class="hit-turn">Turn (\d+)<', body) == ["44", "3"]
        assert "&lt;i&gt;<mark>needle</mark>&lt;/i&gt;" in body
        assert "?order=oldest&amp;page=3&amp;hit=" in body and "?order=oldest&amp;page=1&amp;hit=" in body
    nothing = op_client.get("/find/long/", {"q": "\x00*"}).content.decode()
    assert "No message of this session matches" in nothing
    assert op_client.get("/find/nope/", {"q": "x"}).status_code == 404


@pytest.mark.parametrize("dense", [4, -1000])  # read as one rowid range, or message by message
def test_hits_are_the_same_whichever_way_a_session_is_read(dense, monkeypatch):
    shop_sessions()
    cv.store("web-9", [cv.user("refund one"), cv.model("ok"), cv.user("refund two")])
    monkeypatch.setattr(search, "DENSE", dense)
    found = search.hits(parse("refund"), ["+5511987654321", "web-9", "web-7"], per_session=1)
    assert {sid: (len(h.hits), h.total, h.hits[0].turn) for sid, h in found.items()} == {
        "+5511987654321": (1, 1, 2), "web-9": (1, 2, 2)}
