"""Turn records: written with the turn's own lease and commit writes, on the site's DjangoSessionStore.

The provider is a real OpenAI-compatible HTTP server on 127.0.0.1 returning ``usage`` (streamed and not);
costs are checked against genai-prices' own calculation, never a hard-coded figure.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from chatflow_agent import Agent, PriceBook, Runner
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.core.engines.scripted import ScriptedEngine
from chatflow_agent.core.reports import TurnReport
from sessions_app.models import ChatMessage
from sessions_app.store import DjangoSessionStore
from tests.chatflow_agent.test_usage import TOOL_CALL, answer, library_cost, order_agent
from turns_app.models import SessionTotals, TurnRecord

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store() -> Iterator[DjangoSessionStore]:
    s = DjangoSessionStore()
    yield s
    s.close()


class Slow(BaseEngine):
    def __init__(self) -> None:
        self.started: asyncio.Event | None = None

    async def generate_turn_async(self, agent, history):
        self.started.set()
        await asyncio.sleep(30)
        return EngineTurnResult(text="never")


def records(session_id: str) -> list[TurnRecord]:
    return list(TurnRecord.objects.filter(session_id=session_id).order_by("id"))


def test_a_completed_turn_records_its_calls_tools_tokens_and_cost(server, store):
    server.reply_stream(answer(tool_calls=[TOOL_CALL], prompt=100, output=20))
    server.reply_stream(answer("Order 7 is in transit.", prompt=150, output=12))
    runner = Runner(order_agent(server), session_store=store, prices=PriceBook())

    asyncio.run(runner.run_async("s1", "where is order 7?", report=TurnReport(source="api", queue_wait_ms=12.5)))

    [record] = records("s1")
    first_user = ChatMessage.objects.filter(session_id="s1", role="user").order_by("id").first()
    expected = (library_cost("gpt-4o-mini", "openai", input_tokens=100, output_tokens=20)
                + library_cost("gpt-4o-mini", "openai", input_tokens=150, output_tokens=12))
    assert record.status == "completed" and record.source == "api" and record.queue_wait_ms == 12.5
    assert record.first_message_id == first_user.id and record.user_text == "where is order 7?"
    assert (record.input_tokens, record.output_tokens) == (250, 32)
    assert record.cost == expected
    assert [(c["model"], c["input_tokens"], c["finish_reason"]) for c in record.calls] == [
        ("gpt-4o-mini", 100, "tool_calls"), ("gpt-4o-mini", 150, "stop")]
    assert [(t["name"], t["outcome"]) for t in record.tools] == [("check_order_status", "ok")]
    assert record.agents == ["Support"] and record.owner.count(":") >= 3
    assert None not in (record.started_at, record.finished_at, record.duration_ms, record.lease_wait_ms)  # recorded
    totals = SessionTotals.objects.get(pk="s1")
    assert (totals.turns, totals.total_tokens, totals.cost, totals.cost_known, totals.last_error) == (
        1, 282, expected, True, "")


def test_an_unpriced_model_leaves_the_cost_unknown_not_zero(server, store):
    server.reply_stream([{**c, "model": "no-such-model-anywhere"} for c in answer("Hi.", prompt=10, output=2)])
    agent = order_agent(server, model="no-such-model-anywhere")
    runner = Runner(agent, session_store=store, prices=PriceBook())

    asyncio.run(runner.run_async("s1", "hello"))

    [record] = records("s1")
    assert record.cost is None and record.input_tokens == 10
    assert SessionTotals.objects.get(pk="s1").cost_known is False


def test_a_failed_turn_leaves_a_failed_record_with_the_customer_message(store):
    down = ScriptedEngine(RuntimeError("the model is down"))
    runner = Runner(Agent(name="Bot", instructions="x", engine=down), session_store=store)

    with pytest.raises(RuntimeError):
        asyncio.run(runner.run_async("s1", "are you there?"))

    [record] = records("s1")
    assert record.status == "failed" and record.first_message_id is None
    assert record.user_text == "are you there?" and record.error == "RuntimeError: the model is down"
    assert SessionTotals.objects.get(pk="s1").last_error == record.error
    assert not ChatMessage.objects.filter(session_id="s1").exists()  # the turn itself was rolled back


def test_a_cancelled_turn_leaves_a_cancelled_record(store):
    engine = Slow()
    runner = Runner(Agent(name="Bot", instructions="x", engine=engine), session_store=store)

    async def cancel_mid_turn() -> None:
        engine.started = asyncio.Event()
        task = asyncio.ensure_future(runner.run_async("s1", "slow one"))
        await engine.started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_mid_turn())

    [record] = records("s1")
    assert record.status == "cancelled" and record.user_text == "slow one"


def test_the_next_turn_marks_a_dead_turns_record_interrupted(store, settings):
    other = DjangoSessionStore(lease_ttl_seconds=0.3)
    report = TurnReport()
    held = other.sync_turn("s1", Agent(name="Bot", instructions="x"), report=report)
    held.__enter__()
    other.close()  # nothing renews the lease any more: as if its process died
    [dead] = records("s1")
    assert dead.status == "running" and dead.owner == report.owner

    time.sleep(0.4)
    runner = Runner(Agent(name="Bot", instructions="x", engine=ScriptedEngine("echo: anyone?")), session_store=store)
    asyncio.run(runner.run_async("s1", "anyone?"))

    first, second = records("s1")
    assert first.status == "interrupted" and "Interrupted" in first.error
    assert second.status == "completed"


def test_deleting_a_session_keeps_its_records_figures_but_not_the_customers_text(store, django_user_model):
    from sessions_app.actions import delete_session

    down = ScriptedEngine(RuntimeError("the model is down"))
    ok = Runner(Agent(name="Bot", instructions="x", engine=down), session_store=store)
    with pytest.raises(RuntimeError):
        asyncio.run(ok.run_async("gone", "my card number is 4242"))
    store.get_or_create("gone", ok.starting_agent)  # the session row the delete removes
    user = django_user_model.objects.create_user("op", password="pw-unused-123")
    [failed] = records("gone")

    entry = delete_session(user, "gone")

    assert records("gone") == []  # a later session of this id shows none of them
    record = TurnRecord.objects.get(pk=failed.pk)
    assert record.status == "failed" and record.user_text == "" and record.error == "RuntimeError: the model is down"
    assert record.session_id == "" and record.owner == failed.owner and record.calls == failed.calls
    assert not SessionTotals.objects.filter(pk="gone").exists()  # a new session of this id starts from nothing
    assert entry.after["turn_records_redacted"] == 1


def test_a_turn_refused_because_its_session_was_deleted_keeps_no_customer_text(store):
    from chatflow_agent.exceptions import SessionDeletedError

    report = TurnReport(source="webhook", user_text="an old message")
    report.ended_by(SessionDeletedError("s1"))

    assert report.status == "cancelled" and report.user_text == "" and report.error.startswith("SessionDeletedError")


class Held(BaseEngine):
    """Answers a message holding "card" once ``release`` is set (``started`` is set when that call began), or is
    cancelled then (``cancelled``); any other message at once."""

    def __init__(self, cancelled: bool) -> None:
        self.started, self.release, self.cancelled = threading.Event(), threading.Event(), cancelled

    async def generate_turn_async(self, agent, history):
        if "card" not in (history[-1].content or ""):
            return EngineTurnResult(text="hi")
        self.started.set()
        await asyncio.to_thread(self.release.wait, 20)
        if self.cancelled:
            raise asyncio.CancelledError
        return EngineTurnResult(text="too late")


@pytest.mark.parametrize("ending", ["answers", "is_cancelled"])
@pytest.mark.parametrize("where", ["this_store", "another_store"])
def test_a_turn_running_during_the_delete_writes_nothing_back_and_no_later_session_shows_its_record(
        store, django_user_model, where, ending):
    from sessions_app import runtime
    from sessions_app.actions import delete_session

    engine = Held(cancelled=ending == "is_cancelled")
    runner = Runner(Agent(name="Bot", instructions="x", engine=engine),
                    session_store=runtime.site_store() if where == "this_store" else store)
    asyncio.run(runner.run_async("s1", "hello"))
    outcome: list[BaseException | None] = []

    def play() -> None:
        from django.db import connections

        try:
            asyncio.run(runner.run_async("s1", "my card is 4111 1111"))
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            outcome.append(err)
        finally:
            connections.close_all()

    thread = threading.Thread(target=play)
    thread.start()
    assert engine.started.wait(20), outcome
    [running] = TurnRecord.objects.filter(session_id="s1", status="running")

    delete_session(django_user_model.objects.create_user("op", password="pw-unused-123"), "s1")
    engine.release.set()
    thread.join(20)
    assert outcome and outcome[0] is not None  # the turn did not commit
    asyncio.run(runner.run_async("s1", "a new conversation"))

    assert [(r.user_text, r.status) for r in records("s1")] == [("a new conversation", "completed")]
    old = TurnRecord.objects.get(pk=running.pk)
    assert (old.session_id, old.user_text, old.status) == ("", "", "cancelled")
    assert not TurnRecord.objects.filter(user_text__contains="4111").exists()
    assert SessionTotals.objects.get(pk="s1").turns == 1  # the new session's turn only
