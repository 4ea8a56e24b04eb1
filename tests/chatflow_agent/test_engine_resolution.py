"""resolve_engine: which engine plays an agent's turn, and the optional SDK engines' failure modes."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

from chatflow_agent.core import engine as engine_alias
from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engines import (
    AnthropicEngine,
    BaseEngine,
    DemoEngine,
    EngineTurnResult,
    GeminiEngine,
    OpenAIEngine,
    ScriptedEngine,
    resolve_engine,
)
from chatflow_agent.core.engines._endpoints import resolve_api_key
from chatflow_agent.exceptions import DependencyError, ProviderError
from chatflow_agent.types import Message, Role

HISTORY = [Message(role=Role.USER, content="hi")]


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a missing parent package ("google")
        return False


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.endswith(("_API_KEY", "_BASE_URL")):
            monkeypatch.delenv(name)


def agent(**kwargs: Any) -> Agent:
    return Agent(name="A", instructions="Reply.", **kwargs)


def test_the_agents_own_engine_wins() -> None:
    own = ScriptedEngine()
    assert resolve_engine(agent(engine=own, provider="openai"), default_engine=DemoEngine()) is own


@pytest.mark.parametrize(
    ("kwargs", "kind", "base_url"),
    [
        ({"provider": "gemini"}, GeminiEngine, None),
        ({"provider": "google"}, GeminiEngine, None),
        ({"provider": "anthropic"}, AnthropicEngine, "https://api.anthropic.com/v1"),
        ({"provider": "claude"}, AnthropicEngine, "https://api.anthropic.com/v1"),
        ({"provider": "grok", "model": "grok-2"}, OpenAIEngine, "https://api.x.ai/v1"),
        ({"provider": "deepseek"}, OpenAIEngine, "https://api.deepseek.com/v1"),
        ({"provider": "ollama", "model": "gemma2:9b"}, OpenAIEngine, "http://localhost:11434/v1"),
    ],
)
def test_the_agents_provider_comes_before_the_runner_default(
    kwargs: dict[str, str], kind: type[BaseEngine], base_url: str | None
) -> None:
    engine = resolve_engine(agent(**kwargs), default_engine=DemoEngine())
    assert type(engine) is kind
    if base_url is not None:
        assert engine.base_url == base_url  # type: ignore[attr-defined]


def test_an_official_base_url_selects_its_own_provider() -> None:
    engine = resolve_engine(agent(model="deepseek-chat", base_url="https://api.deepseek.com/v1"))
    assert isinstance(engine, OpenAIEngine) and engine.provider == "deepseek"


def test_a_lookalike_base_url_does_not_select_a_provider() -> None:
    engine = resolve_engine(agent(model="deepseek-chat", base_url="https://api.deepseek.com.evil.example/v1"))
    assert isinstance(engine, OpenAIEngine) and engine.provider == "openai" and engine.is_gateway


@pytest.mark.parametrize("model", ["gpt-4o", "claude-3-5-sonnet", "gemini-2.5-flash", "llama3", "anything"])
@pytest.mark.parametrize("default", [ScriptedEngine(), DemoEngine()], ids=["scripted", "demo"])
def test_a_provider_agnostic_default_serves_every_model(model: str, default: BaseEngine) -> None:
    assert resolve_engine(agent(model=model), default_engine=default) is default


def test_a_custom_engine_default_serves_every_model() -> None:
    class Custom(BaseEngine):
        async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
            return EngineTurnResult(text="x")

    default = Custom()
    assert resolve_engine(agent(model="gpt-4o"), default_engine=default) is default


@pytest.mark.parametrize(
    ("default", "model", "kind", "provider"),
    [
        (GeminiEngine(), "gpt-4o", OpenAIEngine, "openai"),
        (GeminiEngine(), "claude-3-5-sonnet", AnthropicEngine, "anthropic"),
        (GeminiEngine(), "grok-2", OpenAIEngine, "grok"),
        (OpenAIEngine(), "gemini-2.5-flash", GeminiEngine, "gemini"),
        (AnthropicEngine(), "o3-mini", OpenAIEngine, "openai"),
    ],
)
def test_a_vendor_default_does_not_receive_another_vendors_model(
    default: BaseEngine, model: str, kind: type[BaseEngine], provider: str
) -> None:
    engine = resolve_engine(agent(model=model, api_key="sk-FAKE-agent"), default_engine=default)
    assert type(engine) is kind
    assert engine.provider == provider
    assert engine.api_key == "sk-FAKE-agent"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("default", "model"),
    [
        (GeminiEngine(), "gemini-2.5-flash"),
        (OpenAIEngine(provider="xai"), "grok-2"),
        (OpenAIEngine(provider="groq"), "llama-3.3-70b-versatile"),  # open-weight names go anywhere
        (OpenAIEngine(base_url="http://127.0.0.1:8000/v1"), "claude-3-5-sonnet"),  # a gateway serves any model
    ],
)
def test_a_vendor_default_serves_its_own_and_open_models(default: BaseEngine, model: str) -> None:
    assert resolve_engine(agent(model=model), default_engine=default) is default


@pytest.mark.parametrize(
    ("model", "kind", "provider"),
    [
        ("gpt-4o", OpenAIEngine, "openai"),
        ("claude-3-5-sonnet", AnthropicEngine, "anthropic"),
        ("gemini-2.5-flash", GeminiEngine, "gemini"),
        ("grok-2", OpenAIEngine, "grok"),
        ("gemma2:9b", OpenAIEngine, "ollama"),
        ("something-else", GeminiEngine, "gemini"),
    ],
)
def test_without_a_default_the_model_name_decides(model: str, kind: type[BaseEngine], provider: str) -> None:
    engine = resolve_engine(agent(model=model))
    assert type(engine) is kind and engine.provider == provider


def test_the_0_3_4_alias_module_reexports_the_engine_names() -> None:
    assert engine_alias.BaseEngine is BaseEngine
    assert engine_alias.EngineTurnResult is EngineTurnResult
    assert engine_alias.GeminiEngine is GeminiEngine


# --- The optional SDK engines construct without SDK or key and fail clearly at the first call.


def test_a_gemini_subclass_constructs_without_arguments_as_in_0_3_4_tests() -> None:
    class MockGemini(GeminiEngine):
        def __init__(self) -> None:
            super().__init__()

        async def generate_turn_async(self, agent: Agent, history: list[Message]) -> EngineTurnResult:
            return EngineTurnResult(text="mocked")

    assert MockGemini().provider == "gemini"


@pytest.mark.asyncio
@pytest.mark.skipif(installed("google.genai"), reason="google-genai is installed")
async def test_gemini_without_its_sdk_raises_dependency_error() -> None:
    with pytest.raises(DependencyError, match="google-genai"):
        await GeminiEngine(api_key="k").generate_turn_async(agent(), HISTORY)


@pytest.mark.asyncio
@pytest.mark.skipif(installed("anthropic"), reason="anthropic is installed")
async def test_anthropic_without_its_sdk_raises_dependency_error() -> None:
    with pytest.raises(DependencyError, match="anthropic"):
        await AnthropicEngine(api_key="k").generate_turn_async(agent(), HISTORY)


@pytest.mark.asyncio
@pytest.mark.skipif(not installed("google.genai"), reason="google-genai is not installed")
async def test_gemini_without_a_key_raises_provider_error() -> None:
    with pytest.raises(ProviderError, match="GEMINI_API_KEY"):
        await GeminiEngine().generate_turn_async(agent(), HISTORY)


@pytest.mark.asyncio
@pytest.mark.skipif(not installed("anthropic"), reason="anthropic is not installed")
async def test_anthropic_without_a_key_raises_provider_error() -> None:
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
        await AnthropicEngine().generate_turn_async(agent(), HISTORY)


def test_the_anthropic_key_from_the_environment_goes_to_its_official_endpoint_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-FAKE-anthropic")
    official = "https://api.anthropic.com/v1"

    def key_for(url: str, api_key: str | None = None) -> str:
        return resolve_api_key(api_key, url, official_base_url=official, env_key="ANTHROPIC_API_KEY")

    assert key_for("https://api.anthropic.com/v1/") == "sk-FAKE-anthropic"
    assert key_for("https://proxy.example.com/v1", api_key="sk-FAKE-proxy") == "sk-FAKE-proxy"
    for lookalike in (
        "http://api.anthropic.com/v1",
        "https://api.anthropic.com.evil.example/v1",
        "https://user:pw@api.anthropic.com/v1",
        "https://api.anthropic.com/v1?x=1",
    ):
        with pytest.raises(ProviderError, match="custom or unofficial base_url") as exc_info:
            key_for(lookalike)
        assert "sk-FAKE" not in str(exc_info.value) and "pw@" not in str(exc_info.value)
    assert not AnthropicEngine().is_gateway
    assert AnthropicEngine(base_url="https://proxy.example.com/v1").is_gateway
