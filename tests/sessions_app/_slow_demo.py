"""``CHATFLOW_AGENTS=tests.sessions_app._slow_demo.build``: the demo team on a demo engine that first waits
N seconds when the turn's user message says ``[slow N]`` (a model that takes its time, in any process)."""

from __future__ import annotations

import asyncio
import re

from agents_app import demo_team
from chatflow_agent.core.engines import DemoEngine
from chatflow_agent.types import Role


class SlowDemoEngine(DemoEngine):
    async def _think(self, history) -> None:
        last = history[-1] if history else None
        if last is not None and last.role == Role.USER and (m := re.search(r"\[slow ([0-9.]+)\]", last.content or "")):
            await asyncio.sleep(float(m.group(1)))

    async def generate_turn_async(self, agent, history):
        await self._think(history)
        return await super().generate_turn_async(agent, history)

    async def stream_turn_async(self, agent, history, on_text_delta):
        await self._think(history)
        return await super().stream_turn_async(agent, history, on_text_delta)


def build():
    support = demo_team.build()
    engine = SlowDemoEngine()
    seen, todo = set(), [support]
    while todo:
        agent = todo.pop()
        if agent.name not in seen:
            seen.add(agent.name)
            agent.engine = engine
            todo.extend(agent.handoffs)
    return support
