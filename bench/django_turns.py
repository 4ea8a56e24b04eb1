"""Turn cost of the site's DjangoSessionStore against the runtime's SQLiteSessionStore and the raw floors.

    python bench/django_turns.py                        # SQLite only, 1,000 turns, 3 rounds
    python bench/django_turns.py -n 1000 -r 3 --database postgres://postgres@127.0.0.1:5432/postgres
    python bench/django_turns.py -n 300 -r 3 --records ...    # also the same stores keeping no turn records

One run measures, interleaved round by round (medians printed): the raw floor (``sqlite3``: 2 message
rows + session update in one ``BEGIN IMMEDIATE`` transaction, WAL, synchronous=NORMAL; with
``--database`` also ``psycopg``, same transaction, ``synchronous_commit`` as the server has it),
``SQLiteSessionStore`` on a file, ``DjangoSessionStore`` on a SQLite file and, with ``--database``,
on PostgreSQL (a scratch database ``chatflow_bench_<pid>`` created on that server and dropped
afterwards). Workload as bench/turns.py: an instant engine; "sequential" = N turns on one session,
"concurrent" = N turns over 20 sessions under asyncio.gather. Beside each store's wall time per turn, this
process's CPU time per turn (every thread; PostgreSQL's own processes not included), which other load on the
machine moves much less than wall time.

Then one more sequential pass per store, instrumented, gives the **cost breakdown per turn**:
database round trips and write transactions (counted on the driver's connection: every
``execute``, ``executemany``, ``commit``, ``rollback`` and psycopg's implicit ``BEGIN``; a write
transaction is a commit that wrote, or a write statement in autocommit mode) and milliseconds by
stage, timed on the store's thread: lease (taking the lease and reading the session), engine,
commit, and the rest (runner and thread hand-offs); on SQLite also the KiB the process wrote per turn
(Linux ``/proc/self/io``: WAL frames and checkpoints). Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SESSIONS = 20


def setup(database: str | None, tmp: Path) -> str | None:
    """Django on a SQLite file (alias ``default``) and, with ``database``, a scratch PostgreSQL
    database (alias ``pg``); both migrated. Returns the scratch database's name."""
    scratch = None
    os.environ.update(CHATFLOW_ENV_FILE="", DATABASE_URL=f"sqlite:///{tmp / 'django.db'}", DEBUG="0",
                      SECRET_KEY="bench-" + "x" * 50, ALLOWED_HOSTS="localhost",
                      DJANGO_SETTINGS_MODULE="chatflow_site.settings")
    from django.conf import settings

    if database:
        import psycopg

        from chatflow_site.settings import database_config

        scratch = f"chatflow_bench_{os.getpid()}"
        with psycopg.connect(pg_url(database), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{scratch}"')
        settings.DATABASES["pg"] = database_config(database.rsplit("/", 1)[0] + f"/{scratch}")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if database:
        call_command("migrate", database="pg", verbosity=0)
    return scratch


def pg_url(database: str) -> str:
    return database.replace("postgres://", "postgresql://", 1)


def drop(database: str, scratch: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect(pg_url(database), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


# ---- floors ---------------------------------------------------------------------------------
def sqlite_floor(path: Path, turns: int) -> float:
    from turns import raw_floor

    path.unlink(missing_ok=True)
    return raw_floor(path, turns)


def psycopg_floor(url: str, turns: int) -> float:
    import psycopg

    from chatflow_agent import Message, Role

    user = Message(role=Role.USER, content="message").model_dump_json()
    model = Message(role=Role.MODEL, content="ok").model_dump_json()
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO chatflow_sessions (session_id, active_agent_name) VALUES ('raw', 'Bench') "
                     "ON CONFLICT DO NOTHING")
        conn.commit()
        insert = "INSERT INTO chatflow_messages (session_id, role, content, message_json) VALUES ('raw', %s, %s, %s)"
        t0 = time.perf_counter()
        for _ in range(turns):
            conn.execute(insert, ("user", "message", user))
            conn.execute(insert, ("model", "ok", model))
            conn.execute("UPDATE chatflow_sessions SET updated_at = now() WHERE session_id = 'raw'")
            conn.commit()
        elapsed = time.perf_counter() - t0
        conn.execute("DELETE FROM chatflow_messages WHERE session_id = 'raw'")
        conn.execute("DELETE FROM chatflow_sessions WHERE session_id = 'raw'")
        conn.commit()
    return elapsed


# ---- the cost breakdown -----------------------------------------------------------------------
class Stages:
    """Milliseconds by stage, summed over a run (timed on the threads that do the work)."""

    def __init__(self) -> None:
        self.ms: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, stage: str, seconds: float) -> None:
        with self.lock:
            self.ms[stage] += seconds * 1000


class TimedBackend:
    """A ``SessionBackend`` that times another one's turn methods into ``stages``."""

    _STAGES = {"acquire_lease": "lease", "head": "lease", "load": "lease", "commit": "commit"}

    def __init__(self, backend: Any, stages: Stages) -> None:
        self._backend = backend
        self._stages = stages

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        stage = self._STAGES.get(name)
        if stage is None:
            return attr

        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args)
            finally:
                self._stages.add(stage, time.perf_counter() - t0)

        return timed


class WithoutRecords:
    """A ``SessionBackend`` that hands another one no turn reports (``--records``: the same store
    keeping no turn records, to measure what recording a turn costs)."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def acquire_lease(self, session_id: str, owner: str, ttl_seconds: float, queue: bool, report: Any = None) -> bool:
        return bool(self._backend.acquire_lease(session_id, owner, ttl_seconds, queue))

    def release_lease(self, session_id: str, owner: str, report: Any = None) -> None:
        self._backend.release_lease(session_id, owner)

    def commit(self, changes: Any) -> Any:
        import dataclasses

        return self._backend.commit(dataclasses.replace(changes, report=None))


class TimedEngineMixin:
    stages: Stages

    async def generate_turn_async(self, agent: Any, history: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await super().generate_turn_async(agent, history)  # type: ignore[misc]
        finally:
            self.stages.add("engine", time.perf_counter() - t0)


async def run_timed(store: Any, turns: int, stages: Stages, counts: Any) -> float:
    from turns import InstantEngine

    from chatflow_agent import Agent, Runner

    class Timed(TimedEngineMixin, InstantEngine):
        pass

    engine = Timed()
    engine.stages = stages
    runner = Runner(Agent(name="Bench", instructions="bench"), session_store=store, engine=engine)
    await runner.run_async("warm-up-breakdown", "hello")  # opens the pool thread's connection
    stages.ms.clear()
    counts.reset()
    t0 = time.perf_counter()
    for t in range(turns):
        await runner.run_async("breakdown", f"message {t}")
    return time.perf_counter() - t0


# ---- the run ---------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", "-n", type=int, default=1000)
    ap.add_argument("--rounds", "-r", type=int, default=3)
    ap.add_argument("--database", help="a PostgreSQL server URL (adds the psycopg floor and Django on PostgreSQL)")
    ap.add_argument("--records", action="store_true",
                    help="also the Django stores keeping no turn records (what recording a turn costs)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        scratch = setup(args.database, tmp)
        try:
            out = measure(args, tmp, scratch)
        finally:
            if scratch:
                drop(args.database, scratch)
    report(out)


def measure(args: argparse.Namespace, tmp: Path, scratch: str | None) -> dict[str, Any]:
    from turns import run_turns

    from chatflow_agent import SQLiteSessionStore
    from chatflow_agent.core.memory import PersistentSessionStore
    from sessions_app.roundtrips import Counts, count_connections
    from sessions_app.store import DjangoBackend, DjangoSessionStore

    n = args.turns
    pg = f"{pg_url(args.database).rsplit('/', 1)[0]}/{scratch}" if scratch else None

    def runtime_store() -> Any:
        (tmp / "runtime.db").unlink(missing_ok=True)
        return SQLiteSessionStore(tmp / "runtime.db")

    stores: dict[str, Any] = {"sqlite_store": runtime_store, "django_sqlite": lambda: DjangoSessionStore()}
    floors: dict[str, Any] = {"sqlite_floor": lambda: sqlite_floor(tmp / "floor.db", n)}
    if pg:
        stores["django_pg"] = lambda: DjangoSessionStore(using="pg")
        floors["psycopg_floor"] = lambda: psycopg_floor(pg, n)
    if args.records:
        for name, using in (("django_sqlite", "default"), ("django_pg", "pg")):
            if name in stores:
                stores[f"{name}_no_records"] = lambda using=using: no_records_store(using)
    samples: dict[str, list[float]] = {}
    cpu_samples: dict[str, list[float]] = {}  # this process's CPU (every thread), less sensitive to others' load
    for _ in range(args.rounds):
        for name, floor in floors.items():
            samples.setdefault(f"{name}/sequential", []).append(floor() * 1000 / n)
        for name, make in stores.items():
            for label, sessions in (("sequential", 1), ("concurrent", SESSIONS)):
                store = make()
                store.clear()
                cpu = time.process_time()
                seconds = asyncio.run(run_turns(store, n, sessions))
                cpu = time.process_time() - cpu
                store.clear()
                store.close()
                samples.setdefault(f"{name}/{label}", []).append(seconds * 1000 / n)
                cpu_samples.setdefault(f"{name}/{label}", []).append(cpu * 1000 / n)
    ms = {key: round(statistics.median(v), 3) for key, v in samples.items()}
    cpu_ms = {key: round(statistics.median(v), 3) for key, v in cpu_samples.items()}

    breakdown: dict[str, Any] = {}
    from django.conf import settings

    for name, using in (("django_sqlite", "default"), ("django_pg", "pg")):
        if name not in stores:
            continue
        counts, stages = Counts(), Stages()
        stop = count_connections(counts)
        store = PersistentSessionStore(TimedBackend(DjangoBackend(using), stages),  # type: ignore[arg-type]
                                       default_max_turns=settings.CHATFLOW_MAX_TURNS,
                                       lease_ttl_seconds=settings.CHATFLOW_LEASE_SECONDS)
        store.clear()
        turns = min(n, 500)
        written = bytes_written()
        seconds = asyncio.run(run_timed(store, turns, stages, counts))
        written = bytes_written() - written if written is not None else None
        store.clear()
        store.close()
        stop()
        total = seconds * 1000
        per = {stage: round(stages.ms[stage] / turns, 3) for stage in ("lease", "engine", "commit")}
        per["other"] = round((total - sum(stages.ms[s] for s in ("lease", "engine", "commit"))) / turns, 3)
        breakdown[name] = {
            "ms_per_turn": round(total / turns, 3),
            "round_trips": round(counts.round_trips / turns, 2),
            "write_transactions": round(counts.write_transactions / turns, 2),
            "statements": {k: round(v / turns, 2) for k, v in counts.statements.most_common()},
            "ms": per,
        }
        if name == "django_sqlite" and written is not None:  # PostgreSQL writes in its own processes
            breakdown[name]["kib_written"] = round(written / turns / 1024, 1)
    return {"turns": n, "rounds": args.rounds, "ms_per_turn": ms, "cpu_ms_per_turn": cpu_ms, "breakdown": breakdown}


def bytes_written() -> int | None:
    """Bytes this process has passed to ``write``-like system calls (Linux ``/proc/self/io`` ``wchar``): on
    SQLite, the WAL frames and checkpoints of its turns. None where the kernel does not say."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("wchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def no_records_store(using: str) -> Any:
    from django.conf import settings

    from chatflow_agent.core.memory import PersistentSessionStore
    from sessions_app.store import DjangoBackend

    # The store's default pool (4 threads; DjangoSessionStore runs 8 on PostgreSQL): compare the
    # PostgreSQL figures sequentially only.
    return PersistentSessionStore(WithoutRecords(DjangoBackend(using)),  # type: ignore[arg-type]
                                  default_max_turns=settings.CHATFLOW_MAX_TURNS,
                                  lease_ttl_seconds=settings.CHATFLOW_LEASE_SECONDS)


def report(out: dict[str, Any]) -> None:
    ms = out["ms_per_turn"]
    ratios = {}
    for name in ("django_sqlite", "django_pg"):
        for label in ("sequential", "concurrent") if name == "django_sqlite" else ("sequential",):
            if f"{name}_no_records/{label}" in ms:
                ratios[f"{name} records on/off {label}"] = round(
                    ms[f"{name}/{label}"] / ms[f"{name}_no_records/{label}"], 2)
    for label in ("sequential", "concurrent"):
        ratios[f"django_sqlite/sqlite_store {label}"] = round(
            ms[f"django_sqlite/{label}"] / ms[f"sqlite_store/{label}"], 2)
    if "django_pg/sequential" in ms:
        ratios["django_pg/psycopg_floor sequential"] = round(
            ms["django_pg/sequential"] / ms["psycopg_floor/sequential"], 2)
        out["django_pg_concurrent_turns_per_s"] = round(1000 / ms["django_pg/concurrent"])
    out["ratios"] = ratios
    print(f"{'path':34} {'ms/turn':>9} {'turns/s':>9} {'CPU ms/turn':>12}")
    for key, value in ms.items():
        cpu = out["cpu_ms_per_turn"].get(key)
        print(f"{key:34} {value:9.3f} {1000 / value:9.0f} {'' if cpu is None else f'{cpu:12.3f}'}")
    for key, value in ratios.items():
        print(f"{key:34} {value:9.2f}x")
    for name, b in out["breakdown"].items():
        stages = ", ".join(f"{k} {v}" for k, v in b["ms"].items())
        written = f", KiB written {b['kib_written']}" if "kib_written" in b else ""
        print(f"{name}: {b['ms_per_turn']} ms/turn sequential (instrumented); round trips {b['round_trips']}, "
              f"write transactions {b['write_transactions']}{written}; ms: {stages}; statements {b['statements']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
