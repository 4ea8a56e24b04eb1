"""Turn throughput of the Runner on the site's DjangoSessionStore, on SQLite and PostgreSQL.

    python bench/django_turns.py                          # SQLite file in a temp dir, 1,000 turns
    python bench/django_turns.py --database postgres://postgres@127.0.0.1:5432/postgres

Same workload as bench/turns.py (instant engine; "sequential" = N turns on one session,
"concurrent" = N turns over 20 sessions under asyncio.gather). For PostgreSQL a scratch database
``chatflow_bench_<pid>`` is created on the given server and dropped afterwards. Prints a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def setup(database: str | None, tmp: Path) -> str | None:
    """Point Django at a scratch database and migrate it; returns the PostgreSQL db to drop."""
    scratch = None
    url = f"sqlite:///{tmp / 'bench.db'}"
    if database:
        import psycopg

        scratch = f"chatflow_bench_{os.getpid()}"
        with psycopg.connect(database.replace("postgres://", "postgresql://"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{scratch}"')
        url = database.rsplit("/", 1)[0] + f"/{scratch}"
    os.environ.update(CHATFLOW_ENV_FILE="", DATABASE_URL=url, DEBUG="0", SECRET_KEY="bench-" + "x" * 50,
                      ALLOWED_HOSTS="localhost", DJANGO_SETTINGS_MODULE="chatflow_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return scratch


def drop(database: str, scratch: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(database.replace("postgres://", "postgresql://"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", "-n", type=int, default=1000)
    ap.add_argument("--database", help="a PostgreSQL URL (default: a SQLite file in a temp dir)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        scratch = setup(args.database, Path(d))
        try:
            from turns import run_turns

            from sessions_app.store import DjangoSessionStore

            out: dict[str, object] = {"backend": "postgresql" if args.database else "sqlite", "turns": args.turns}
            for label, sessions in (("sequential", 1), ("concurrent20", 20)):
                store = DjangoSessionStore()
                seconds = asyncio.run(run_turns(store, args.turns, sessions))
                store.close()
                out[label] = {"turns_per_s": round(args.turns / seconds),
                              "ms_per_turn": round(seconds * 1000 / args.turns, 3)}
        finally:
            if scratch:
                drop(args.database, scratch)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
