"""Child process: ``python -m tests.turns_app._hang DATABASE_URL SESSION READY``.

Plays a turn on SESSION through the site's DjangoSessionStore (lease TTL 1 s) whose engine writes the file
READY and never answers: the parent kills this process with SIGKILL mid-turn.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path


def main(database_url: str, session_id: str, ready: str) -> None:
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatflow_site.settings")
    import django

    django.setup()
    from chatflow_agent import Agent, Runner
    from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult
    from chatflow_agent.core.reports import TurnReport
    from sessions_app.store import DjangoSessionStore

    class Hang(BaseEngine):
        async def generate_turn_async(self, agent, history) -> EngineTurnResult:
            Path(ready).write_text("ready")  # noqa: ASYNC240 - a signal to the parent, once
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    store = DjangoSessionStore(lease_ttl_seconds=1)
    runner = Runner(Agent(name="Bot", instructions="x", engine=Hang()), session_store=store)
    asyncio.run(runner.run_async(session_id, "are you still there?", report=TurnReport(source="webhook")))


if __name__ == "__main__":
    main(*sys.argv[1:4])
