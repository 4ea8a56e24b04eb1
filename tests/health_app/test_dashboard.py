"""The dashboard: charts drawn from known traffic (turns played through the site's DjangoSessionStore and a
real Runner), each chart's accessible table holding the numbers its SVG draws, reads that write nothing (on a
read-only connection too) and the rollups folded outside them, the queue samples of the workers' heartbeat,
the time range, and who may look."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Iterator
from datetime import UTC, timedelta
from html.parser import HTMLParser

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import DatabaseError, connection
from django.utils import timezone

from chatflow_agent import Agent, PriceBook, Runner
from chatflow_agent.core.engines.base import EngineTurnResult
from chatflow_agent.core.engines.scripted import ScriptedEngine
from chatflow_agent.types import ModelCallUsage, ToolCall
from health_app import charts
from sessions_app.store import DjangoSessionStore
from tests.sessions_app import personas
from tests.webhooks_app import payloads as p
from tests.webhooks_app.test_endpoints import post_generic
from turns_app import rollups
from turns_app.models import TurnRecord, TurnRollup
from turns_app.usage import mark_rolled_back
from webhooks_app import heartbeat
from webhooks_app.models import QueueSample

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/dashboard/"
#: $1 per input token, $2 per output token: costs that read as whole dollars.
PRICES = PriceBook({"clerk-1": {"input": 1_000_000, "output": 2_000_000}}, library=False)


def usage(input_tokens: int, output_tokens: int) -> ModelCallUsage:
    return ModelCallUsage(provider="scripted", model="clerk-1", input_tokens=input_tokens,
                          output_tokens=output_tokens, cached_tokens=0, latency_ms=1.0, finish_reason="stop")


@pytest.fixture
def store() -> Iterator[DjangoSessionStore]:
    s = DjangoSessionStore()
    yield s
    s.close()


def play(store: DjangoSessionStore) -> None:
    """Known traffic: two completed turns on ``s1`` (the first hands off Support → Billing), one on ``s2``,
    and a failed turn on ``s3``: 4 ended turns, 1 failure, $64 of known cost ($1 per input token, $2 per output
    token: 28 + 12 for the handoff turn's two calls, 12 and 12), one handoff."""
    engine = ScriptedEngine(
        EngineTurnResult(tool_calls=[ToolCall(id="h1", name="transfer_to_billing", args={})], usage=usage(20, 4)),
        EngineTurnResult(text="Billing here.", usage=usage(8, 2)),
        EngineTurnResult(text="Anything else?", usage=usage(8, 2)),
        EngineTurnResult(text="Hello.", usage=usage(8, 2)),
        RuntimeError("the model is down"),
    )
    billing = Agent(name="Billing", instructions="Bill.", model="clerk-1", engine=engine)
    support = Agent(name="Support", instructions="Help.", model="clerk-1", engine=engine, handoffs=[billing])
    runner = Runner(support, session_store=store, prices=PRICES)

    async def turns() -> None:
        await runner.run_async("s1", "I need an invoice")
        await runner.run_async("s1", "thanks")
        await runner.run_async("s2", "hi")
        with pytest.raises(RuntimeError):
            await runner.run_async("s3", "hello?")

    asyncio.run(turns())


class Figures(HTMLParser):
    """Per chart (``figure id``): the SVG marks ``(series, label, value)`` and the table rows (cell texts)."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[str, list[tuple[str, str, float]]] = {}
        self.rows: dict[str, list[list[str]]] = {}
        self.chart = ""
        self.cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "figure":
            self.chart = a["id"].removeprefix("chart-")
            self.marks[self.chart], self.rows[self.chart] = [], []
        elif tag in ("rect", "circle") and "data-value" in a and self.chart:
            self.marks[self.chart].append((a.get("data-series", ""), a["data-label"], float(a["data-value"])))
        elif tag == "tr" and self.chart:
            self.rows[self.chart].append([])
        elif tag in ("td", "th") and self.chart:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.rows[self.chart][-1].append("".join(self.cell).strip())
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.cell is not None:
            self.cell.append(data)


def figures(html: str) -> Figures:
    parsed = Figures()
    parsed.feed(html)
    return parsed


def body_rows(parsed: Figures, chart: str) -> list[list[str]]:
    return [row for row in parsed.rows[chart][1:] if row]


@pytest.fixture(autouse=True)
def viewer():
    return personas.viewer()


def dashboard(range_: str = "24h") -> str:
    answer = personas.client_for(User.objects.get(username="victor.viewer")).get(URL, {"range": range_})
    assert answer.status_code == 200
    return answer.content.decode()


def test_the_charts_and_their_tables_show_the_known_traffic(store):
    play(store)
    for record, ms in zip(TurnRecord.objects.filter(status="completed").order_by("id"), (100.0, 200.0, 400.0),
                          strict=True):  # fixed durations: the figures below are about the histogram, not speed
        TurnRecord.objects.filter(pk=record.pk).update(duration_ms=ms)
    html = dashboard()
    parsed = figures(html)
    hour = timezone.now().astimezone(UTC).strftime("%H:00")

    turns = {(s, label): v for s, label, v in parsed.marks["turns"]}
    assert turns == {("Completed", hour): 3.0, ("Failed", hour): 1.0}
    [now_row] = [r for r in body_rows(parsed, "turns") if r[0] == hour]
    assert now_row == [hour, "3", "1", "0", "0", "0", "4"]  # completed, failed, interrupted, cancelled, rolled back
    assert sum(int(r[-1]) for r in body_rows(parsed, "turns")) == 4

    [(_, _, rate)] = parsed.marks["failures"]
    assert rate == 25.0 and [r for r in body_rows(parsed, "failures") if r[0] == hour] == [[hour, "25.0 %", "1", "4"]]

    # The histogram's resolution: a drawn quantile is at most RATIO above the true one, and at least 1 ms.
    drawn = {s: v for s, _, v in parsed.marks["latency"]}
    assert 200.0 <= drawn["p50"] <= 200.0 * rollups.RATIO  # the median of 100, 200, 400 ms
    assert 400.0 <= drawn["p95"] <= 400.0 * rollups.RATIO  # 95th of three: the slowest
    [latency_row] = [r for r in body_rows(parsed, "latency") if r[0] == hour]
    assert latency_row[1] == f"{drawn['p50']:,.0f} ms" and latency_row[3] == "3"

    day = timezone.now().astimezone(UTC).strftime("%b %d")
    assert [v for _, label, v in parsed.marks["cost"] if label == day] == [28 + 12 + 12 + 12.0]
    # The failed turn's call raised: what it used was never reported, so its cost is unknown (not $0).
    assert [day, "$64.00", "1"] in body_rows(parsed, "cost")
    first_hour = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=23)
    touched = 1 if first_hour.date() == timezone.now().astimezone(UTC).date() else 2  # one during the 23:00 hour
    assert len(body_rows(parsed, "cost")) == touched  # the UTC days the last 24 hourly buckets touch
    assert "1 turn without a known cost (a model without a known price, or usage its provider never reported)" in html

    assert parsed.marks["handoffs"] == [("", "Support → Billing", 1.0)]
    assert body_rows(parsed, "handoffs") == [["Support", "Billing", "1"]]
    assert re.search(r'<dd id="fact-turns">4</dd>', html) and '<dd id="fact-failure">25.0 %</dd>' in html


def test_a_read_writes_nothing_and_the_folded_rollups_read_the_same(store):
    play(store)
    before = figures(dashboard())
    assert not TurnRollup.objects.exists() and not TurnRecord.objects.filter(folded=True).exists()  # counted live
    earlier = timezone.now() - timedelta(hours=2)
    TurnRecord.objects.update(started_at=earlier)  # two hours pass
    moved = figures(dashboard())
    assert rollups.fold() == 4 and rollups.fold() == 0  # once: the records are flagged folded
    assert {(r.span, r.status, r.turns) for r in TurnRollup.objects.all()} == {
        (span, status, n) for span in ("hour", "day") for status, n in (("completed", 3), ("failed", 1))}
    after = figures(dashboard())
    hour = earlier.astimezone(UTC).strftime("%H:00")
    assert {(s, label) for s, label, _ in after.marks["turns"]} == {("Completed", hour), ("Failed", hour)}
    assert [r[1:] for r in body_rows(after, "turns") if r[0] == hour] == [["3", "1", "0", "0", "0", "4"]]
    assert body_rows(after, "turns") == body_rows(moved, "turns")
    assert body_rows(after, "handoffs") == body_rows(before, "handoffs")
    assert body_rows(after, "cost") == body_rows(moved, "cost")  # two hours back may be yesterday
    assert [v for s, _, v in after.marks["latency"]] == [v for s, _, v in before.marks["latency"]]


@pytest.fixture
def read_only_database() -> Iterator[None]:
    """The default connection refuses every write from now on (as a read-only replica would)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET default_transaction_read_only = on")
        else:
            cursor.execute("PRAGMA query_only = ON")
    yield
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET default_transaction_read_only = off")
        else:
            cursor.execute("PRAGMA query_only = OFF")


def test_the_page_and_its_poll_work_on_a_read_only_connection(store, request):
    play(store)
    assert rollups.fold(batch=2, batches=1) == 2  # two folded, two counted live
    client = personas.client_for(User.objects.get(username="victor.viewer"))
    request.getfixturevalue("read_only_database")
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        answer = client.get(URL, **headers)
        assert answer.status_code == 200
        assert '<dd id="fact-turns">4</dd>' in answer.content.decode()
    with pytest.raises(DatabaseError):  # the connection really refuses writes
        TurnRecord.objects.update(error="x")


def test_a_rollback_moves_folded_turns_to_rolled_back_and_a_running_record_counts_once_ended(store):
    play(store)
    TurnRecord.objects.update(started_at=timezone.now() - timedelta(hours=1))
    running = TurnRecord.objects.create(session_id="s9", owner="h:1:run:", status="running",
                                        started_at=timezone.now() - timedelta(hours=1))
    rollups.fold()
    first = TurnRecord.objects.filter(session_id="s1").order_by("id").first()
    assert mark_rolled_back("s1", [first.first_message_id]) == 1
    TurnRecord.objects.filter(pk=running.pk).update(status="failed", duration_ms=5.0, finished_at=timezone.now())
    rows = body_rows(figures(dashboard()), "turns")
    assert sum(int(r[1]) for r in rows) == 2 and sum(int(r[5]) for r in rows) == 1  # completed, rolled back
    assert sum(int(r[2]) for r in rows) == 2  # failed: s3's, and s9's once it ended (counted live)
    assert rollups.fold() == 1  # s9's, now it ended
    assert {(r.status, r.turns) for r in TurnRollup.objects.filter(span="hour", turns__gt=0)} == {
        ("completed", 2), ("rolled_back", 1), ("failed", 2)}
    week = body_rows(figures(dashboard("7d")), "turns")  # the day rows moved the same way
    assert [sum(int(r[i]) for r in week) for i in (1, 2, 5)] == [2, 2, 1]


def one_turn_on(store, model: str, prices: PriceBook) -> None:
    """One turn of a scripted agent on ``model`` (5 input, 1 output tokens), priced by ``prices``."""
    runner = Runner(Agent(name="Support", instructions="Help.", model=model,
                          engine=ScriptedEngine(EngineTurnResult(text="Hi.", usage=ModelCallUsage(
                              provider="scripted", model=model, input_tokens=5, output_tokens=1)))),
                    session_store=store, prices=prices)
    asyncio.run(runner.run_async("u1", "hello"))


def test_turns_of_an_unpriced_model_are_counted_apart_never_as_zero_cost(store):
    one_turn_on(store, "mystery-1", PRICES)
    html = dashboard()
    day = timezone.now().astimezone(UTC).strftime("%b %d")
    assert [day, "unknown", "1"] in body_rows(figures(html), "cost")
    assert "1 turn without a known cost (a model without a known price, or usage its provider never reported): " \
        "not counted here" in html
    assert '<dd id="fact-cost">unknown <span class="muted">(1 turn without a known price)</span></dd>' in html
    assert "Known cost</dt><dd id=\"fact-cost\">$" not in html


def test_a_free_model_costs_a_known_zero_and_shows_0_dollars(store):
    one_turn_on(store, "free-1", PriceBook({"free-1": {"input": 0, "output": 0}}, library=False))
    html = dashboard()
    day = timezone.now().astimezone(UTC).strftime("%b %d")
    assert [day, "$0.0000", "0"] in body_rows(figures(html), "cost")
    assert '<dd id="fact-cost">$0.0000</dd>' in html and "unknown" not in html


def test_the_week_and_month_ranges_count_per_day(store):
    play(store)
    TurnRecord.objects.filter(session_id="s2").update(started_at=timezone.now() - timedelta(days=3))
    week = figures(dashboard("7d"))
    assert len(body_rows(week, "turns")) == 7 and sum(int(r[-1]) for r in body_rows(week, "turns")) == 4
    three_days_ago = (timezone.now() - timedelta(days=3)).astimezone(UTC).strftime("%b %d")
    assert [r[-1] for r in body_rows(week, "turns") if r[0] == three_days_ago] == ["1"]
    assert len(body_rows(figures(dashboard("30d")), "cost")) == 30
    day = figures(dashboard("24h"))
    assert sum(int(r[-1]) for r in body_rows(day, "turns")) == 3  # s2's turn is three days old


def test_the_queue_chart_draws_the_heartbeat_samples(client):
    for n in range(3):
        post_generic(client, p.generic(f"q-{n}", f"qm-{n}", "hello"))
    sample = heartbeat.sample_queue(timezone.now())
    assert (sample.queued, sample.running) == (3, 0)
    QueueSample.objects.create(at=timezone.now() - timedelta(hours=3), queued=7, running=2)
    QueueSample.objects.create(at=timezone.now() - timedelta(days=3), queued=99, running=0)  # older than a day
    parsed = figures(dashboard())
    queued = {label: v for s, label, v in parsed.marks["queue"] if s == "Queued (max)"}
    three_ago = (timezone.now() - timedelta(hours=3)).astimezone(UTC).strftime("%H:00")
    now = timezone.now().astimezone(UTC).strftime("%H:00")
    assert queued == {three_ago: 7.0, now: 3.0}
    assert [three_ago, "7", "2"] in body_rows(parsed, "queue") and [now, "3", "0"] in body_rows(parsed, "queue")
    assert all(r[1] == "—" for r in body_rows(parsed, "queue") if r[0] not in (three_ago, now))


def test_a_worker_beat_samples_the_queue_once_a_minute_and_forgets_old_samples():
    QueueSample.objects.create(at=timezone.now() - timedelta(days=5), queued=1, running=0)
    heartbeat.beat("worker:h:1:x", timezone.now(), 0, purge=False)
    assert QueueSample.objects.count() == 1  # an ordinary beat writes no sample
    heartbeat.beat("worker:h:1:x", timezone.now(), 0, purge=True)
    [fresh] = QueueSample.objects.all()
    assert (fresh.queued, fresh.running) == (0, 0)
    heartbeat.beat("worker:h:2:y", timezone.now(), 0, purge=True)  # a second worker's minute, at once
    assert QueueSample.objects.count() == 1  # one sample for the site, not one per worker


def test_the_sweep_folds_the_ended_records(store):
    play(store)
    TurnRecord.objects.update(started_at=timezone.now() - timedelta(hours=1))
    out = io.StringIO()
    call_command("chatflow_sweep", stdout=out)
    assert "4 turn record(s) added to the dashboard's rollups" in out.getvalue()
    assert sum(r.turns for r in TurnRollup.objects.filter(span="hour")) == 4


def test_an_empty_site_shows_the_empty_state():
    html = dashboard()
    assert html.count("Nothing to show in this range yet.") == 7  # every chart, escalations included
    assert '<dd id="fact-turns">0</dd>' in html and "<svg" not in html


def test_a_bad_range_answers_400_with_the_reason_on_the_page(viewer, caplog):
    answer = personas.client_for(viewer).get(URL, {"range": "1y<script>"})
    assert answer.status_code == 400
    html = answer.content.decode()
    assert "Unknown time range &#x27;1y&lt;script&gt;&#x27;: choose one of 24h, 7d, 30d." in html
    assert "<script>" not in html.split("<main>")[1] and 'href="?range=7d"' in html
    [line] = [r for r in caplog.records if r.name == "django.request"]
    assert line.getMessage() == "Bad Request: /dashboard/" and line.exc_info is None  # one line
    fragment = personas.client_for(viewer).get(URL, {"range": "1y"}, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 400 and "<html" not in fragment.content.decode()
    assert fragment.content.decode().startswith('<p class="note alert error" role="alert" id="range-error">Unknown')


def test_anonymous_visitors_go_to_the_login_and_every_console_user_may_look(client):
    answer = client.get(URL)
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/?next=/dashboard/")
    htmx = client.get(URL, HTTP_HX_REQUEST="true")
    assert htmx.status_code == 200 and htmx["HX-Redirect"].startswith("/accounts/login/")
    assert personas.client_for(personas.outsider()).get(URL).status_code == 403
    viewer = personas.client_for(User.objects.get(username="victor.viewer"))
    page = viewer.get(URL).content.decode()
    assert '<a href="/dashboard/" aria-current="page">Dashboard</a>' in page
    fragment = viewer.get(URL, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in fragment and fragment.lstrip().startswith('<div id="dashboard"')
    assert 'hx-trigger="every 30s"' in page and 'aria-current="true">24 h</a>' in page


def test_agent_names_are_escaped_in_the_pictures_and_the_tables():
    TurnRecord.objects.create(session_id="x", owner="h:1:esc:", status="completed", duration_ms=5.0,
                              agents=["<b>Sup</b>", "B&C\"'"], finished_at=timezone.now())
    html = dashboard()
    assert "<b>Sup</b>" not in html and "&lt;b&gt;Sup&lt;/b&gt; → B&amp;C&quot;&#x27;" in html
    assert body_rows(figures(html), "handoffs") == [["<b>Sup</b>", "B&C\"'", "1"]]


class Ticks(HTMLParser):
    """An SVG's tick texts: ``(x, text-anchor, text)``, the y figures (``end``) and the x labels (``middle``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ticks: list[tuple[float, str, str]] = []
        self.open: tuple[float, str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "text" and a.get("class") == "tick":
            self.open = (float(a["x"]), a["text-anchor"])

    def handle_data(self, data: str) -> None:
        if self.open is not None:
            self.ticks.append((*self.open, data))
            self.open = None


def ticks(svg: str) -> tuple[list[tuple[float, str]], list[tuple[float, str]]]:
    parsed = Ticks()
    parsed.feed(svg)
    return ([(x, t) for x, anchor, t in parsed.ticks if anchor == "end"],
            [(x, t) for x, anchor, t in parsed.ticks if anchor == "middle"])


MONTH = [f"Nov {d:02d}" for d in range(3, 31)] + ["Dec 01", "Dec 02"]
DAY = [f"{h:02d}:00" for h in range(24)]


@pytest.mark.parametrize("labels", [MONTH, DAY, MONTH[-7:]], ids=["30d", "24h", "7d"])
@pytest.mark.parametrize("draw", ["lines", "bars"])
def test_tick_texts_fit_the_chart_and_never_overlap_at_the_phone_font(labels, draw):
    values = [7.6 + i % 3 for i in range(len(labels))]  # an axis up to 10 ms: "7.5 ms" is the widest figure
    if draw == "lines":
        svg = charts.lines(labels, [("line-p50", "p50", values)], title="Latency", unit="ms")
    else:
        svg = charts.bars(labels, [("bar-cost", "Cost", values)], title="Cost", unit="$")
    y_ticks, x_ticks = ticks(svg)
    assert len(y_ticks) == 5 and ("7.5 ms" if draw == "lines" else "$7.5") in [t for _, t in y_ticks]
    for x, text in y_ticks:  # right-aligned at x: the whole figure stays inside the picture
        assert x - charts.text_width(text) >= 0, text
    centres = [x for x, _ in x_ticks]
    width = max(charts.text_width(t) for t in labels)
    assert centres[0] - width / 2 >= 0 and centres[-1] + width / 2 <= charts.WIDTH
    assert all(b - a >= width for a, b in zip(centres, centres[1:], strict=False))
    assert x_ticks[-1][1] == labels[-1]  # the newest bucket is always named
    assert len(x_ticks) >= min(len(labels), 5)  # thinned, not dropped
