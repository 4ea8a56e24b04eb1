"""Turn throughput of the Runner: in-memory store, SQLite file, the raw-sqlite3 floor, and
(optionally) chatflow-agent 0.3.4 on the identical workload.

    python bench/turns.py                                  # 2,000 turns per workload
    python bench/turns.py --upstream-python /tmp/venv034/bin/python   # adds 0.3.4 side by side
    python bench/turns.py -n 4000 -r 5 --upstream-python ...          # 5 interleaved rounds, medians

Workload: an instant engine (answers text after ``await asyncio.sleep(0)``); "sequential" is
N turns on one session; "concurrent" splits N turns over 20 sessions under asyncio.gather. The
memory-store figure is the Runner's own overhead (the store costs ~nothing); the SQLite figure
minus it is the store's cost. The floor is N transactions through raw ``sqlite3`` that each
insert a user and a model row and update the session row (WAL, synchronous=NORMAL).
Prints a table and a JSON line; numbers go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from chatflow_agent import Agent, Message, Role, Runner, SessionStore, SQLiteSessionStore  # noqa: E402
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult  # noqa: E402


class InstantEngine(BaseEngine):
    async def generate_turn_async(self, agent, history):  # type: ignore[override]
        await asyncio.sleep(0)
        return EngineTurnResult(text="ok")


async def run_turns(store, turns: int, sessions: int) -> float:
    runner = Runner(Agent(name="Bench", instructions="bench"), session_store=store, engine=InstantEngine())
    per = [turns // sessions + (1 if i < turns % sessions else 0) for i in range(sessions)]

    async def one(i: int, n: int) -> None:
        for t in range(n):
            await runner.run_async(f"bench-{i}", f"message {t}")

    await runner.run_async("warm-up", "hello")
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, n) for i, n in enumerate(per)))
    return time.perf_counter() - t0


def raw_floor(path: Path, turns: int) -> float:
    SQLiteSessionStore(path).close()  # same schema
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("INSERT INTO chatflow_sessions (session_id, active_agent_name) VALUES ('raw', 'Bench')")
    user = Message(role=Role.USER, content="message").model_dump_json()
    model = Message(role=Role.MODEL, content="ok").model_dump_json()
    t0 = time.perf_counter()
    for _ in range(turns):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json) VALUES "
                     "('raw', 'user', 'message', ?)", (user,))
        conn.execute("INSERT INTO chatflow_messages (session_id, role, content, message_json) VALUES "
                     "('raw', 'model', 'ok', ?)", (model,))
        conn.execute("UPDATE chatflow_sessions SET updated_at = CURRENT_TIMESTAMP WHERE session_id = 'raw'")
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed


def upstream(python: str, turns: int, concurrent: int) -> float:
    cmd = [python, str(REPO / "bench" / "upstream_034_turns.py"), "--turns", str(turns)]
    if concurrent:
        cmd += ["--concurrent", str(concurrent)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tempfile.gettempdir())
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", "-n", type=int, default=2000)
    ap.add_argument("--rounds", "-r", type=int, default=1,
                    help="repeat every workload this many times, interleaved, and report medians: the ratios "
                         "then compare runs made under the same machine conditions")
    ap.add_argument("--upstream-python", metavar="PATH", help="a Python with chatflow-agent==0.3.4 installed")
    ap.add_argument("--sequential-only", action="store_true",
                    help="skip the concurrent workloads (the targets are about sequential turns)")
    args = ap.parse_args()
    n = args.turns
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.rounds):
            print(f"[turns] round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
            runs.setdefault("memory_sequential", []).append(asyncio.run(run_turns(SessionStore(), n, 1)))
            if not args.sequential_only:
                runs.setdefault("memory_concurrent20", []).append(asyncio.run(run_turns(SessionStore(), n, 20)))
            workloads = [("sqlite_sequential", 1)] + ([] if args.sequential_only else [("sqlite_concurrent20", 20)])
            for label, sessions in workloads:
                store = SQLiteSessionStore(Path(d) / f"{label}-{r}.db")
                runs.setdefault(label, []).append(asyncio.run(run_turns(store, n, sessions)))
                store.close()
            runs.setdefault("raw_sqlite3_floor", []).append(raw_floor(Path(d) / f"raw-{r}.db", n))
            if args.upstream_python:
                runs.setdefault("upstream_034_sequential", []).append(upstream(args.upstream_python, n, 0))
                if not args.sequential_only:
                    runs.setdefault("upstream_034_concurrent20", []).append(upstream(args.upstream_python, n, 20))
    results = {k: statistics.median(v) for k, v in runs.items()}
    rows = {k: {"turns_per_s": round(n / v), "ms_per_turn": round(v * 1000 / n, 3)} for k, v in results.items()}
    mem, sql = rows["memory_sequential"]["ms_per_turn"], rows["sqlite_sequential"]["ms_per_turn"]
    # Ratios per round (same conditions), then their median.
    vs_floor = [s / f for s, f in zip(runs["sqlite_sequential"], runs["raw_sqlite3_floor"], strict=True)]
    summary = {
        "turns": n,
        "rounds": args.rounds,
        "results": rows,
        "runner_overhead_ms_per_turn": mem,
        "sqlite_store_cost_ms_per_turn": round(sql - mem, 3),
        "sqlite_vs_raw_floor": round(statistics.median(vs_floor), 2),
        "sqlite_vs_raw_floor_per_round": [round(x, 2) for x in vs_floor],
    }
    if "upstream_034_sequential" in runs:
        speedups = [u / s for u, s in zip(runs["upstream_034_sequential"], runs["sqlite_sequential"], strict=True)]
        summary["speedup_vs_034_sequential"] = round(statistics.median(speedups), 1)
        summary["speedup_vs_034_sequential_per_round"] = [round(x, 1) for x in speedups]
    print(f"{'workload':28} {'turns/s':>10} {'ms/turn':>9}")
    for k, v in rows.items():
        print(f"{k:28} {v['turns_per_s']:>10} {v['ms_per_turn']:>9}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
