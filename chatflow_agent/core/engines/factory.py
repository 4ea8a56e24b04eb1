"""Which engine plays an agent's turn (chatflow-agent 0.3.4's resolver, with a safer default rule)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatflow_agent.core.engines._endpoints import is_official_endpoint
from chatflow_agent.core.engines.anthropic import ANTHROPIC_BASE_URL, AnthropicEngine
from chatflow_agent.core.engines.base import BaseEngine
from chatflow_agent.core.engines.gemini import GeminiEngine
from chatflow_agent.core.engines.openai_compatible import PROVIDER_PRESETS, OpenAIEngine

if TYPE_CHECKING:
    from chatflow_agent.core.agent import Agent

__all__ = ["model_vendor", "resolve_engine"]

# Model names that only their own vendor serves (an OpenAI-compatible gateway may serve any of them).
_VENDOR_PREFIXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gemini", ("gemini-",)),
    ("anthropic", ("claude-",)),
    ("openai", ("gpt-", "o1", "o3", "o4", "chatgpt-", "text-embedding-", "dall-e")),
    ("grok", ("grok",)),
)
# Open-weight families: served by many providers; without a Runner engine they go to local Ollama.
_OPEN_WEIGHT_PREFIXES = ("gemma", "llama", "mistral", "qwen", "phi")
# Provider aliases → one vendor name.
_VENDOR_OF_PROVIDER = {"google": "gemini", "claude": "anthropic", "xai": "grok", "gemma": "ollama"}


def model_vendor(model: str | None) -> str | None:
    """The vendor that alone serves ``model`` (``"gpt-4o"`` → ``"openai"``), else ``None``."""
    name = (model or "").lower()
    for vendor, prefixes in _VENDOR_PREFIXES:
        if name.startswith(prefixes):
            return vendor
    return None


def _engine_vendor(engine: BaseEngine) -> str | None:
    """The vendor an engine is bound to; ``None`` for provider-agnostic engines and gateways."""
    if getattr(engine, "is_gateway", False):
        return None
    provider = getattr(engine, "provider", None)
    return _VENDOR_OF_PROVIDER.get(provider, provider) if isinstance(provider, str) else None


def _provider_for_official_base_url(base_url: str) -> str:
    """The preset whose official endpoint is exactly ``base_url``, else ``"openai"``.

    A URL only selects a provider (and so which environment key may be read) when it is that
    provider's official endpoint; any other URL needs an explicit ``api_key``.
    """
    for name, preset in PROVIDER_PRESETS.items():
        if is_official_endpoint(base_url, preset["base_url"]):
            return name
    return "openai"


def _engine_for_vendor(vendor: str, agent: Agent) -> BaseEngine:
    if vendor == "gemini":
        return GeminiEngine(api_key=agent.api_key)
    if vendor == "anthropic":
        return AnthropicEngine(api_key=agent.api_key, base_url=agent.base_url or ANTHROPIC_BASE_URL)
    return OpenAIEngine(api_key=agent.api_key, base_url=agent.base_url, provider=vendor)


def _from_agent_settings(agent: Agent) -> BaseEngine | None:
    provider = (agent.provider or "").lower()
    if provider in ("gemini", "google"):
        return GeminiEngine(api_key=agent.api_key)
    if provider in ("anthropic", "claude"):
        return AnthropicEngine(api_key=agent.api_key, base_url=agent.base_url or ANTHROPIC_BASE_URL)
    if provider in PROVIDER_PRESETS:
        return OpenAIEngine(api_key=agent.api_key, base_url=agent.base_url, provider=provider)
    if agent.base_url:
        return OpenAIEngine(
            api_key=agent.api_key, base_url=agent.base_url, provider=_provider_for_official_base_url(agent.base_url)
        )
    return None


def _from_model_name(agent: Agent) -> BaseEngine:
    vendor = model_vendor(agent.model)
    if vendor is not None:
        return _engine_for_vendor(vendor, agent)
    if (agent.model or "").lower().startswith(_OPEN_WEIGHT_PREFIXES):
        return OpenAIEngine(api_key=agent.api_key, base_url=agent.base_url, provider="ollama")
    return GeminiEngine(api_key=agent.api_key)


def resolve_engine(agent: Agent, default_engine: BaseEngine | None = None) -> BaseEngine:
    """The engine for ``agent``'s next model call.

    Order (0.3.4): ``agent.engine``; ``agent.provider`` (gemini/google, anthropic/claude, or an
    OpenAI-compatible preset); ``agent.base_url`` (OpenAI-compatible); ``default_engine`` (the
    Runner's); the model-name prefix (``gemini-``, ``claude-``, ``gpt-``/``o1``…, ``grok``,
    open-weight names → local Ollama); else ``GeminiEngine``.

    Unlike 0.3.4, a vendor-bound default (``GeminiEngine``, ``OpenAIEngine`` on an official
    endpoint …) is not used for another vendor's model: ``gpt-4o`` under a Gemini default goes
    to ``OpenAIEngine``. Provider-agnostic defaults (``provider = None``: scripted, demo, custom
    engines) and gateways (an OpenAI-compatible engine on a non-official URL) serve every model.
    An unknown ``agent.provider`` without ``base_url`` is ignored, as in 0.3.4.
    """
    if agent.engine is not None:
        engine: BaseEngine = agent.engine
        return engine
    configured = _from_agent_settings(agent)
    if configured is not None:
        return configured
    if default_engine is not None:
        vendor = model_vendor(agent.model)
        engine_vendor = _engine_vendor(default_engine)
        if vendor is None or engine_vendor is None or vendor == engine_vendor:
            return default_engine
        return _engine_for_vendor(vendor, agent)
    return _from_model_name(agent)
