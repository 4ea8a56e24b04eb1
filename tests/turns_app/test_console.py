"""Turn records in the console: the turn header, entries for failed / cancelled / interrupted turns after a
reload, the session header totals, the list columns and the rollback preview and rollback.

Turns run on the site's store (``sessions_app.runtime.site_store``) against a real OpenAI-compatible server on
127.0.0.1; the page is read as an operator sees it (HTML through the test client).
"""

from __future__ import annotations

import asyncio
import json
import re
from decimal import Decimal

import pytest
from django.urls import reverse

from chatflow_agent import Agent, PriceBook, Runner
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from console_app import listing
from sessions_app import actions, runtime
from sessions_app.models import ChatMessage
from tests.chatflow_agent.provider_server import FakeProvider
from tests.chatflow_agent.test_usage import TOOL_CALL, answer, library_cost, order_agent
from tests.sessions_app import personas
from turns_app.models import TurnRecord
from turns_app.templatetags.turns import usd

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def operator():
    user = personas.operator()
    return user, personas.client_for(user)


def site_runner(agent: Agent) -> Runner:
    return Runner(agent, session_store=runtime.site_store(), prices=PriceBook())


def text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def play_two_turns(server: FakeProvider, session_id: str = "s1") -> list:
    server.reply_stream(answer(tool_calls=[TOOL_CALL], prompt=100, output=20))
    server.reply_stream(answer("Order 7 is in transit.", prompt=150, output=12))
    server.reply_stream(answer("You are welcome.", prompt=300, output=5))
    runner = site_runner(order_agent(server))
    asyncio.run(runner.run_async(session_id, "where is order 7?"))
    asyncio.run(runner.run_async(session_id, "thanks"))
    return list(TurnRecord.objects.filter(session_id=session_id).order_by("id"))


def test_each_turn_header_shows_status_duration_tokens_and_cost_and_the_header_the_totals(server, operator):
    _user, client = operator
    first, second = play_two_turns(server)
    cost_1 = (library_cost("gpt-4o-mini", "openai", input_tokens=100, output_tokens=20)
              + library_cost("gpt-4o-mini", "openai", input_tokens=150, output_tokens=12))
    assert first.cost == cost_1

    page = client.get("/sessions/s1/").content.decode()

    headers = re.findall(r'<span class="turn-stats">(.*?)</span>\s*(?:<span class="badge|</summary>)', page, re.S)
    assert len(headers) == 2
    assert "completed" in headers[0] and "282 tokens" in text(headers[0]) and usd(cost_1) in headers[0]
    assert "305 tokens" in text(headers[1]) and usd(second.cost) in headers[1]
    usage = text(re.search(r'<dd id="session-usage">(.*?)</dd>', page, re.S).group(1))
    assert "587 tokens" in usage and usd(cost_1 + second.cost) in usage and "2 recorded turns" in usage


def test_failed_and_cancelled_turns_show_in_the_history_after_reload(operator):
    _user, client = operator

    class Switch(BaseEngine):
        mode = "echo"

        async def generate_turn_async(self, agent, history):
            if self.mode == "boom":
                raise RuntimeError("the model <is> down")
            if self.mode == "stuck":
                await asyncio.sleep(30)
            return EngineTurnResult(text="hello")

    engine = Switch()
    runner = site_runner(Agent(name="Bot", instructions="x", engine=engine))
    asyncio.run(runner.run_async("s1", "hi"))
    engine.mode = "boom"
    with pytest.raises(RuntimeError):
        asyncio.run(runner.run_async("s1", "first <b>try</b>"))
    engine.mode = "stuck"
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(runner.run_async("s1", "second try"), 0.3))
    assert [r.status for r in TurnRecord.objects.filter(session_id="s1").order_by("id")] == [
        "completed", "failed", "cancelled"]

    page = client.get("/sessions/s1/").content.decode()

    entries = re.findall(r'<div class="turn-ended (\w+)"', page)
    assert entries == ["failed", "cancelled"]
    assert "first &lt;b&gt;try&lt;/b&gt;" in page and "second try" in page  # the customer's words, escaped
    assert "RuntimeError: the model &lt;is&gt; down" in page


def test_the_rollback_preview_shows_what_it_discards_and_the_rollback_marks_the_records(server, operator):
    user, client = operator
    first, second = play_two_turns(server)

    preview = client.get(reverse("sessions-preview-rollback", args=["s1"]), {"turn": 1}).content.decode()

    assert "Usage discarded" in preview and "305 tokens" in text(preview) and usd(second.cost) in preview
    plan = actions.plan_rollback("s1", 1)
    actions.rollback(user, "s1", 1, plan.fingerprint)
    statuses = dict(TurnRecord.objects.filter(session_id="s1").values_list("id", "status"))
    assert statuses == {first.id: "completed", second.id: "rolled_back"}
    page = client.get("/sessions/s1/").content.decode()
    assert re.findall(r'<div class="turn-ended (\w+)"', page) == ["rolled_back"]


def test_the_list_shows_tokens_cost_and_last_error_and_sorts_on_them_page_by_page(server, operator):
    _user, client = operator
    first, second = play_two_turns(server, "big")
    server.reply_stream(answer("Hi.", prompt=10, output=1))
    asyncio.run(site_runner(order_agent(server)).run_async("small", "hi"))
    runtime.site_store().get_or_create("none", Agent(name="Support", instructions="x"))  # no recorded turn

    page = client.get("/sessions/").content.decode()

    row = re.search(r'<tr id="row-[^"]*"[^>]*>\s*<td class="sid"><a href="/sessions/big/".*?</tr>', page, re.S).group(0)
    assert "587" in text(row) and usd(first.cost + second.cost) in row
    # A session without a recorded turn has no known total: it comes last either way, never sorted as 0.
    for sort, expected in (("-tokens", ["big", "small", "none"]), ("tokens", ["small", "big", "none"]),
                           ("-cost", ["big", "small", "none"]), ("cost", ["small", "big", "none"])):
        seen, after = [], ""
        while True:
            window = listing.fetch_window(listing.parse_query({"sort": sort, "after": after}), per_page=1)
            seen += [r.session_id for r in window.rows]
            if window.next_cursor is None:
                break
            after = window.next_cursor
        assert seen == expected, sort


def test_the_list_shows_the_last_turns_error_until_a_turn_completes(operator):
    _user, client = operator

    class Flaky(BaseEngine):
        fail = True

        async def generate_turn_async(self, agent, history):
            if self.fail:
                raise RuntimeError("quota exceeded")
            return EngineTurnResult(text="ok")

    engine = Flaky()
    runner = site_runner(Agent(name="Bot", instructions="x", engine=engine))
    runtime.site_store().get_or_create("s1", runner.starting_agent)
    with pytest.raises(RuntimeError):
        asyncio.run(runner.run_async("s1", "hello"))
    assert "RuntimeError: quota exceeded" in client.get("/sessions/").content.decode()
    engine.fail = False
    asyncio.run(runner.run_async("s1", "hello again"))
    assert "quota exceeded" not in client.get("/sessions/").content.decode()


def test_the_transcript_export_and_the_api_carry_each_turns_usage(server, operator):
    _user, client = operator
    first, second = play_two_turns(server)

    transcript = client.get("/api/v1/sessions/s1/transcript", {"format": "json"})
    listed = client.get("/api/v1/sessions").json()["items"]
    one = client.get("/api/v1/sessions/s1").json()

    assert transcript.status_code == 200
    data = json.loads(b"".join(transcript.streaming_content) if transcript.streaming else transcript.content)
    usages = [t["usage"] for t in data["turns"]]
    assert [(u["status"], u["input_tokens"], u["output_tokens"]) for u in usages] == [
        ("completed", 250, 32), ("completed", 300, 5)]
    assert Decimal(usages[0]["cost"]) == first.cost and Decimal(usages[1]["cost"]) == second.cost
    assert [c["finish_reason"] for c in usages[0]["model_calls"]] == ["tool_calls", "stop"]
    assert usages[0]["tool_calls"][0]["name"] == "check_order_status"
    assert data["usage"]["total_tokens"] == 587 and Decimal(data["usage"]["cost"]) == first.cost + second.cost
    for session in (listed[0], one):
        assert session["usage"]["total_tokens"] == 587 and session["usage"]["turns"] == 2
        assert Decimal(session["usage"]["cost"]) == first.cost + second.cost and session["usage"]["cost_known"]


def _forged_cursor(value: object, session_id: str = "a") -> str:
    import base64

    return base64.urlsafe_b64encode(json.dumps([value, session_id]).encode()).decode().rstrip("=")


@pytest.mark.parametrize("sort", ["tokens", "-cost"])
@pytest.mark.parametrize("value", ["abc", "1e999", "NaN"])
def test_a_forged_cursor_on_a_usage_sort_is_refused_with_400_not_a_500(client, sort, value):
    from sessions_app.models import ChatSession
    from tests.sessions_app import personas

    ChatSession.objects.create(session_id="a", active_agent_name="Support", metadata={})
    client.force_login(personas.operator())

    page = client.get("/sessions/", {"sort": sort, "after": _forged_cursor(value)})
    api = client.get("/api/v1/sessions", {"sort": sort.lstrip("-"), "cursor": _forged_cursor(value)})

    assert page.status_code == 400 and "after: " in page.content.decode()  # refused on the page, naming it
    assert api.status_code == 400, api.content
    assert "cursor" in json.dumps(api.json()).lower()


@pytest.mark.parametrize(("stored", "shown"), [
    ("0.0000228000", "$0.0000228"),  # a database NUMERIC keeps its scale's trailing zeros
    ("0.000000012", "$0.000000012"),
    ("0.1234567", "$0.123457"),
    ("12.5", "$12.50"),
    ("0", "$0"),
    (None, "unknown"),
])
def test_a_cost_is_shown_without_the_trailing_zeros_of_its_stored_scale(stored, shown):
    assert usd(None if stored is None else Decimal(stored)) == shown


def test_a_slow_turns_messages_show_when_they_were_written_as_the_export_has_them(operator):
    _user, client = operator

    class Slow(BaseEngine):
        async def generate_turn_async(self, agent, history):
            await asyncio.sleep(1.2)
            return EngineTurnResult(text="found it")

    asyncio.run(site_runner(Agent(name="Bot", instructions="x", engine=Slow())).run_async("s1", "where is it?"))
    exported = client.get("/api/v1/sessions/s1/transcript?format=json")
    assert exported.status_code == 200, exported.content
    written = {m["role"]: m["timestamp"] for m in exported.json()["turns"][0]["messages"]}
    page = client.get("/sessions/s1/").content.decode()
    shown = re.findall(r'<time datetime="([^"]+)" title="[^"]+">\d\d:\d\d:\d\d</time>', page)
    from datetime import datetime

    assert [datetime.fromisoformat(t) for t in shown] == [datetime.fromisoformat(written["user"]),
                                                          datetime.fromisoformat(written["model"])]
    stored = ChatMessage.objects.get(session_id="s1", role="user").created_at
    assert (stored - datetime.fromisoformat(written["user"])).total_seconds() > 1  # not the commit's time


def test_an_override_for_the_configured_model_prices_the_turn_and_the_page_says_which_name_matched(server,
                                                                                                   operator):
    _user, client = operator
    server.reply_stream([{**c, "model": "house-model-2026-01-01"} for c in answer("Hi.", prompt=1000, output=500)])
    runner = Runner(order_agent(server, model="house-model"), session_store=runtime.site_store(),
                    prices=PriceBook({"house-model": {"input": "1", "output": "2"}}))
    asyncio.run(runner.run_async("s1", "hi"))

    record = TurnRecord.objects.get(session_id="s1")
    page = client.get("/sessions/s1/").content.decode()
    block = client.get("/api/v1/sessions/s1/transcript", {"format": "json"}).json()["turns"][0]["usage"]

    assert record.cost == Decimal("0.002")
    [call] = block["model_calls"]
    assert (call["model"], call["price_source"], call["priced_as"]) == ("house-model-2026-01-01", "override",
                                                                         "house-model")
    stats = re.search(r'<span class="turn-stats">(.*?)</span>\s*</summary>', page, re.S).group(1)
    assert "$0.002" in stats and "override price for house-model" in text(stats)
    assert 'title="house-model-2026-01-01: $0.002 from an override for house-model"' in stats
