"""What the search index's triggers add to a turn's commit: the same turns with the triggers and without them.

    python bench/search_commit.py -n 500 -r 3                                   # SQLite (a temporary file)
    python bench/search_commit.py -n 500 -r 3 --database postgres://postgres@127.0.0.1:5432/<db>

The site's ``DjangoSessionStore`` and ``Runner`` with an instant engine play ``-n`` sequential turns on a fresh
session, round by round, alternating "triggers" and "no triggers" (the triggers dropped, or on PostgreSQL disabled,
for that pass and restored after it), so both see the same machine. Each turn commits a user and a model message
and the session row, as in production. Prints the medians (turns/s) and the ratio, then a JSON line.

With ``--database`` the turns run in that database (its tables must be migrated: ``manage.py migrate``), on
sessions named ``search-commit-*`` that are deleted afterwards. Compare against a tree without the index with
``bench/django_turns.py`` run in both trees (``docs/performance.md`` › Search).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def setup(database: str, tmp: Path) -> None:
    os.environ.update(CHATFLOW_ENV_FILE="", DATABASE_URL=database or f"sqlite:///{tmp / 'commit.db'}", DEBUG="0",
                      SECRET_KEY="bench-" + "x" * 50, ALLOWED_HOSTS="localhost", REDIS_URL="",
                      DJANGO_SETTINGS_MODULE="chatflow_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def set_triggers(on: bool) -> None:
    from django.db import connection

    from search_app import schema

    if connection.vendor == "sqlite":
        if on:
            schema.install(connection)
        else:
            with connection.cursor() as cursor:
                for statement in schema.SQLITE_DROP[:8]:  # the triggers only
                    cursor.execute(statement)
        return
    verb = "ENABLE" if on else "DISABLE"
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE chatflow_messages {verb} TRIGGER chatflow_search_message")
        cursor.execute(f"ALTER TABLE chatflow_sessions {verb} TRIGGER chatflow_search_session")
        cursor.execute(f"ALTER TABLE chatflow_sessions {verb} TRIGGER chatflow_search_session_update")


async def turns(store, session_id: str, n: int) -> float:
    from chatflow_agent import Agent, Runner
    from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult

    class Instant(BaseEngine):
        async def generate_turn_async(self, agent, history):
            return EngineTurnResult(text="an answer about the order and its refund")

    runner = Runner(Agent(name="Bench", instructions="bench"), session_store=store, engine=Instant())
    await runner.run_async(session_id, "warm up")
    t0 = time.perf_counter()
    for t in range(n):
        await runner.run_async(session_id, f"where is my order {t}? I want a refund")
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", "-n", type=int, default=500)
    ap.add_argument("--rounds", "-r", type=int, default=3)
    ap.add_argument("--database", default="", help="a migrated PostgreSQL database's URL (default: SQLite)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        setup(args.database, Path(d))
        from sessions_app.models import ChatSession
        from sessions_app.store import DjangoSessionStore

        rates: dict[str, list[float]] = {"triggers": [], "no triggers": []}
        try:
            for r in range(args.rounds):
                for name in (("triggers", "no triggers") if r % 2 == 0 else ("no triggers", "triggers")):
                    set_triggers(name == "triggers")
                    store = DjangoSessionStore(default_max_turns=10_000)
                    rates[name].append(asyncio.run(turns(store, f"search-commit-{name[:2]}-{r}", args.turns)))
                    store.close()
        finally:
            set_triggers(True)
            ChatSession.objects.filter(session_id__startswith="search-commit-").delete()
    medians = {name: round(statistics.median(v), 1) for name, v in rates.items()}
    ratio = round(medians["no triggers"] / medians["triggers"], 3)
    for name, v in rates.items():
        print(f"{name:<12} {medians[name]:>8} turns/s   rounds: {', '.join(f'{x:.0f}' for x in v)}")
    print(f"a turn with the index costs {ratio}x one without (time per turn)")
    print(json.dumps({"search_commit": {"turns_per_s": medians, "ratio": ratio, "rounds": rates,
                                        "database": "postgresql" if args.database else "sqlite"}}))


if __name__ == "__main__":
    main()
