"""A test agent whose engine is driven by the user's text, so separate processes behave alike.

``[slow N]`` sleeps N seconds first; ``[fail]`` raises (a provider outage), ``[down]`` too while the file
CHATFLOW_TEST_DOWN_FILE exists; ``[block]`` waits while
the file named by CHATFLOW_TEST_BLOCK_FILE exists. Every call is appended to CHATFLOW_TEST_ENGINE_LOG
(one line: pid and text) when that is set, so a test counts the turns the engine played.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from chatflow_agent.core.agent import Agent
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
from chatflow_agent.types import Role


class ProviderDown(RuntimeError):
    pass


class ScriptEngine(BaseEngine):
    # Blocking file checks on purpose: tiny, test-only, and the same in every process.
    async def generate_turn_async(self, agent, history):
        text = next((m.content or "" for m in reversed(history) if m.role == Role.USER), "")
        log = os.environ.get("CHATFLOW_TEST_ENGINE_LOG")
        if log:
            with open(log, "a", encoding="utf-8") as f:  # noqa: ASYNC230
                f.write(f"{os.getpid()}\t{text}\n")
        if m := re.search(r"\[slow ([0-9.]+)\]", text):
            await asyncio.sleep(float(m.group(1)))
        if "[block]" in text:
            flag = Path(os.environ["CHATFLOW_TEST_BLOCK_FILE"])
            while flag.exists():  # noqa: ASYNC110, ASYNC240
                await asyncio.sleep(0.05)
        down = os.environ.get("CHATFLOW_TEST_DOWN_FILE")
        if "[down]" in text and down and Path(down).exists():  # noqa: ASYNC240
            raise ProviderDown("the model provider is down (test)")
        if "[fail]" in text:
            raise ProviderDown("the model provider is down (test)")
        if "[long]" in text:
            return EngineTurnResult(text="Ω<b>" + "x" * 5000 + "😀" * 10 + "</b>")
        return EngineTurnResult(text=f"echo: {text}")


def build() -> Agent:
    return Agent(name="Echo", instructions="Echo the user.", model="script", engine=ScriptEngine())
