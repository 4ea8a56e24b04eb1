"""Retention throughput: sessions deleted per second by ``sessions_app.retention.sweep``.

    python bench/retention.py                      # 100,000 sessions of 4 messages, half past their limit
    python bench/retention.py --sessions 20000     # smaller
    python bench/retention.py --database-url postgres://postgres@127.0.0.1:5432/h_retention

Builds a fresh database (a SQLite file in a temporary directory with the site's settings, or the given
PostgreSQL database, dropped and re-created) with ``bulk_create``: sessions on the web, WhatsApp and Telegram
channels, each with two turns (four messages) and a webhook delivery; every other one last written 60 days ago.
Then, with the policy ``web=30,whatsapp=30,telegram=30``, it runs one sweep (batches of ``--batch`` sessions, each
its own transaction, through the site store's delete) and reports sessions deleted per second, and the longest
batch (the longest a turn on another session could wait for the write lock on SQLite).
Prints a table and a JSON line; figures go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CHANNELS = ("web", "whatsapp", "telegram")
POLICY = "web=30,whatsapp=30,telegram=30"


def setup_django(database_url: str) -> None:
    os.environ.update(CHATFLOW_ENV_FILE="", DATABASE_URL=database_url, ALLOWED_HOSTS="testserver",
                      DJANGO_SETTINGS_MODULE="chatflow_site.settings", DEBUG="0", SECRET_KEY="bench-" + "x" * 50,
                      SECURE_SSL_REDIRECT="0", CHATFLOW_RETENTION_DAYS=POLICY)
    import django

    django.setup()


def build(sessions: int, batch: int) -> None:
    from django.core.management import call_command
    from django.utils import timezone
    from tqdm import tqdm

    from chatflow_agent.types import Message, Role
    from sessions_app.models import ChatMessage, ChatSession
    from webhooks_app.models import InboundDelivery

    call_command("migrate", verbosity=0)
    now = timezone.now()
    turn = [Message(role=Role.USER, content="Where is my order?"), Message(role=Role.MODEL, content="On its way.")] * 2
    with tqdm(total=sessions, unit="session", desc="bulk_create") as bar:
        for start in range(0, sessions, batch):
            chunk = range(start, min(sessions, start + batch))
            rows = [ChatSession(session_id=f"+5511{i:09d}", active_agent_name="Support",
                                metadata={"channel": CHANNELS[i % 3], "wa_id": f"5511{i:09d}"},
                                created_at=now - timedelta(days=90),
                                updated_at=now - timedelta(days=60 if i % 2 else 1, seconds=i)) for i in chunk]
            ChatSession.objects.bulk_create(rows)
            ChatMessage.objects.bulk_create([
                ChatMessage(session=s, role=m.role.value, content=m.content, message_json=m.model_dump_json(),
                            created_at=s.updated_at) for s in rows for m in turn], batch_size=5000)
            InboundDelivery.objects.bulk_create([
                InboundDelivery(provider="whatsapp", provider_message_id=f"wamid.{s.session_id}",
                                claim_key=f"whatsapp:wamid.{s.session_id}", token="t", session_id=s.pk,
                                kind="text", text="hello", status="done", metadata={}) for s in rows])
            bar.update(len(rows))


def measure(batch: int) -> dict:
    from sessions_app import retention
    from sessions_app.models import ChatSession

    before = ChatSession.objects.count()
    longest = 0.0
    last = [time.perf_counter()]

    def progress(n: int) -> None:
        nonlocal longest
        t = time.perf_counter()
        longest = max(longest, t - last[0])
        last[0] = t

    t0 = time.perf_counter()
    report = retention.sweep(batch=batch, progress=progress)
    elapsed = time.perf_counter() - t0
    return {"sessions": before, "deleted": report.total_deleted, "seconds": round(elapsed, 2),
            "deleted_per_s": round(report.total_deleted / elapsed), "batch": batch,
            "longest_batch_ms": round(longest * 1000, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10, help="sessions per retention batch (transaction)")
    parser.add_argument("--database-url", default="", help="default: a SQLite file in a temporary directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chatflow-bench-retention-") as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'retention.db'}"
        if url.startswith("postgres"):
            recreate_postgres(url)
        setup_django(url)
        build(args.sessions, 1000)
        result = measure(args.batch)
        from django.db import connections

        connections.close_all()
    vendor = "PostgreSQL" if url.startswith("postgres") else "SQLite (WAL)"
    print(f"\nRetention sweep, {vendor}: {result['deleted']:,} of {result['sessions']:,} sessions deleted in "
          f"{result['seconds']} s ({result['deleted_per_s']:,}/s, batches of {result['batch']}, "
          f"longest batch {result['longest_batch_ms']} ms)")
    print(json.dumps({"vendor": vendor, **result}))


def recreate_postgres(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    main()
