"""Token counts and costs nobody reported stay unknown everywhere: the turn record, the session's totals, the
session page, the list (shown and sorted last), the API, the exports and ``/metrics`` — never 0, never "$0".

Turns run on the site's store against a real OpenAI-compatible server on 127.0.0.1 that can leave the usage
out, as servers that ignore ``stream_options.include_usage`` do.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chatflow_agent import Agent
from chatflow_agent.core.engines.base import BaseEngine
from console_app import listing
from sessions_app import runtime
from tests.chatflow_agent.test_usage import answer, order_agent
from tests.turns_app.test_console import site_runner, text
from turns_app.models import SessionTotals, TurnRecord

pytestmark = pytest.mark.django_db(transaction=True)


def mute(server) -> None:
    """The next answer comes without its usage chunk."""
    server.reply_stream(answer("Hi.")[:1])


def metrics(client) -> dict[tuple[str, tuple], float]:
    body = client.get("/metrics").content.decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def sorted_ids(sort: str) -> list[str]:
    return [r.session_id for r in listing.fetch_window(listing.parse_query({"sort": sort})).rows]


def test_a_turn_whose_provider_reports_no_usage_is_unknown_not_zero(server, client):
    from tests.sessions_app import personas

    client.force_login(personas.operator())
    mute(server)
    asyncio.run(site_runner(order_agent(server)).run_async("mute", "hi"))
    server.reply_stream(answer("Hi.", prompt=10, output=1))
    asyncio.run(site_runner(order_agent(server)).run_async("known", "hi"))

    record = TurnRecord.objects.get(session_id="mute")
    assert (record.input_tokens, record.output_tokens, record.total_tokens, record.cost) == (None, None, None, None)
    totals = SessionTotals.objects.get(pk="mute")
    assert (totals.total_tokens, totals.tokens_known, totals.cost, totals.cost_known) == (None, False, None, False)

    page = client.get("/sessions/mute/").content.decode()
    stats = text(re.search(r'<span class="turn-stats">(.*?)</span>\s*</summary>', page, re.S).group(1))
    assert "tokens unknown" in stats and "0 tokens" not in stats and "$0" not in stats
    usage = text(re.search(r'<dd id="session-usage">(.*?)</dd>', page, re.S).group(1))
    assert "tokens unknown" in usage and "price unknown" in usage and "$0" not in usage

    listed = client.get("/sessions/").content.decode()
    row = re.search(r'<tr id="row-[^"]*"[^>]*>\s*<td class="sid"><a href="/sessions/mute/".*?</tr>', listed,
                    re.S).group(0)
    assert re.search(r'<td class="num tokens"><span[^>]*>unknown</span></td>', row), row
    assert sorted_ids("-tokens") == sorted_ids("tokens") == ["known", "mute"]  # last either way, not as 0
    assert sorted_ids("-cost") == sorted_ids("cost") == ["known", "mute"]

    api = client.get("/api/v1/sessions/mute").json()["usage"]
    assert (api["total_tokens"], api["tokens_known"], api["cost"], api["cost_known"]) == (None, False, None, False)
    block = client.get("/api/v1/sessions/mute/transcript", {"format": "json"}).json()["turns"][0]["usage"]
    assert (block["input_tokens"], block["total_tokens"], block["cost"]) == (None, None, None)
    md = b"".join(client.get("/api/v1/sessions/mute/transcript", {"format": "md"}).streaming_content).decode()
    assert "tokens unknown" in md and "price unknown" in md and "0 tokens" not in md and "$0" not in md

    m = metrics(client)
    assert m[("chatflow_tokens_total", (("kind", "input"),))] == 10  # the known turn's only
    assert m[("chatflow_turns_tokens_unknown_total", ())] == 1
    assert m[("chatflow_turns_cost_unknown_total", ())] == 1


def test_a_session_with_some_unknown_turns_reads_at_least_its_known_sum(server, client):
    from tests.sessions_app import personas

    client.force_login(personas.operator())
    runner = site_runner(order_agent(server))
    mute(server)
    asyncio.run(runner.run_async("s1", "hi"))
    server.reply_stream(answer("Hi.", prompt=10, output=1))
    asyncio.run(runner.run_async("s1", "again"))

    totals = SessionTotals.objects.get(pk="s1")
    assert (totals.total_tokens, totals.tokens_known, totals.cost_known) == (11, False, False)
    usage = text(re.search(r'<dd id="session-usage">(.*?)</dd>',
                           client.get("/sessions/s1/").content.decode(), re.S).group(1))
    assert "at least 11 tokens" in usage and "at least $" in usage


def test_failed_and_cancelled_turns_whose_model_call_never_answered_do_not_cost_0(client):
    from tests.sessions_app import personas

    client.force_login(personas.operator())

    class Switch(BaseEngine):
        mode = "boom"

        async def generate_turn_async(self, agent, history):
            if self.mode == "boom":
                raise RuntimeError("the model is down")
            await asyncio.sleep(30)

    engine = Switch()
    runner = site_runner(Agent(name="Bot", instructions="x", engine=engine))
    runtime.site_store().get_or_create("s1", runner.starting_agent)
    with pytest.raises(RuntimeError):
        asyncio.run(runner.run_async("s1", "first try"))
    engine.mode = "stuck"
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(runner.run_async("s1", "second try"), 0.3))

    records = list(TurnRecord.objects.filter(session_id="s1").order_by("id"))
    assert [(r.status, r.total_tokens, r.cost) for r in records] == [("failed", None, None),
                                                                      ("cancelled", None, None)]
    page = client.get("/sessions/s1/").content.decode()
    entries = re.findall(r'<div class="turn-ended \w+".*?</div>', page, re.S)
    assert len(entries) == 2
    for entry in entries:
        assert "tokens unknown" in text(entry) and "$0" not in entry and "0 tokens" not in text(entry)
