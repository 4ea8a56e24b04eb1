"""The per-session daily budget: past its turns or tokens of the UTC day, a session's turn makes no model call
and the session waits for a person (trigger ``budget``, audited, on the page, the dashboard and /metrics), or
its customer gets the budget message; the next UTC day it plays again; no limit set reads nothing more."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from sessions_app import runtime
from sessions_app.models import OperatorAction
from sessions_app.roundtrips import Counts, count_connections
from takeover_app import budget, escalations, service
from takeover_app.models import SessionMode
from tests.sessions_app import personas
from tests.takeover_app import agents
from tests.takeover_app.conftest import drain, texts, wa_message

pytestmark = pytest.mark.django_db(transaction=True)

SID = "15550100"


@pytest.fixture
def recording(env, settings):
    settings.CHATFLOW_AGENTS = "tests.takeover_app.agents.build"
    agents.CALLS.clear()
    return agents.CALLS


def say(client, n: int, text: str) -> None:
    wa_message(client, f"wamid.{n}", text)
    drain()


def escalation_entries() -> list[dict]:
    return list(OperatorAction.objects.filter(session_id=SID, action=escalations.ESCALATED)
                .values_list("after", flat=True))


def test_a_session_under_its_limits_plays_normally(client, env, recording, settings):
    settings.CHATFLOW_BUDGET_TURNS_PER_DAY = 3
    settings.CHATFLOW_BUDGET_TOKENS_PER_DAY = 10_000
    for n, text in enumerate(["one", "two", "three"]):
        say(client, n, text)
    assert len(recording) == 3
    assert texts(SID)[-1] == ("model", "answer to three")
    assert service.mode_of(SID).mode == "bot"
    assert escalation_entries() == []


def test_the_turn_past_the_turns_limit_is_held_and_the_session_waits(client, env, recording, settings):
    settings.CHATFLOW_BUDGET_TURNS_PER_DAY = 2
    for n, text in enumerate(["one", "two", "three"]):
        say(client, n, text)
    assert len(recording) == 2  # the third message reached no model
    assert texts(SID)[-2:] == [("user", "three"), ("model", settings.CHATFLOW_HOLDING_MESSAGE)]
    row = SessionMode.objects.get(pk=SID)
    assert (row.mode, row.trigger) == ("waiting", "budget")
    [after] = escalation_entries()
    assert after["trigger"] == "budget"
    assert (after["budget"], after["budget_limit"], after["budget_used"]) == ("turns", "2", "2")
    say(client, 3, "four")  # held for the operator, as any message of a waiting session
    assert len(recording) == 2 and SessionMode.objects.get(pk=SID).unread == 1

    olga = personas.client_for(personas.operator())
    page = olga.get(f"/sessions/{SID}/").content.decode()
    assert "budget reached: 2 turns today (limit 2 turns a day)" in page
    now = timezone.now()
    assert [(c.trigger, c.escalations) for c in escalations.counts(now - timedelta(hours=1), now)] == [("budget", 1)]
    metrics = olga.get("/metrics").content.decode()
    assert 'chatflow_sessions_waiting{trigger="budget"} 1.0' in metrics


def test_the_turn_after_the_tokens_limit_is_crossed_is_held(client, env, settings):
    settings.CHATFLOW_AGENTS = "tests.takeover_app.agents.build_metered"
    agents.CALLS.clear()
    settings.CHATFLOW_BUDGET_TOKENS_PER_DAY = 200  # 150 tokens a turn: the second turn crosses it, and plays
    for n, text in enumerate(["one", "two", "three"]):
        say(client, n, text)
    assert len(agents.CALLS) == 2
    assert texts(SID)[-1] == ("model", settings.CHATFLOW_HOLDING_MESSAGE)
    assert service.mode_of(SID).trigger == "budget"
    [after] = escalation_entries()
    assert (after["budget"], after["budget_limit"], after["budget_used"]) == ("tokens", "200", "300")
    assert budget.usage_today(SID) == budget.Usage(turns=2, tokens=300, cost=Decimal(0))


def test_with_the_polite_answer_the_customer_gets_it_and_no_model_is_called(client, env, recording, settings):
    settings.CHATFLOW_BUDGET_TURNS_PER_DAY = 1
    settings.CHATFLOW_BUDGET_ACTION = "answer"
    settings.CHATFLOW_BUDGET_MESSAGE = "That is all for today, thank you!"
    for n, text in enumerate(["one", "two", "three"]):
        say(client, n, text)
    assert len(recording) == 1
    assert texts(SID)[-4:] == [("user", "two"), ("model", "That is all for today, thank you!"),
                               ("user", "three"), ("model", "That is all for today, thank you!")]
    assert [b["text"]["body"] for b in env.wa.bodies()][-2:] == ["That is all for today, thank you!"] * 2
    assert service.mode_of(SID).mode == "bot"
    assert escalation_entries() == []
    [entry] = OperatorAction.objects.filter(session_id=SID, action=budget.ANSWERED)  # once a day
    assert (entry.after["budget"], entry.after["budget_used"]) == ("turns", "1")
    metrics = personas.client_for(personas.operator()).get("/metrics").content.decode()
    assert "chatflow_budget_answered_sessions_today 1.0" in metrics


def test_the_next_utc_day_the_session_plays_again(client, env, recording, settings, monkeypatch):
    settings.CHATFLOW_BUDGET_TURNS_PER_DAY = 1
    say(client, 0, "one")
    say(client, 1, "two")
    assert service.mode_of(SID).mode == "waiting"
    olga = personas.operator()
    service.take_over(olga, SID)
    service.hand_back(olga, SID, held="answered")
    say(client, 2, "still today")  # the same day: past the budget still
    assert service.mode_of(SID).mode == "waiting" and len(recording) == 1

    tomorrow = budget.day_start() + timedelta(days=1, hours=1)
    monkeypatch.setattr(budget, "clock", lambda: tomorrow)
    service.take_over(olga, SID)
    service.hand_back(olga, SID, held="answered")
    say(client, 3, "tomorrow")
    assert len(recording) == 2
    assert texts(SID)[-1] == ("model", "answer to tomorrow")
    assert service.mode_of(SID).mode == "bot"


def _selects_of_a_second_turn(session_id: str, counts: Counts) -> int:
    runner = runtime.site_runner()
    asyncio.run(runner.run_async(session_id, "first"))
    counts.reset()
    asyncio.run(runner.run_async(session_id, "second"))
    return counts.statements["SELECT"]


def test_no_limit_set_reads_nothing_more_per_turn(env, recording, settings):
    counts = Counts()
    stop = count_connections(counts)
    try:
        runtime.reset()
        unlimited = _selects_of_a_second_turn("a", counts)
        settings.CHATFLOW_BUDGET_COST_PER_DAY = Decimal("5")
        limited = _selects_of_a_second_turn("b", counts)
    finally:
        stop()
    assert limited == unlimited + 1  # the budget's one read; none without a limit
    assert len(recording) == 4
