"""Server time of the dashboard as the number of sessions grows.

    python bench/dashboard.py                      # 1k, 10k and 100k sessions, 3 turn records each
    python bench/dashboard.py --sizes 1000 --runs 10

Builds a fresh SQLite database (WAL, the site's settings) per size in a temporary directory: the
sessions, three turn records each spread over the last 30 days (statuses, durations, costs and agent
trails with handoffs, like a busy site), and a day of queue samples (one a minute). Then, in a fresh
process, through Django's test client (middleware, auth, queries and templates included, no network):

- the 30 d range before any fold: every record counted live (what a site whose workers never folded shows);
- one fold of every record into the hourly and daily rollups (what ``chatflow_sweep`` or the workers'
  heartbeat pays once, outside any request);
- p50 / p95 of each range (24 h, 7 d, 30 d) with every record folded;
- p50 / p95 of the 30 d range when 50 new turns were recorded before each read (not folded: the read
  counts them live; the reads write nothing).

Rows are written with raw sqlite3 executemany; the dashboard itself reads through the ORM. Prints a
table and a JSON line; figures go in docs/performance.md.
"""

from __future__ import annotations

import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.console import child, report, sizes_and_runs, staff_client, stamp, timed  # noqa: E402 - after the path

AGENTS = ("Support", "Billing", "Tech")
STATUSES = ("completed",) * 92 + ("failed",) * 5 + ("interrupted",) * 2 + ("cancelled",)
TURNS_PER_SESSION = 3
NOW = datetime.now(UTC)


def record_row(rng: random.Random, sid: str, n: int, started: datetime) -> tuple:
    status = rng.choice(STATUSES)
    trail = [AGENTS[n % 3]] + ([AGENTS[(n + 1) % 3]] if rng.random() < 0.2 else [])
    duration = rng.lognormvariate(7, 0.6)  # ≈ 1.1 s median
    cost = None if rng.random() < 0.03 else f"{rng.uniform(0.0002, 0.004):.6f}"
    return (sid, f"bench:{n}:{sid}", "webhook", None, "", status, stamp(started),
            stamp(started + timedelta(milliseconds=duration)), 3.0, 1.0, duration, json.dumps(trail),
            "" if status == "completed" else "RuntimeError: boom", "[]", "[]", 300, 40, 0, cost, "")


def insert_records(conn: sqlite3.Connection, rows: list[tuple]) -> None:
    conn.executemany(
        "INSERT INTO chatflow_turn_records (session_id, owner, source, first_message_id, user_text, status, "
        "started_at, finished_at, queue_wait_ms, lease_wait_ms, duration_ms, agents, error, calls, tools, "
        "input_tokens, output_tokens, cached_tokens, cost, trace_id) VALUES "
        "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)


def fill(db: Path, sessions: int) -> None:
    """``sessions`` sessions with their turn records over the last 30 days, and a day of queue samples."""
    rng = random.Random(sessions)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    batch_s, batch_r, n = [], [], 0
    for i in range(sessions):
        sid = f"+1555{i:07d}"
        last = NOW - timedelta(seconds=rng.uniform(300, 30 * 86400))
        batch_s.append((sid, AGENTS[i % 3], "{}", stamp(last), stamp(last)))
        for t in range(TURNS_PER_SESSION):
            n += 1
            batch_r.append(record_row(rng, sid, n, last - timedelta(minutes=2 * (TURNS_PER_SESSION - t))))
        if len(batch_r) >= 30_000:
            flush(conn, batch_s, batch_r)
    flush(conn, batch_s, batch_r)
    conn.executemany("INSERT INTO chatflow_queue_samples (at, queued, running) VALUES (?, ?, ?)",
                     [(stamp(NOW - timedelta(minutes=m)), rng.randrange(0, 40), rng.randrange(0, 8))
                      for m in range(1440)])
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def flush(conn: sqlite3.Connection, sessions: list, records: list) -> None:
    conn.executemany("INSERT INTO chatflow_sessions (session_id, active_agent_name, metadata_json, created_at, "
                     "updated_at) VALUES (?, ?, ?, ?, ?)", sessions)
    insert_records(conn, records)
    sessions.clear()
    records.clear()


def with_new_turns(client, db: Path, runs: int, per_read: int = 50) -> dict[str, float]:
    """Each read preceded by ``per_read`` new ended records, not folded (written outside the timing)."""
    rng, samples = random.Random(7), []
    conn = sqlite3.connect(db, isolation_level=None, timeout=20)
    for run in range(runs):
        started = datetime.now(UTC) - timedelta(minutes=5)
        rows = [record_row(rng, f"new-{run}-{k}", 10**9 + run * per_read + k, started) for k in range(per_read)]
        conn.execute("BEGIN IMMEDIATE")
        insert_records(conn, rows)
        conn.execute("COMMIT")
        t0 = time.perf_counter()
        assert client.get("/dashboard/?range=30d").status_code == 200
        samples.append((time.perf_counter() - t0) * 1000)
    conn.close()
    samples.sort()
    return {"p50": round(statistics.median(samples), 1), "p95": round(samples[int(len(samples) * 0.95) - 1], 1)}


def measure_here(db: Path, runs: int) -> None:
    """Child process: Django on ``db``, the measurements as one JSON line on stdout."""
    client = staff_client(db, runs)
    if client is None:
        return
    from turns_app import rollups

    out = {"read, nothing folded (all live)": timed(client, "/dashboard/?range=30d", max(3, runs // 10))}
    t0 = time.perf_counter()
    folded = rollups.fold()
    took = round((time.perf_counter() - t0) * 1000, 1)
    assert folded == ended_records(db), folded
    out["fold of every record"] = {"p50": took, "p95": took}
    for name in ("24h", "7d", "30d"):
        out[f"range {name}"] = timed(client, f"/dashboard/?range={name}", runs)
    out["30d, 50 new turns a read"] = with_new_turns(client, db, runs)
    print(json.dumps(out))


def ended_records(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT count(*) FROM chatflow_turn_records WHERE status <> 'running'").fetchone()[0]
    finally:
        conn.close()


def main() -> None:
    sizes, runs, measure_db = sizes_and_runs(__doc__)
    if measure_db:
        return measure_here(measure_db, runs)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            db = Path(tmp) / f"dashboard-{size}.db"
            child(__file__, db, 0)  # migrate
            t0 = time.perf_counter()
            fill(db, size)
            print(f"{size:>7} sessions ({size * TURNS_PER_SESSION:,} turn records) written in "
                  f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)
            results[size] = child(__file__, db, runs)
    report("dashboard", "dashboard (ms, p50 / p95)", results, sizes)


if __name__ == "__main__":
    main()
