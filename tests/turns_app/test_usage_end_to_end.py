"""Usage end to end, for each engine against its provider's fake on 127.0.0.1 (OpenAI-compatible, Anthropic,
Gemini): a streamed answer's usage lands in the turn record and shows in the turn header, the session list's
columns and every export format (JSON, JSONL, CSV, Markdown, the bulk JSONL), redacted exports included.

Costs are genai-prices' own calculation for the same tokens (never a hard-coded figure).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import pytest
from genai_prices import Usage, calc_price

from chatflow_agent import Agent
from tests.chatflow_agent import test_engines_anthropic as claude
from tests.chatflow_agent import test_engines_gemini as gemini
from tests.chatflow_agent.provider_server import FakeProvider
from tests.chatflow_agent.test_usage import answer, order_agent
from tests.sessions_app import personas
from tests.turns_app.test_console import site_runner, text
from turns_app.models import TurnRecord
from turns_app.templatetags.turns import usd

pytestmark = pytest.mark.django_db(transaction=True)

SESSION = "+15550100"  # a contact as the session id: redacted exports mask it
QUESTION = "where is order 7? mail me at ann@example.com"
PROMPT, OUTPUT = 120, 8


@dataclass(frozen=True)
class Provider:
    name: str  # the turn record's provider
    price_id: str  # genai-prices' provider id
    model: str
    agent: Callable[[FakeProvider], Agent]
    script: Callable[[FakeProvider], None]  # queues one streamed answer using PROMPT and OUTPUT tokens


def _openai_script(server: FakeProvider) -> None:
    server.reply_stream(answer("Order 7 is in transit.", prompt=PROMPT, output=OUTPUT))


def _anthropic_script(server: FakeProvider) -> None:
    start = {**claude.message("", input_tokens=PROMPT, output_tokens=1), "content": [], "stop_reason": None}
    server.reply_stream([
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "In transit."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": OUTPUT}},
        {"type": "message_stop"},
    ], named_events=True, done=False)


def _gemini_script(server: FakeProvider) -> None:
    server.reply_stream([gemini.response([{"text": "In transit."}], promptTokenCount=PROMPT,
                                         candidatesTokenCount=OUTPUT)], done=False)


PROVIDERS = [
    Provider("openai", "openai", "gpt-4o-mini", order_agent, _openai_script),
    Provider("anthropic", "anthropic", claude.MODEL, claude.agent, _anthropic_script),
    Provider("gemini", "google", gemini.MODEL, gemini.agent, _gemini_script),
]


@pytest.fixture(params=PROVIDERS, ids=[p.name for p in PROVIDERS])
def played(request, server: FakeProvider) -> tuple[Provider, TurnRecord]:
    """One turn of ``SESSION`` played on the provider's engine through the site's store; its record."""
    provider: Provider = request.param
    provider.script(server)
    asyncio.run(site_runner(provider.agent(server)).run_async(SESSION, QUESTION))
    return provider, TurnRecord.objects.get(session_id=SESSION)


@pytest.fixture
def client():
    return personas.client_for(personas.operator())


def body(response) -> str:
    assert response.status_code == 200
    raw = b"".join(response.streaming_content) if response.streaming else response.content
    return raw.decode("utf-8-sig")


def expected_cost(provider: Provider) -> Decimal:
    return Decimal(calc_price(Usage(input_tokens=PROMPT, output_tokens=OUTPUT), provider.model,
                              provider_id=provider.price_id).total_price)


def test_the_turn_record_has_the_providers_tokens_and_cost(played):
    provider, record = played

    assert record.status == "completed"
    assert (record.input_tokens, record.output_tokens, record.total_tokens) == (PROMPT, OUTPUT, PROMPT + OUTPUT)
    assert record.cost == expected_cost(provider) and record.cost > 0
    assert [(c["provider"], c["model"]) for c in record.calls] == [(provider.name, provider.model)]


def test_the_turn_header_and_the_list_column_show_them(played, client):
    provider, record = played
    shown = f"{PROMPT + OUTPUT} tokens"

    page = body(client.get(f"/sessions/{SESSION}/"))
    listing = body(client.get("/sessions/"))

    header = re.search(r'<span class="turn-stats">(.*?)</span>\s*</summary>', page, re.S).group(1)
    assert shown in text(header) and usd(record.cost) in header
    row = re.search(r'<tr id="row-[^"]*"[^>]*>.*?</tr>', listing, re.S).group(0)
    assert str(PROMPT + OUTPUT) in text(row) and usd(record.cost) in row


@pytest.mark.parametrize("redact", ["", "contacts"])
def test_every_export_format_carries_the_turns_usage(played, client, redact):
    _provider, record = played
    cost = str(record.cost.normalize())
    url = f"/api/v1/sessions/{SESSION}/transcript"

    as_json = json.loads(body(client.get(url, {"format": "json", "redact": redact})))
    lines = [json.loads(line) for line in body(client.get(url, {"format": "jsonl", "redact": redact})).splitlines()]
    rows = list(csv.DictReader(io.StringIO(body(client.get(url, {"format": "csv", "redact": redact})))))
    markdown = body(client.get(url, {"format": "md", "redact": redact}))
    bulk = [json.loads(line) for line in body(client.get("/api/v1/export.jsonl", {"redact": redact})).splitlines()]

    for transcript in (as_json, bulk[0]):
        usage = transcript["turns"][0]["usage"]
        assert (usage["status"], usage["input_tokens"], usage["output_tokens"], usage["cost"]) == (
            "completed", PROMPT, OUTPUT, cost)
        assert transcript["usage"]["total_tokens"] == PROMPT + OUTPUT and transcript["usage"]["cost"] == cost
    assert lines[0]["role"] == "user" and lines[0]["usage"]["total_tokens"] == PROMPT + OUTPUT
    assert lines[0]["usage"]["cost"] == cost and all("usage" not in line for line in lines[1:])
    assert {(r["turn_status"], r["turn_input_tokens"], r["turn_output_tokens"], r["turn_cost"]) for r in rows} == {
        ("completed", str(PROMPT), str(OUTPUT), cost)}
    assert "Usage: completed · " in markdown and f"{PROMPT + OUTPUT} tokens ({PROMPT} in, {OUTPUT} out)" in markdown
    assert f"- Usage: {PROMPT + OUTPUT} tokens" in markdown and usd(cost) in markdown
    everything = json.dumps([as_json, lines, rows, bulk]) + markdown
    if redact:
        assert "ann@example.com" not in everything and SESSION not in everything
    else:
        assert "ann@example.com" in everything


def test_the_bulk_export_reads_turn_records_and_totals_once_per_batch_of_sessions():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from console_app import export, listing
    from tests.sessions_app.conversations import model, store, user

    for i in range(5):
        store(f"s{i}", [user(f"hi {i}"), model("yo")])

    with CaptureQueriesContext(connection) as queries:
        lines = b"".join(export.bulk_jsonl(listing.parse_query({}), batch=2)).splitlines()

    assert len(lines) == 5
    for table in ('"chatflow_turn_records"', 'FROM "chatflow_session_totals"'):
        assert sum(table in q["sql"] for q in queries.captured_queries) == 3, table  # 3 batches of sessions


def test_the_streamed_formats_read_turn_records_a_batch_of_turns_at_a_time(server, client, monkeypatch):
    from django.db import connection

    from console_app import export
    from sessions_app.models import ChatSession

    runner = site_runner(order_agent(server))
    for n in range(1, 4):
        server.reply_stream(answer(f"Answer {n}.", prompt=100 * n, output=n))
        asyncio.run(runner.run_async("s1", f"question {n}"))
    monkeypatch.setattr(export, "TURN_BATCH", 2)
    url = "/api/v1/sessions/s1/transcript"

    record_queries = []

    def count(execute, sql, params, many, context):
        if '"chatflow_turn_records"' in sql:
            record_queries.append(sql)
        return execute(sql, params, many, context)

    session = ChatSession.objects.get(pk="s1")
    with connection.execute_wrapper(count):
        lines = [json.loads(line) for line in b"".join(export.transcript_jsonl(session)).splitlines()]
    rows = list(csv.DictReader(io.StringIO(body(client.get(url, {"format": "csv"})))))
    markdown = body(client.get(url, {"format": "md"}))

    assert len(record_queries) == 2  # turns 1-2, then 3
    assert [(line["turn"], line["usage"]["input_tokens"]) for line in lines if "usage" in line] == [
        (1, 100), (2, 200), (3, 300)]
    assert [(r["turn"], r["turn_input_tokens"]) for r in rows] == [
        ("1", "100"), ("1", "100"), ("2", "200"), ("2", "200"), ("3", "300"), ("3", "300")]
    assert re.findall(r"Usage: completed .*?\((\d+) in, \d+ out\)", markdown) == ["100", "200", "300"]
