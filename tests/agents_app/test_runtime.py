"""sessions_app.runtime: one site store and one site Runner per process, built from the settings."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest

from chatflow_agent.core.engines import DemoEngine, OpenAIEngine
from chatflow_agent.types import ModelCallUsage
from sessions_app import actions, registry, runtime
from sessions_app.store import DjangoSessionStore


@pytest.fixture(autouse=True)
def fresh_runtime():
    runtime.reset()
    yield
    runtime.reset()


def test_it_builds_one_store_and_one_runner_sharing_it():
    runner = runtime.site_runner()

    assert runtime.site_runner() is runner
    assert isinstance(runtime.site_store(), DjangoSessionStore)
    assert runner.session_store is runtime.site_store()
    assert actions.site_store() is runtime.site_store()  # the console's 409 check uses the Runner's lock
    assert runner.starting_agent is registry.starting_agent()
    assert set(runner.agents) == set(registry.agents())


def test_threads_racing_for_the_runner_get_the_same_one():
    barrier = threading.Barrier(8)
    seen: list[object] = []

    def grab() -> None:
        barrier.wait()
        seen.append(runtime.site_runner())

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(seen) == 8
    assert len({id(r) for r in seen}) == 1
    assert len({id(r.session_store) for r in seen}) == 1


def test_the_store_takes_its_limits_from_the_settings(settings):
    settings.CHATFLOW_MAX_TURNS = 7
    settings.CHATFLOW_DEDUP_TTL_HOURS = 3

    store = runtime.site_store()

    assert store.default_max_turns == 7
    assert store.dedup_ttl_seconds == 3 * 3600


def test_the_store_resolves_agent_names_through_the_registry():
    runtime.site_runner()  # the Runner points the store's resolver at its own table; the registry's stays

    assert runtime.site_store()._agent_resolver("Billing") is registry.get_agent("Billing")


def test_the_demo_engine_is_the_default():
    assert isinstance(runtime.site_runner().engine, DemoEngine)


def test_chatflow_engine_openai_uses_the_openai_engine_with_the_configured_endpoint(settings):
    settings.CHATFLOW_ENGINE = "openai"
    settings.OPENAI_API_KEY = "sk-test-not-real"
    settings.OPENAI_BASE_URL = "http://127.0.0.1:9/v1"

    engine = runtime.site_runner().engine

    assert isinstance(engine, OpenAIEngine)
    assert engine.base_url == "http://127.0.0.1:9/v1"


def test_chatflow_engine_openai_without_a_base_url_uses_openais_endpoint(settings):
    settings.CHATFLOW_ENGINE = "openai"
    settings.OPENAI_API_KEY = "sk-test-not-real"
    settings.OPENAI_BASE_URL = ""

    engine = runtime.site_runner().engine

    assert isinstance(engine, OpenAIEngine)
    assert engine.base_url == "https://api.openai.com/v1"


def test_the_site_runner_prices_model_calls_with_the_configured_overrides(settings):
    usage = ModelCallUsage(provider="openai", model="gpt-4o-mini", input_tokens=1000, output_tokens=500)
    library = runtime.site_runner().prices.cost(usage)

    settings.CHATFLOW_MODEL_PRICES = {"gpt-4o-mini": {"input": "1", "output": "2"}}

    assert runtime.site_runner().prices.cost(usage) == Decimal("0.002") != library
    assert runtime.site_runner().prices.cost(usage.model_copy(update={"model": "unknown-model"})) is None


def test_a_settings_change_builds_a_new_store_and_runner(settings):
    before = runtime.site_runner()
    old_store = runtime.site_store()

    settings.CHATFLOW_MAX_TURNS = 5

    assert runtime.site_runner() is not before
    assert runtime.site_store() is not old_store
    assert runtime.site_runner().session_store is runtime.site_store()


def test_runner_hooks_apply_to_the_current_runner_and_to_rebuilt_ones(settings):
    seen: list[object] = []

    def hook(runner):
        seen.append(runner)

    first = runtime.site_runner()
    try:
        runtime.add_runner_hook(hook)
        runtime.add_runner_hook(hook)  # once only
        settings.CHATFLOW_MAX_TURNS = 9
        second = runtime.site_runner()
    finally:
        runtime.runner_hooks.remove(hook)

    assert seen == [first, second]


@pytest.mark.django_db(transaction=True)
def test_subscribers_get_the_run_events_of_site_turns():
    events: list[str] = []
    subscriber = runtime.subscribe(lambda event: events.append(event.type))
    try:
        answer = runtime.site_runner().run("web-hooks-1", "Where is order A-1001?")
    finally:
        runtime.runner_hooks[:] = [h for h in runtime.runner_hooks if getattr(h, "subscriber", None) is not subscriber]

    assert "check_order_status" in answer.tool_calls_executed
    assert events[0] == "turn_started"
    assert "tool_call_started" in events and "tool_call_finished" in events
    assert events[-1] == "turn_completed"
    assert actions.session_counts("web-hooks-1") == {"messages": 4, "turns": 1}
