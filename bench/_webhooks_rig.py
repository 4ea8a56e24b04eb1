"""The rig of ``bench/webhooks.py``: the fake Graph API, the checkouts under test, their databases and
processes, and CPU read from ``/proc``. ``bench/soak.py`` uses it through ``webhooks``.

- :class:`FakeGraph`: a loopback Graph API, a stdlib asyncio server in a process of its own (off the
  load generator's GIL). It parses each request (request line, headers, a ``Content-Length`` body),
  counts it in shared memory and answers one 200 JSON body, keeping the connection alive.
- :class:`Tree`: one checkout of this project. Its databases are migrated once per kind with its own
  ``manage.py`` into a template; every measurement gets a fresh copy (``fresh_db``), so each drain
  starts from the same state whatever ran before it.
- CPU seconds: the whole machine (``/proc/stat``), the PostgreSQL server (every live ``postgres``
  process plus the postmaster's reaped children, so backends that exited are counted), one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import secrets
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
SECRET = "bench-app-secret"
PG = "postgres://postgres@127.0.0.1:5432/{name}"
TICK = os.sysconf("SC_CLK_TCK")

_BODY = b'{"messages": [{"id": "wamid.out"}]}'
_REPLY = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(_BODY)) + _BODY
_REFUSED = b"HTTP/1.1 411 Length Required\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


# ---- the fake Graph API -----------------------------------------------------------------------
class FakeGraph:
    """``FakeGraph()`` starts the server process; ``base`` is its URL, ``count`` the requests answered,
    ``cpu_s()`` the CPU seconds its process has used so far (``started_cpu_s`` of them before serving)."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._count = ctx.Value("q", 0, lock=False)  # one writer (the server's single thread)
        ready = ctx.Queue()
        self.process = ctx.Process(target=_serve_graph, args=(self._count, ready), daemon=True)
        self.process.start()
        self.base = f"http://127.0.0.1:{ready.get(timeout=30)}"
        self.started_cpu_s = self.cpu_s()  # its start-up (the spawn's imports) is not a reply's cost

    @property
    def count(self) -> int:
        return self._count.value

    def cpu_s(self) -> float:
        return process_cpu_s(self.process.pid)


class _GraphProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and pipelining; every complete request is counted and answered."""

    def __init__(self, counter) -> None:
        self.counter = counter
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (head_end := self.buffer.find(b"\r\n\r\n")) >= 0:
            length, close = _parse_head(bytes(self.buffer[:head_end]))
            if length is None:  # chunked or no length: not what the clients under test send
                self.transport.write(_REFUSED)
                self.transport.close()
                return
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return  # the body is still on its way
            del self.buffer[:end]
            self.counter.value += 1
            self.transport.write(_REPLY)
            if close:
                self.transport.close()
                return


def _parse_head(head: bytes) -> tuple[int | None, bool]:
    """(``Content-Length``, whether to close after the reply) from a request line and its headers."""
    lines = head.decode("latin-1").split("\r\n")
    method, _target, version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    connection = headers.get("connection")
    close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
    if "transfer-encoding" in headers:
        return None, True
    if "content-length" not in headers:
        return (0, close) if method in ("GET", "HEAD") else (None, True)
    return int(headers["content-length"]), close


def _serve_graph(counter, ready) -> None:
    async def serve() -> None:
        loop = asyncio.get_running_loop()
        # asyncio sets TCP_NODELAY on its TCP transports, and the reply goes out in one write anyway
        server = await loop.create_server(lambda: _GraphProtocol(counter), "127.0.0.1", 0, backlog=1024)
        ready.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(serve())


# ---- processes and databases ------------------------------------------------------------------
# Settings a run may set from its environment (where the workers run); every other CHATFLOW_ is the script's.
PASSED = ("CHATFLOW_WORKER_CPU", "CHATFLOW_WORKER_NICE", "CHATFLOW_WORKER_SLOTS")


def env_for(db_url: str, graph: str, embedded: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k in PASSED or not k.startswith(("CHATFLOW_", "WHATSAPP_", "DATABASE_URL", "PYTHONPATH"))}
    env.update(CHATFLOW_ENV_FILE="", DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1",
               SECURE_SSL_REDIRECT="0", DATABASE_URL=db_url, CHATFLOW_ENGINE="demo",
               WHATSAPP_APP_SECRET=SECRET, WHATSAPP_ACCESS_TOKEN="bench", WHATSAPP_API_BASE=graph,
               CHATFLOW_EMBEDDED_WORKER=embedded)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daphne(env: dict[str, str], cwd: Path = REPO) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "chatflow_site.asgi:application"], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/healthz/", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop(proc)
    raise SystemExit(f"daphne did not start in {cwd}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def count(db_url: str, status: str) -> int:
    """Deliveries with ``status``, read straight from the database (no Django process per poll)."""
    sql = "SELECT count(*) FROM chatflow_inbound_deliveries WHERE status = "
    if db_url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=30)) as conn:
            return conn.execute(sql + "?", (status,)).fetchone()[0]
    import psycopg

    with psycopg.connect(db_url) as conn:
        return conn.execute(sql + "%s", (status,)).fetchone()[0]


def pg_admin(*statements: str) -> None:
    import psycopg

    with psycopg.connect(PG.format(name="postgres"), autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)


class Tree:
    """A checkout of this project (``root``), named ``label`` in the output; ``key`` is identifier-safe."""

    def __init__(self, root: Path, label: str, key: str) -> None:
        self.root, self.label, self.key = root.resolve(), label, key
        if not (self.root / "manage.py").is_file():
            raise SystemExit(f"{root}: no manage.py, not a checkout of this project")
        self._tmp = Path(tempfile.mkdtemp(prefix=f"chatflow-bench-webhooks-{key}-"))
        self._templates: dict[str, str] = {}
        self._copies = 0
        self.has_costs = "--costs" in self.manage(["chatflow_worker", "--help"], self._sqlite("help")).stdout

    def manage(self, argv: list[str], db_url: str, graph: str = "http://127.0.0.1:9") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *argv], cwd=self.root, env=env_for(db_url, graph, "off"),
                              check=True, capture_output=True, text=True)

    def _sqlite(self, name: str) -> str:
        return f"sqlite:///{self._tmp / (name + '.db')}"

    def _pg_name(self, name: str) -> str:
        return f"chatflow_bench_webhooks_{os.getpid()}_{self.key}_{name}"

    def _template(self, kind: str) -> str:
        """The template database of ``kind``, migrated once with this tree's ``manage.py``."""
        if kind not in self._templates:
            if kind == "sqlite":
                url = self._sqlite("template")
            else:
                pg_admin(f'DROP DATABASE IF EXISTS "{self._pg_name("template")}"',
                         f'CREATE DATABASE "{self._pg_name("template")}"')
                url = PG.format(name=self._pg_name("template"))
            self.manage(["migrate", "-v", "0"], url)
            self._templates[kind] = url
        return self._templates[kind]

    @contextlib.contextmanager
    def fresh_db(self, kind: str) -> Iterator[str]:
        """A new copy of the migrated template of ``kind`` (its URL), removed afterwards."""
        template = self._template(kind)
        self._copies += 1
        name = f"copy{self._copies}"
        if kind == "sqlite":
            url = self._sqlite(name)
            with contextlib.closing(sqlite3.connect(template.removeprefix("sqlite:///"))) as src, \
                    contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as dst:
                src.backup(dst)
        else:
            pg_admin(f'CREATE DATABASE "{self._pg_name(name)}" TEMPLATE "{self._pg_name("template")}"')
            url = PG.format(name=self._pg_name(name))
        try:
            yield url
        finally:
            self._drop(kind, url)

    def _drop(self, kind: str, url: str) -> None:
        if kind == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(url.removeprefix("sqlite:///") + suffix).unlink(missing_ok=True)
        else:
            pg_admin(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')

    def close(self) -> None:
        """Drop the templates and the folder of the SQLite files."""
        for kind, url in self._templates.items():
            self._drop(kind, url)
        self._templates.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)


# ---- CPU from /proc ---------------------------------------------------------------------------
def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, as ``/proc/loadavg`` gives them."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def machine_cpu_s() -> float:
    """CPU seconds the whole machine spent busy since boot (every core: user, nice, system, irq)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy / TICK


def _stat(pid: int) -> tuple[str, list[str]] | None:
    """(command name, the fields after it) of ``/proc/<pid>/stat``; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    return comm, raw[raw.rindex(")") + 2:].split()  # [0] state, [1] ppid, [11] utime, [12] stime, [13:15] children


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used; 0 once it is gone."""
    stat = _stat(pid)
    return 0.0 if stat is None else (int(stat[1][11]) + int(stat[1][12])) / TICK


def postgres_cpu_s() -> float:
    """CPU seconds of the local PostgreSQL server: every live ``postgres`` process, plus what the
    postmaster's reaped children (backends that exited) used. 0 when no server runs here."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p))) and s[0] == "postgres"}
    masters = [pid for pid, (_comm, f) in stats.items() if int(f[1]) not in stats]
    total = 0
    for pid, (_comm, f) in stats.items():
        total += int(f[11]) + int(f[12])
        if pid in masters:
            total += int(f[13]) + int(f[14])
    return total / TICK


def cpu_sample(graph: FakeGraph) -> dict[str, float]:
    """CPU seconds so far: the whole machine, the PostgreSQL server, the fake Graph API."""
    return {"machine": machine_cpu_s(), "postgres": postgres_cpu_s(), "graph": graph.cpu_s()}


# ---- queue workers ----------------------------------------------------------------------------
class Workers:
    """``n`` ``manage.py chatflow_worker --slots 8 --poll 0.05`` processes of the checkout at ``root``
    (``--drain`` unless ``drain=False``; ``--costs`` when ``costs``), watched from their "ready" line to
    their exit: the window, each one's CPU inside it, the replies and CPU of everything else over it."""

    def __init__(self, root: Path, env: dict[str, str], n: int, graph: FakeGraph, costs: bool = False,
                 drain: bool = True) -> None:
        argv = [sys.executable, "manage.py", "chatflow_worker", "--slots", "8", "--poll", "0.05"]
        argv += ["--drain"] * drain + ["--costs"] * costs
        self.graph, self.reports = graph, []
        self._errors = [tempfile.TemporaryFile("w+") for _ in range(n)]
        self.procs = [subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                       start_new_session=True) for err in self._errors]
        self.ready_at: list[float | None] = [None] * n
        self.exit_at: list[float] = [0.0] * n
        self.cpu_s: list[float] = [0.0] * n
        self._lock = threading.Lock()
        self._first_ready = threading.Event()
        self._start: dict[str, float] = {}
        self._replies0 = 0
        self._threads = [threading.Thread(target=self._watch, args=(i,), daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _watch(self, i: int) -> None:
        proc = self.procs[i]
        cpu0 = 0.0
        if "ready" in proc.stdout.readline():  # Django is set up: the worker polls from now on
            cpu0 = process_cpu_s(proc.pid)
            with self._lock:
                self.ready_at[i] = time.perf_counter()
                if not self._start:
                    self._replies0, self._start = self.graph.count, cpu_sample(self.graph)
        self._first_ready.set()  # also when it died before "ready": nobody waits forever
        lines = proc.stdout.read().splitlines()
        _pid, status, usage = os.wait4(proc.pid, 0)  # reaped here, for its rusage: Popen never waits on it
        self.exit_at[i] = time.perf_counter()
        proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s[i] = usage.ru_utime + usage.ru_stime - cpu0
        self.reports += [json.loads(line.removeprefix("costs ")) for line in lines if line.startswith("costs ")]

    def wait_first_ready(self) -> None:
        self._first_ready.wait()

    def exited(self) -> bool:
        return all(not t.is_alive() for t in self._threads)

    def stop(self) -> None:
        """SIGTERM each (a worker finishes what it holds), then :meth:`join`."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        self.join()

    def join(self) -> dict[str, float]:
        """Wait for every worker to exit; the window: its seconds, replies sent and CPU seconds in it."""
        for t in self._threads:
            t.join()
        end, replies = cpu_sample(self.graph), self.graph.count
        for proc, err in zip(self.procs, self._errors, strict=True):
            if proc.returncode or None in self.ready_at:
                err.seek(0)
                raise SystemExit(f"chatflow_worker exited with {proc.returncode}:\n{err.read()[-3000:]}")
        window = {k: end[k] - self._start[k] for k in end} | {"workers": sum(self.cpu_s)}
        return window | {"elapsed_s": max(self.exit_at) - min(self.ready_at), "replies": replies - self._replies0,
                         "ready_spread_s": round(max(self.ready_at) - min(self.ready_at), 2)}

    @staticmethod
    def per_delivery(window: dict[str, float], deliveries: int) -> dict:
        """Turns/s and CPU ms per delivery of a :meth:`join` window."""
        per = max(deliveries, 1)
        rest = window["machine"] - window["postgres"] - window["workers"] - window["graph"]
        return {"turns_per_s": round(deliveries / window["elapsed_s"], 1),
                "cpu_ms_per_delivery": {k: round(v * 1000 / per, 2) for k, v in window.items()
                                        if k in ("machine", "postgres", "workers", "graph")}
                | {"rest": round(rest * 1000 / per, 2)},
                "machine_busy": round(window["machine"] / window["elapsed_s"] / (os.cpu_count() or 1), 2)}


def merge_costs(reports: list[dict]) -> dict:
    """The workers' ``costs`` reports as one: per-delivery figures weighted by each worker's deliveries."""
    total = sum(r["deliveries"] for r in reports)
    if not total:
        return {}

    def merged(key: str) -> dict:
        keys = sorted({k for r in reports for k in r["per_delivery"].get(key, {})})
        return {k: round(sum(r["per_delivery"].get(key, {}).get(k, 0) * r["deliveries"] for r in reports) / total, 3)
                for k in keys}

    return {"deliveries": total, "worker_cpu_ms": round(sum(r["cpu_s"] for r in reports) * 1000 / total, 3),
            "round_trips": merged("round_trips"), "write_transactions": merged("write_transactions"),
            "ms_by_stage": merged("ms_by_stage")}
