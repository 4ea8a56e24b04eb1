"""Server time of the operator console's pages as the number of sessions grows.

    python bench/console.py                        # 1k, 10k and 100k sessions (≈ 20 messages each)
    python bench/console.py --sizes 1000,10000 --runs 50

Builds a fresh SQLite database (WAL, the site's settings) in a temporary directory, fills it with
sessions of ten turns (a user and a model message each) plus one 10,000-message session, then
measures — through Django's test client in a fresh process per size, so middleware, auth, queries and template
rendering are all included and the network is not — the p50 and p95 of:

- the session list's first page, a filtered page (active agent), a deep keyset page (the 20th page,
  reached by following "next" cursors) and a search by session id;
- the session detail of the 10,000-message session (first page of 20 turns).

Rows are written with raw sqlite3 executemany (the fastest way to get 2 million rows in; the console
itself only reads through the ORM). Prints a table and a JSON line; figures go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

AGENTS = ("Support", "Billing", "Tech")
CHANNELS = ("whatsapp", "telegram", "web")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def setup_django(db: Path) -> None:
    os.environ.update(CHATFLOW_ENV_FILE="", DATABASE_URL=f"sqlite:///{db}", ALLOWED_HOSTS="testserver",
                      DJANGO_SETTINGS_MODULE="chatflow_site.settings", DEBUG="1")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")


def message_json(role: str, text: str, moment: datetime) -> str:
    return json.dumps({"role": role, "content": text, "tool_calls": None, "tool_results": None,
                       "timestamp": moment.strftime("%Y-%m-%dT%H:%M:%SZ")})


def fill(db: Path, start: int, stop: int, turns: int = 10) -> None:
    """Sessions ``start``..``stop - 1``: ``turns`` turns each, updated one second apart."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    batch_s, batch_m = [], []
    for i in range(start, stop):
        sid = f"+1555{i:07d}" if i % 2 else f"tg:{i:09d}"
        moment = T0 + timedelta(seconds=i)
        meta = json.dumps({"channel": CHANNELS[i % 3], "user_id": str(i)})
        batch_s.append((sid, AGENTS[i % 3], meta, stamp(moment), stamp(moment)))
        for t in range(turns):
            for role, text in (("user", f"question {t} about order {i}"), ("model", f"answer {t} for order {i}")):
                batch_m.append((sid, role, text, message_json(role, text, moment), stamp(moment)))
        if len(batch_m) >= 50_000:
            flush(conn, batch_s, batch_m)
    flush(conn, batch_s, batch_m)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    # Fold the WAL back into the database: readers would otherwise search a WAL of millions of rows.
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def flush(conn: sqlite3.Connection, sessions: list, messages: list) -> None:
    conn.executemany("INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, "
                     "updated_at) VALUES (?, ?, ?, ?, ?)", sessions)
    conn.executemany("INSERT INTO chatflow_messages (session_id, role, content, message_json, created_at) "
                     "VALUES (?, ?, ?, ?, ?)", messages)
    sessions.clear()
    messages.clear()


def big_session(db: Path) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, "
                 "updated_at) VALUES ('big', 'Support', '{}', ?, ?)", (stamp(T0), stamp(T0)))
    flush(conn, [], [("big", role, f"{role} {n}", message_json(role, f"{role} {n}", T0), stamp(T0))
                     for n in range(5_000) for role in ("user", "model")])
    conn.execute("COMMIT")
    conn.close()


def timed(client, url: str, runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    samples.sort()
    # The 95th percentile by the nearest rank (a small run's p95 was its fastest sample: int(2 × 0.95) - 1 = 0).
    return {"p50": round(statistics.median(samples), 1), "p95": round(samples[math.ceil(len(samples) * 0.95) - 1], 1)}


def deep_url(client, pages: int) -> str:
    url = "/sessions/"
    for _ in range(pages - 1):
        match = re.search(r'<a href="([^"]*)"[^>]*>Next page', client.get(url).content.decode())
        url = match.group(1).replace("&amp;", "&")
    return url


def measure(client, runs: int) -> dict[str, dict[str, float]]:
    return {
        "list first page": timed(client, "/sessions/", runs),
        "list filtered (agent)": timed(client, "/sessions/?agent=Billing", runs),
        "list deep page (20th)": timed(client, deep_url(client, 20), runs),
        "list search (session id)": timed(client, "/sessions/?q=tg:0000001", max(5, runs // 5)),
        "detail 10,000 messages": timed(client, "/sessions/big/", runs),
    }


def staff_client(db: Path, runs: int):
    """In a bench's child process: Django on ``db`` (migrated), then a test client logged in as the bench
    superuser (created the first time); None when ``runs`` is 0 (the child was run to migrate only)."""
    setup_django(db)
    if runs == 0:
        return None
    from django.contrib.auth.models import User
    from django.test import Client

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser("bench", "b@x.test", "x")
    client = Client()
    client.force_login(user)
    return client


def child(script: str, db: Path, runs: int) -> dict:
    """Run ``script --measure db --runs runs`` in a fresh process (``runs`` 0: migrate only, returns {});
    its last stdout line parsed as JSON."""
    done = subprocess.run([sys.executable, script, "--measure", str(db), "--runs", str(runs)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]) if runs else {}


def measure_here(db: Path, runs: int) -> None:
    """Child process: Django on ``db``, the measurements as one JSON line on stdout."""
    client = staff_client(db, runs)
    if client is not None:
        print(json.dumps(measure(client, runs)))


def report(key: str, heading: str, results: dict[int, dict], sizes: list[int]) -> None:
    """Print ``results`` (size → case → p50/p95 ms) as a table, a case per row, then as one JSON line."""
    print(f"{heading:<28}" + "".join(f"{s:>18,}" for s in sizes))
    for name in next(iter(results.values())):
        print(f"{name:<28}" + "".join(f"{results[s][name]['p50']:>10} / {results[s][name]['p95']:<7}" for s in sizes))
    print(json.dumps({key: {str(s): r for s, r in results.items()}}))


def sizes_and_runs(doc: str | None) -> tuple[list[int], int, Path | None]:
    """A size-sweeping bench's command line: ``--sizes`` (sessions, comma-separated), ``--runs`` per case,
    and the hidden ``--measure DB`` of its child process. Returns (sizes, runs, the child's database or None)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    return [int(s) for s in args.sizes.split(",")], args.runs, args.measure


def main() -> None:
    sizes, runs, measure_db = sizes_and_runs(__doc__)
    if measure_db:
        return measure_here(measure_db, runs)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "console.db"
        child(__file__, db, 0)  # migrate
        big_session(db)
        results, have = {}, 0
        for size in sizes:
            t0 = time.perf_counter()
            fill(db, have, size)
            have = size
            print(f"{size:>7} sessions written in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            # Measured in a fresh process, so the bulk load's memory and caches do not weigh on it.
            results[size] = child(__file__, db, runs)
    report("console", "page (ms, p50 / p95)", results, sizes)


if __name__ == "__main__":
    main()
