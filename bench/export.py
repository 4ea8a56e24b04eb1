"""Throughput and memory of the bulk JSONL export (``GET /api/v1/export.jsonl``).

    python bench/export.py                      # 100,000 sessions of 20 messages (2 million rows)
    python bench/export.py --sessions 20000     # smaller
    python bench/export.py --database-url postgres://postgres@127.0.0.1:5432/bench_export

Builds a fresh database (SQLite file in a temporary directory, the site's settings; or the given
PostgreSQL database, dropped and re-created) with ``bulk_create`` in batches: each session has ten
turns, the first with a tool call and its result, so 20 messages. Then, in a fresh process, it
downloads the whole export through Django's test client with an API token (auth, audit, the view,
streaming; no network) and reports messages/s, MB/s and the process's resident memory sampled while
the download runs: flat memory means the export streams (one batch of sessions at a time) instead
of building the file. ``--tracemalloc`` also reports Python's peak allocation (slower).
Prints a table and a JSON line; figures go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AGENTS = ("Support", "Billing", "Tech")
CHANNELS = ("whatsapp", "telegram", "web")


def setup_django(database_url: str) -> None:
    # Production settings (DEBUG off: Django keeps no query log), minus the HTTPS redirect.
    os.environ.update(CHATFLOW_ENV_FILE="", DATABASE_URL=database_url, ALLOWED_HOSTS="testserver",
                      DJANGO_SETTINGS_MODULE="chatflow_site.settings", DEBUG="0", SECRET_KEY="bench-" + "x" * 50,
                      SECURE_SSL_REDIRECT="0")
    import django

    django.setup()


def conversation(i: int):
    """Twenty messages: a tool call turn, then nine question/answer turns (emoji and accents included)."""
    from chatflow_agent.types import Message, Role, ToolCall, ToolResult

    at = T0 + timedelta(seconds=i)
    msgs = [
        Message(role=Role.USER, content=f"Onde está o pedido {i}? 📦", timestamp=at),
        Message(role=Role.MODEL, tool_calls=[ToolCall(id=f"c{i}", name="check_order_status",
                                                      args={"order_id": str(i)})], timestamp=at),
        Message(role=Role.TOOL, tool_results=[ToolResult(tool_call_id=f"c{i}", name="check_order_status",
                                                         content={"order_id": str(i), "status": "shipped",
                                                                  "eta": at.date()})], timestamp=at),
        Message(role=Role.MODEL, content=f"O pedido {i} foi enviado.", timestamp=at),
    ]
    for t in range(8):
        msgs.append(Message(role=Role.USER, content=f"Pergunta {t} sobre a entrega, obrigado!", timestamp=at))
        msgs.append(Message(role=Role.MODEL, content=f"Resposta {t}: chega amanhã de manhã 🙂", timestamp=at))
    return msgs


def build(sessions: int, batch: int) -> int:
    from django.core.management import call_command
    from tqdm import tqdm

    from sessions_app.models import ChatMessage, ChatSession

    call_command("migrate", verbosity=0)
    template = conversation(0)
    rows = 0
    with tqdm(total=sessions, unit="session", desc="bulk_create") as bar:
        for start in range(0, sessions, batch):
            chunk = range(start, min(sessions, start + batch))
            objs = [ChatSession(session_id=f"+5511{i:09d}", active_agent_name=AGENTS[i % 3],
                                metadata={"channel": CHANNELS[i % 3]}, created_at=T0 + timedelta(seconds=i),
                                updated_at=T0 + timedelta(seconds=i, minutes=5)) for i in chunk]
            ChatSession.objects.bulk_create(objs)
            messages = []
            for s in objs:
                # The template's JSON with this session's numbers: building 20 pydantic models per session
                # would make the fill, not the export, the slow part.
                n = s.session_id[5:].lstrip("0") or "0"
                for m in template:
                    raw = m.model_dump_json().replace("pedido 0", f"pedido {n}").replace('"0"', f'"{n}"')
                    messages.append(ChatMessage(session=s, role=m.role.value, content=m.content,
                                                message_json=raw, created_at=s.created_at))
            ChatMessage.objects.bulk_create(messages, batch_size=5000)
            rows += len(messages)
            bar.update(len(objs))
    return rows


def hwm_mb() -> float:
    """The process's peak resident memory (VmHWM; unlike ru_maxrss it is not inherited across fork+exec)."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(trace: bool) -> dict:
    """Download the whole export once (this process is fresh: its memory is the export's)."""
    import tracemalloc

    from django.contrib.auth.models import Group, User
    from django.test import Client

    from api_app.models import ApiToken
    from sessions_app.models import ChatMessage, ChatSession

    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True})
    user.groups.add(Group.objects.get(name="Operators"))
    _token, secret = ApiToken.issue("bench", user)
    sessions, messages = ChatSession.objects.count(), ChatMessage.objects.count()
    client = Client()
    rss_start = rss_mb()
    if trace:
        tracemalloc.start()
    samples, lines, size = [], 0, 0
    t0 = time.perf_counter()
    response = client.get("/api/v1/export.jsonl", HTTP_AUTHORIZATION=f"Bearer {secret}")
    step = max(1, sessions // 10)
    for chunk in response.streaming_content:
        size += len(chunk)
        before = lines
        lines += chunk.count(b"\n")
        if lines // step != before // step:
            samples.append((lines, round(rss_mb(), 1)))
    elapsed = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20 if trace else None
    assert lines == sessions, (lines, sessions)
    return {
        "sessions": sessions, "messages": messages, "seconds": round(elapsed, 2),
        "messages_per_s": round(messages / elapsed), "sessions_per_s": round(sessions / elapsed),
        "mb": round(size / 2**20, 1), "mb_per_s": round(size / 2**20 / elapsed, 1),
        "rss_start_mb": round(rss_start, 1), "rss_samples_mb": samples,
        "rss_peak_mb": round(hwm_mb(), 1),
        "tracemalloc_peak_mb": round(peak, 1) if peak is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000, help="sessions per bulk_create batch")
    parser.add_argument("--database-url", default="", help="default: a SQLite file in a temporary directory")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--measure", default="", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.measure:
        setup_django(args.measure)
        print(json.dumps(measure(args.tracemalloc)))
        return
    with tempfile.TemporaryDirectory(prefix="chatflow-bench-export-") as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'export.db'}"
        if url.startswith("postgres"):
            recreate_postgres(url)
        setup_django(url)
        t0 = time.perf_counter()
        rows = build(args.sessions, args.batch)
        print(f"built {args.sessions:,} sessions / {rows:,} messages in {time.perf_counter() - t0:.0f} s")
        child = [sys.executable, __file__, "--measure", url] + (["--tracemalloc"] if args.tracemalloc else [])
        out = subprocess.run(child, capture_output=True, text=True, cwd=REPO)
        if url.startswith("postgres"):
            from django.db import connections

            connections.close_all()
            recreate_postgres(url, create=False)
        if out.returncode:
            sys.exit(out.stderr)
        result = json.loads(out.stdout.strip().splitlines()[-1])
    vendor = "PostgreSQL" if url.startswith("postgres") else "SQLite (WAL)"
    print(f"\nBulk JSONL export, {vendor}, through the test client with a token")
    print(f"  {result['sessions']:,} sessions, {result['messages']:,} messages, {result['mb']} MB "
          f"in {result['seconds']} s")
    print(f"  {result['messages_per_s']:,} messages/s, {result['sessions_per_s']:,} sessions/s, "
          f"{result['mb_per_s']} MB/s")
    print(f"  RSS at start {result['rss_start_mb']} MB; while streaming (lines, MB): {result['rss_samples_mb']}")
    print(f"  peak RSS {result['rss_peak_mb']} MB" + (f"; tracemalloc peak {result['tracemalloc_peak_mb']} MB"
                                                     if result["tracemalloc_peak_mb"] is not None else ""))
    print(json.dumps({"vendor": vendor, **result}))


def recreate_postgres(url: str, create: bool = True) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if create:
            conn.execute(f'CREATE DATABASE "{name}"')


if __name__ == "__main__":
    main()
