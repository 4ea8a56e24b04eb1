"""The package's public surface: what it imports, its ``__all__``, and 0.3.4's names and paths."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import chatflow_agent

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("django", "channels", "daphne", "asgiref")

IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import chatflow_agent
names = [m.name for m in pkgutil.walk_packages(chatflow_agent.__path__, "chatflow_agent.")]
for name in names:
    importlib.import_module(name)
forbidden = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
print(json.dumps({"modules": names, "forbidden": forbidden}))
"""


def test_importing_every_module_of_the_package_imports_neither_django_nor_channels() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_EVERYTHING.replace("{forbidden!r}", repr(set(FORBIDDEN)))],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "error", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert {"chatflow_agent.core.runner", "chatflow_agent.core.engines.openai_compatible"} <= set(seen["modules"])
    assert seen["forbidden"] == []


EXPECTED_ALL = [
    "__version__",
    "Agent", "AgentResponse", "Handoff", "Message", "Role", "Runner", "Tool", "tool", "ToolCall", "ToolResult",
    "AnthropicEngine", "BaseEngine", "EngineTurnResult", "GeminiEngine", "OpenAIEngine",
    "BaseSessionContext", "BaseSessionStore", "DEFAULT_DEDUP_TTL_HOURS", "SessionContext", "SessionStore",
    "SQLiteSessionContext", "SQLiteSessionStore",
    "ChatFlowError", "DependencyError", "ToolExecutionError", "AgentHandoffError", "ProviderError",
    "SessionBusyError", "SessionDeletedError", "StoreSchemaError",
    "RunEvent", "TurnStarted", "MessageAppended", "ToolCallStarted", "ToolCallFinished", "HandoffOccurred",
    "TextDelta", "TurnCompleted", "TurnFailed",
    "ModelCallUsage", "TurnUsage", "ModelPrice", "PriceBook",
]


def test_the_public_api_is_exactly_the_expected_list() -> None:
    """Guard: a change to ``chatflow_agent.__all__`` must be made here too, on purpose."""
    assert sorted(chatflow_agent.__all__) == sorted(EXPECTED_ALL)
    assert len(chatflow_agent.__all__) == len(set(chatflow_agent.__all__))


def test_every_name_of_all_resolves() -> None:
    for name in chatflow_agent.__all__:
        assert getattr(chatflow_agent, name) is not None, name
    namespace: dict = {}
    exec("from chatflow_agent import *", namespace)
    assert set(chatflow_agent.__all__) <= set(namespace)


# Public names of chatflow-agent 0.3.4 (PyPI sdist, src/chatflow_agent), module by module: each
# package's ``__all__`` plus the classes, functions and constants each module defines (re-imported
# names, ``logger`` and the channel adapters BaseChannel, ChannelError, CLIChannel, TelegramChannel,
# WhatsAppChannel — replaced by the Django site — left out). Listed by parsing 0.3.4's source.
UPSTREAM_034_NAMES: dict[str, list[str]] = {
    "chatflow_agent": [
        "__version__", "Agent", "AgentResponse", "AnthropicEngine", "BaseEngine", "GeminiEngine", "OpenAIEngine",
        "Handoff", "Message", "Role", "Runner", "BaseSessionContext", "BaseSessionStore", "SessionContext",
        "SessionStore", "SQLiteSessionContext", "SQLiteSessionStore", "Tool", "tool", "ToolCall", "ToolResult",
        "ChatFlowError", "DependencyError", "ToolExecutionError", "AgentHandoffError", "ProviderError",
    ],
    "chatflow_agent.core": [
        "Agent", "EngineTurnResult", "GeminiEngine", "Runner", "SessionContext", "SessionStore", "Tool", "tool",
    ],
    "chatflow_agent.core.agent": ["Agent"],
    "chatflow_agent.core.engine": ["BaseEngine", "EngineTurnResult", "GeminiEngine"],
    "chatflow_agent.core.engines": [
        "AnthropicEngine", "BaseEngine", "EngineTurnResult", "GeminiEngine", "OpenAIEngine", "resolve_engine",
    ],
    "chatflow_agent.core.engines.anthropic": ["ANTHROPIC_BASE_URL", "AnthropicEngine"],
    "chatflow_agent.core.engines.base": ["BaseEngine", "EngineTurnResult"],
    "chatflow_agent.core.engines.factory": ["resolve_engine"],
    "chatflow_agent.core.engines.gemini": ["GeminiEngine"],
    "chatflow_agent.core.engines.openai_compatible": ["OpenAIEngine", "PROVIDER_PRESETS"],
    "chatflow_agent.core.memory": [
        "BaseSessionStore", "DEFAULT_DEDUP_TTL_HOURS", "DEFAULT_DEDUP_TTL_SECONDS", "SessionContext",
        "SessionStore", "SQLiteSessionContext", "SQLiteSessionStore",
    ],
    "chatflow_agent.core.runner": ["Runner"],
    "chatflow_agent.core.tools": ["TYPE_MAP", "Tool", "tool"],
    "chatflow_agent.exceptions": [
        "AgentHandoffError", "ChatFlowError", "DependencyError", "ProviderError", "ToolExecutionError",
    ],
    "chatflow_agent.memory": [
        "BaseSessionContext", "BaseSessionStore", "SessionContext", "SessionStore", "SQLiteSessionContext",
        "SQLiteSessionStore",
    ],
    "chatflow_agent.types": ["AgentResponse", "Handoff", "Message", "Role", "ToolCall", "ToolResult"],
}


@pytest.mark.parametrize("module_name", sorted(UPSTREAM_034_NAMES))
def test_every_public_name_of_0_3_4_exists_at_the_same_import_path(module_name: str) -> None:
    module = importlib.import_module(module_name)
    missing = [name for name in UPSTREAM_034_NAMES[module_name] if not hasattr(module, name)]
    assert missing == []


def test_alias_modules_export_the_same_objects_as_the_real_ones() -> None:
    from chatflow_agent import core, memory
    from chatflow_agent.core import engine, engines
    from chatflow_agent.core import memory as core_memory

    for name in memory.__all__:
        expected = core_memory.SessionContext if name == "BaseSessionContext" else getattr(core_memory, name)
        assert getattr(memory, name) is expected, name
    for name in engine.__all__:
        assert getattr(engine, name) is getattr(engines, name), name
    assert core.Runner is chatflow_agent.Runner and core.tool is chatflow_agent.tool
    assert chatflow_agent.BaseSessionContext is chatflow_agent.SessionContext


def test_the_provider_engines_can_be_built_without_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for engine_class in (chatflow_agent.OpenAIEngine, chatflow_agent.GeminiEngine, chatflow_agent.AnthropicEngine):
        assert isinstance(engine_class(), chatflow_agent.BaseEngine)


def test_the_runtime_passes_strict_type_checking() -> None:
    """mypy --strict over chatflow_agent, configured in pyproject.toml ([tool.mypy])."""
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
         "--cache-dir", str(REPO / ".mypy_cache")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
