"""Webhook acknowledgement latency under load, and queue throughput, on SQLite and PostgreSQL.

    python bench/webhooks.py                       # both databases, defaults below
    python bench/webhooks.py --db sqlite --requests 3000 --concurrency 32

Per database, on a fresh migrated database:

1. **Ack latency.** One daphne process with its embedded queue worker (the embedded default) serves
   ``/webhooks/whatsapp/``; this script, a second process, is the load generator: ``--requests`` signed
   Cloud API payloads (one text message each, from 200 senders, 10 % of them redeliveries of an earlier
   message) sent open-loop at ``--rate`` per second (httpx). The worker plays the turns (demo engine) and
   sends replies to a fake Graph API (a process of its own) while the load runs. Reported: p50/p90/p99/max of
   the request round trip and the turns completed during the load; then a closed-loop saturation run
   over ``--concurrency`` connections (acks per second, its p99). Repeated with the turns played by a
   ``chatflow_worker`` process instead (``CHATFLOW_EMBEDDED_WORKER=off`` on daphne), and with no turns
   at all (the acknowledgement path alone; its deliveries stay queued and count in no turn figure).
   First of all, the same open-loop run against the fake Graph API (a stdlib server that only answers
   200) measures the load generator's own share of a round trip, printed under the table.
2. **Queue throughput.** ``--turns`` deliveries are queued (daphne with the embedded worker off), then
   ``manage.py chatflow_worker --drain`` processes (1, and on PostgreSQL also 4, × 8 slots) play them:
   turns per second from the first worker's "ready" (Django set up) to the last exit, replies included;
   then the cost breakdown per delivery the workers measured (``chatflow_worker --costs``: database
   round trips and write transactions by table group, ms by stage, worker CPU) and the whole
   machine's CPU per turn during the drain (``/proc/stat``: the database and everything else too).

Prints a table and a JSON line; the README's performance section records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import multiprocessing
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
SECRET = "bench-app-secret"
PG = "postgres://postgres@127.0.0.1:5432/{name}"
MODES = ("embedded", "worker process", "no turns")


class FakeGraph:
    """A loopback Graph API in a process of its own: counts POST /{phone_number_id}/messages.

    Its own process, so that receiving the replies does not compete for the load generator's GIL
    (which would add to the acknowledgement latencies this script measures).
    """

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._count = ctx.Value("q", 0)
        ready = ctx.Queue()
        self.process = ctx.Process(target=_serve_graph, args=(self._count, ready), daemon=True)
        self.process.start()
        self.base = f"http://127.0.0.1:{ready.get(timeout=30)}"

    @property
    def count(self) -> int:
        return self._count.value


def _serve_graph(counter, ready) -> None:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes; with Nagle's algorithm the second waits for the
        # client's delayed ACK (~40 ms on Linux loopback) — every reply and floor request did before.
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with counter.get_lock():
                counter.value += 1
            body = b'{"messages": [{"id": "wamid.out"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address) -> None:
            pass  # a worker stopped with a keep-alive connection open: not news

    server = Server(("127.0.0.1", 0), Handler)
    ready.put(server.server_address[1])
    server.serve_forever()


def payload(wamid: str, sender: int, text: str) -> bytes:
    value = {"messaging_product": "whatsapp",
             "metadata": {"display_phone_number": "15550000", "phone_number_id": "106540352242922"},
             "contacts": [{"profile": {"name": f"Bench {sender}"}, "wa_id": f"1555{sender:06d}"}],
             "messages": [{"from": f"1555{sender:06d}", "id": wamid, "timestamp": "1764500000", "type": "text",
                           "text": {"body": text}}]}
    return json.dumps({"object": "whatsapp_business_account",
                       "entry": [{"id": "W", "changes": [{"field": "messages", "value": value}]}]}).encode()


def signed(body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json",
            "X-Hub-Signature-256": "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()}


def env_for(db_url: str, graph: str, embedded: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CHATFLOW_", "WHATSAPP_", "DATABASE_URL"))}
    env.update(CHATFLOW_ENV_FILE="", DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1",
               SECURE_SSL_REDIRECT="0", DATABASE_URL=db_url, CHATFLOW_ENGINE="demo",
               WHATSAPP_APP_SECRET=SECRET, WHATSAPP_ACCESS_TOKEN="bench", WHATSAPP_API_BASE=graph,
               CHATFLOW_EMBEDDED_WORKER=embedded)
    return env


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daphne(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                             "chatflow_site.asgi:application"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/healthz/", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit("daphne did not start")


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
        import sqlite3

        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"), timeout=30)) as conn:
            return conn.execute(sql + "?", (status,)).fetchone()[0]
    import psycopg

    with psycopg.connect(db_url) as conn:
        return conn.execute(sql + "%s", (status,)).fetchone()[0]


async def load(base: str, requests: int, concurrency: int, tag: str, rate: float = 0.0) -> list[float]:
    """Send ``requests`` webhooks; open loop at ``rate`` per second when given (the latency a provider
    sees at that arrival rate), else closed loop over ``concurrency`` connections (saturation)."""
    bodies: list[bytes] = []
    for i in range(requests):
        n = i - 7 if i % 10 == 9 else i  # every tenth request redelivers an earlier message
        bodies.append(payload(f"wamid.{tag}.{n}", n % 200, f"Where is order {n}?"))
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
        async def send(body: bytes) -> None:
            started = time.perf_counter()
            r = await client.post("/webhooks/whatsapp/", content=body, headers=signed(body))
            latencies.append(time.perf_counter() - started)
            if r.status_code != 200:
                raise SystemExit(f"ack failed: {r.status_code} {r.text}")

        if rate:
            start = time.perf_counter()
            tasks = []
            for i, body in enumerate(bodies):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(send(body)))
            await asyncio.gather(*tasks)
        else:
            queue: asyncio.Queue[bytes] = asyncio.Queue()
            for b in bodies:
                queue.put_nowait(b)

            async def user() -> None:
                while not queue.empty():
                    await send(queue.get_nowait())

            await asyncio.gather(*(user() for _ in range(concurrency)))
    return latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 10) - 1] * 1000 if len(values) > 1 else values[0] * 1000


def wait_drained(db_url: str, total: int, timeout: float) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if count(db_url, "done") >= total:
            break
        time.sleep(0.5)
    return time.perf_counter() - started


def ack_run(db_url: str, graph: FakeGraph, args: argparse.Namespace, mode: str) -> dict:
    """Open-loop latency at ``--rate`` while turns run, then a closed-loop saturation run."""
    embedded, turns = mode == "embedded", mode != "no turns"
    env = env_for(db_url, graph.base, "on" if embedded else "off")
    server, base = start_daphne(env)
    worker = None if embedded or not turns else subprocess.Popen(
        [sys.executable, "manage.py", "chatflow_worker", "--slots", "8", "--poll", "0.05"], cwd=REPO, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    tag = {"embedded": "emb", "worker process": "sep"}.get(mode, "idle")

    def drained(total: int) -> None:
        if turns:
            wait_drained(db_url, total, 600)

    try:
        base_done = count(db_url, "done")
        asyncio.run(load(base, 50, 4, f"{tag}warm"))  # warm-up: imports, connections, first turns
        drained(base_done + 45)
        before = count(db_url, "done")
        started = time.perf_counter()
        lat = asyncio.run(load(base, args.requests, args.concurrency, f"{tag}load", rate=args.rate))
        elapsed = time.perf_counter() - started
        during = count(db_url, "done") - before
        unique = len({i - 7 if i % 10 == 9 else i for i in range(args.requests)})
        drained(before + unique)
        sat = asyncio.run(load(base, args.requests // 2, args.concurrency, f"{tag}sat"))
        sat_s = sum(sat) / args.concurrency
        drained(before + unique + len({i - 7 if i % 10 == 9 else i for i in range(args.requests // 2)}))
    finally:
        stop(server)
        if worker is not None:
            stop(worker)
    return {"requests": args.requests, "rate_per_s": args.rate, "achieved_per_s": round(args.requests / elapsed),
            "p50_ms": round(pct(lat, 50), 1), "p90_ms": round(pct(lat, 90), 1),
            "p99_ms": round(pct(lat, 99), 1), "max_ms": round(max(lat) * 1000, 1), "turns_during_load": during,
            "saturation_acks_per_s": round(len(sat) / sat_s), "saturation_p99_ms": round(pct(sat, 99), 1)}


def bench_db(kind: str, args: argparse.Namespace, graph: FakeGraph) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="chatflow-bench-webhooks-"))
    name = f"chatflow_bench_webhooks_{os.getpid()}"
    if kind == "sqlite":
        db_url = f"sqlite:///{tmp / 'bench.db'}"
    else:
        import psycopg

        with psycopg.connect(PG.format(name="postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        db_url = PG.format(name=name)
    out: dict = {"db": kind}
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=REPO,
                       env=env_for(db_url, graph.base, "off"), check=True)
        # 1. ack latency while turns run: in the server process (embedded), or in a worker process
        out["ack"] = {}
        for mode in args.modes:
            out["ack"][mode] = ack_run(db_url, graph, args, mode)
        # 2. queue throughput with standalone workers
        out["throughput"] = []
        for workers in ([] if args.no_throughput else [1] if kind == "sqlite" else [1, 4]):
            env_off = env_for(db_url, graph.base, "off")
            server, base = start_daphne(env_off)
            try:
                tag = f"tp{workers}"
                asyncio.run(load(base, args.turns * 10 // 9 + 1, args.concurrency, tag))
            finally:
                stop(server)
            queued = count(db_url, "queued")
            replies_before = graph.count
            procs = [subprocess.Popen([sys.executable, "manage.py", "chatflow_worker", "--drain", "--slots", "8",
                                       "--poll", "0.05", "--costs"], cwd=REPO, env=env_off, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True) for _ in range(workers)]
            ready: list[float] = []
            reports: list[dict] = []
            cpu: list[float] = []

            def wait_ready(proc: subprocess.Popen, ready: list[float] = ready, cpu: list[float] = cpu,
                           reports: list[dict] = reports) -> None:
                proc.stdout.readline()  # "… ready": Django is set up, the worker polls from now on
                ready.append(time.perf_counter())
                if len(ready) == 1:
                    cpu.append(machine_cpu_s())
                for line in proc.stdout.read().splitlines():
                    if line.startswith("costs "):
                        reports.append(json.loads(line.removeprefix("costs ")))

            readers = [threading.Thread(target=wait_ready, args=(p,)) for p in procs]
            for t in readers:
                t.start()
            for p in procs:
                p.wait()
            for t in readers:
                t.join()
            started = min(ready)  # process start-up (imports, Django setup) is not queue time
            elapsed = time.perf_counter() - started
            machine = machine_cpu_s() - cpu[0]
            out["throughput"].append({"workers": workers, "slots": 8, "turns": queued,
                                      "turns_per_s": round(queued / elapsed, 1),
                                      "replies": graph.count - replies_before,
                                      "machine_cpu_ms_per_turn": round(machine * 1000 / max(queued, 1), 2),
                                      "machine_cpu_busy": round(machine / elapsed / (os.cpu_count() or 1), 2),
                                      "costs": merge_costs(reports)})
    finally:
        if kind == "postgres":
            import psycopg

            with psycopg.connect(PG.format(name="postgres"), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return out


def machine_cpu_s() -> float:
    """CPU seconds the whole machine spent busy since boot (every core: user, nice, system, irq)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]
    return busy / os.sysconf("SC_CLK_TCK")


def merge_costs(reports: list[dict]) -> dict:
    """The workers' ``costs`` reports as one: per-delivery figures weighted by each worker's deliveries."""
    total = sum(r["deliveries"] for r in reports)
    if not total:
        return {}

    def merged(path: list[str]) -> dict:
        keys = sorted({k for r in reports for k in _dig(r["per_delivery"], path)})
        return {k: round(sum(_dig(r["per_delivery"], path).get(k, 0) * r["deliveries"] for r in reports) / total, 3)
                for k in keys}

    return {"deliveries": total, "worker_cpu_ms": round(sum(r["cpu_s"] for r in reports) * 1000 / total, 3),
            "round_trips": merged(["round_trips"]), "write_transactions": merged(["write_transactions"]),
            "ms_by_stage": merged(["ms_by_stage"])}


def _dig(d: dict, path: list[str]) -> dict:
    for key in path:
        d = d.get(key, {})
    return d


def print_costs(results: list[dict]) -> None:
    """Per delivery, as the workers measured it (``chatflow_worker --costs``)."""
    for r in results:
        for t in r["throughput"]:
            c = t.get("costs")
            if not c:
                continue
            print(f"\n{r['db']} {t['workers']}×{t['slots']}, per delivery ({c['deliveries']} deliveries): "
                  f"worker CPU {c['worker_cpu_ms']} ms, whole machine CPU {t['machine_cpu_ms_per_turn']} ms "
                  f"(machine {t['machine_cpu_busy']:.0%} busy during the drain)")
            for what in ("round_trips", "write_transactions"):
                print(f"  {what.replace('_', ' '):<20}" + "  ".join(f"{k} {v}" for k, v in c[what].items()))
            print("  ms by stage         " + "  ".join(f"{k} {v}" for k, v in c["ms_by_stage"].items()))
    print("  (stages: claim, turn = lease + load + commit + engine, reply send, finish; wall time per delivery,"
          " summed over concurrent slots)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=50.0, help="webhooks per second in the latency run")
    parser.add_argument("--concurrency", type=int, default=16, help="connections in the saturation run")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES),
                        help="which acknowledgement runs (default: all three; none: throughput only)")
    parser.add_argument("--no-throughput", action="store_true", help="skip the queue throughput runs")
    args = parser.parse_args()
    graph = FakeGraph()
    # The load generator's own share of every round trip: the same open-loop run against the fake
    # Graph API (a stdlib HTTP server that only answers 200), before any database run.
    floor = asyncio.run(load(graph.base, args.requests, args.concurrency, "floor", rate=args.rate))
    floor_ms = {f"p{q}_ms": round(pct(floor, q), 1) for q in (50, 90, 99)} | {"max_ms": round(max(floor) * 1000, 1)}
    results = [bench_db(kind, args, graph) for kind in (["sqlite", "postgres"] if args.db == "both" else [args.db])]
    print(f"{'db':<9}{'turns run in':<16}{'rate/s':>7}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}{'max ms':>8}"
          f"{'turns during':>13}{'sat. acks/s':>12}{'sat. p99':>9}")
    for r in results:
        for mode, a in r["ack"].items():
            print(f"{r['db']:<9}{mode:<16}{a['achieved_per_s']:>7}{a['p50_ms']:>8}{a['p90_ms']:>8}{a['p99_ms']:>8}"
                  f"{a['max_ms']:>8}{a['turns_during_load']:>13}{a['saturation_acks_per_s']:>12}"
                  f"{a['saturation_p99_ms']:>9}")
    print(f"{'(load generator alone, no-op server)':<32}{floor_ms['p50_ms']:>8}{floor_ms['p90_ms']:>8}"
          f"{floor_ms['p99_ms']:>8}{floor_ms['max_ms']:>8}")
    print(f"\n{'db':<9}{'workers×slots':>14}{'turns':>7}{'turns/s':>9}{'replies':>9}")
    for r in results:
        for t in r["throughput"]:
            print(f"{r['db']:<9}{str(t['workers']) + '×' + str(t['slots']):>14}{t['turns']:>7}"
                  f"{t['turns_per_s']:>9}{t['replies']:>9}")
    print_costs(results)
    print(json.dumps({"load_generator_alone": floor_ms, "databases": results}))


if __name__ == "__main__":
    main()
