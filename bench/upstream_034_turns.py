"""Baseline: turn throughput of the REAL chatflow-agent 0.3.4 Runner + SQLiteSessionStore.

Run with a Python that has ``chatflow-agent==0.3.4`` installed (not this repo's package):

    /tmp/venv034/bin/python bench/upstream_034_turns.py                  # 500 turns, 1 session
    /tmp/venv034/bin/python bench/upstream_034_turns.py --concurrent 20  # 20 sessions, gather

Engine is instant (answers text, ``await asyncio.sleep(0)`` so gathered sessions can
interleave). Each turn = get_or_create (reloads the session history) + 2 add_message
(INSERT + prune + UPDATE, each on its own connection, WAL, synchronous=NORMAL). With
--concurrent K the N turns are split across K sessions (N/K sequential turns each) run
under asyncio.gather. Prints one JSON line.
"""

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if not Path(p or ".").resolve().is_relative_to(REPO)]

import chatflow_agent  # noqa: E402
from chatflow_agent import Agent, Runner, SQLiteSessionStore  # noqa: E402
from chatflow_agent.core.engines.base import BaseEngine, EngineTurnResult  # noqa: E402

if chatflow_agent.__version__ != "0.3.4":
    sys.exit(f"need chatflow-agent 0.3.4, got {chatflow_agent.__version__}")


class InstantEngine(BaseEngine):
    async def generate_turn_async(self, agent, history):  # type: ignore[override]
        await asyncio.sleep(0)
        return EngineTurnResult(text="ok")


async def run(turns: int, concurrent: int, db: Path) -> float:
    store = SQLiteSessionStore(db_path=db)
    runner = Runner(
        starting_agent=Agent(name="Bench", instructions="bench"), session_store=store, engine=InstantEngine()
    )
    sessions = max(1, concurrent)
    per = [turns // sessions + (1 if i < turns % sessions else 0) for i in range(sessions)]

    async def one(i: int, n: int) -> None:
        for t in range(n):
            await runner.run_async(f"bench-{i}", f"message {t}")

    t0 = time.perf_counter()
    if concurrent:
        await asyncio.gather(*(one(i, n) for i, n in enumerate(per)))
    else:
        await one(0, turns)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", "-n", type=int, default=500)
    ap.add_argument("--concurrent", type=int, default=0, metavar="K", help="K sessions under asyncio.gather")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        secs = asyncio.run(run(args.turns, args.concurrent, Path(d) / "bench.db"))
    out = {"turns": args.turns, "seconds": round(secs, 4), "turns_per_s": round(args.turns / secs, 1)}
    if args.concurrent:
        out["concurrent_sessions"] = args.concurrent
    out["chatflow_agent"] = chatflow_agent.__version__
    print(json.dumps(out))


if __name__ == "__main__":
    main()
