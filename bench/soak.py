"""Soak: webhooks at a steady rate for minutes on PostgreSQL, two daphne and two worker processes.

    python bench/soak.py                          # 20 webhooks/s for 5 minutes
    python bench/soak.py --rate 20 --minutes 5 --database postgres://postgres@127.0.0.1:5432/postgres

A fresh migrated database (created next to ``--database``'s and dropped at the end); two daphne
processes with the embedded worker off; two ``manage.py chatflow_worker --slots 8`` processes; the
fake Graph API of ``bench/webhooks.py`` (a process of its own on loopback) receives the replies. This
script sends signed WhatsApp payloads open-loop at ``--rate`` per second, alternating between the
two servers (200 senders, every tenth a redelivery of an earlier message). Reported: the deliveries
still queued or running when sending stops, the time to drain them, acknowledgement p50/p99/max,
and each worker's resident memory (``/proc/<pid>/status`` VmRSS) every 10 s with the growth over
the last 3 minutes of sending. Prints a table and a JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import webhooks as wb  # noqa: E402  (the shared fake Graph API, payloads and process helpers)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def send_all(bases: list[str], total: int, rate: float) -> list[float]:
    latencies: list[float] = []
    clients = [httpx.AsyncClient(base_url=b, timeout=30, limits=httpx.Limits(max_connections=32)) for b in bases]

    async def send(i: int) -> None:
        n = i - 7 if i % 10 == 9 else i
        body = wb.payload(f"wamid.soak.{n}", n % 200, f"Where is order {n}?")
        started = time.perf_counter()
        r = await clients[i % len(clients)].post("/webhooks/whatsapp/", content=body, headers=wb.signed(body))
        latencies.append(time.perf_counter() - started)
        if r.status_code != 200:
            raise SystemExit(f"ack failed: {r.status_code} {r.text[:200]}")

    try:
        start = time.perf_counter()
        tasks = []
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(send(i)))
        await asyncio.gather(*tasks)
    finally:
        for c in clients:
            await c.aclose()
    return latencies


def open_count(db_url: str) -> int:
    return wb.count(db_url, "queued") + wb.count(db_url, "running")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20.0, help="webhooks per second")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--database", default=wb.PG.format(name="postgres"),
                        help="a PostgreSQL server's URL; the soak's database is created beside it")
    args = parser.parse_args()
    import psycopg

    name = f"chatflow_bench_soak_{int(time.time())}"
    admin = args.database
    server_url = admin.rsplit("/", 1)[0]
    db_url = f"{server_url}/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    graph = wb.FakeGraph()
    env = wb.env_for(db_url, graph.base, "off")
    procs: list[subprocess.Popen] = []
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=wb.REPO, env=env, check=True)
        servers = [wb.start_daphne(env) for _ in range(2)]
        procs += [p for p, _ in servers]
        workers = [subprocess.Popen([sys.executable, "manage.py", "chatflow_worker", "--slots", "8", "--poll", "0.05"],
                                    cwd=wb.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True, start_new_session=True) for _ in range(2)]
        procs += workers
        for w in workers:
            w.stdout.readline()  # ready
        total = int(args.rate * args.minutes * 60)
        samples: list[dict] = []
        sending = threading.Event()
        sending.set()
        t0 = time.perf_counter()

        def sample() -> None:
            while sending.is_set():
                samples.append({"t_s": round(time.perf_counter() - t0), "rss_mb": [round(rss_mb(w.pid), 1)
                                                                                     for w in workers]})
                time.sleep(10)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        lat = asyncio.run(send_all([b for _, b in servers], total, args.rate))
        sent_s = time.perf_counter() - t0
        queued_at_end = open_count(db_url)
        sending.clear()
        drain_started = time.perf_counter()
        while open_count(db_url) and time.perf_counter() - drain_started < 900:
            time.sleep(0.5)
        drain_s = time.perf_counter() - drain_started
        final_rss = [round(rss_mb(w.pid), 1) for w in workers]
        done = wb.count(db_url, "done")
        replies = graph.count
    finally:
        for p in procs:
            wb.stop(p)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    last3 = [s for s in samples if s["t_s"] >= sent_s - 180]
    growth = [round(last3[-1]["rss_mb"][i] - last3[0]["rss_mb"][i], 1) for i in range(2)] if last3 else []
    out = {"rate_per_s": args.rate, "minutes": args.minutes, "webhooks": total, "sent_in_s": round(sent_s, 1),
           "open_when_sending_stopped": queued_at_end, "drain_s": round(drain_s, 1), "done": done,
           "replies": replies, "ack_p50_ms": round(wb.pct(lat, 50), 1), "ack_p99_ms": round(wb.pct(lat, 99), 1),
           "ack_max_ms": round(max(lat) * 1000, 1), "worker_rss_mb": samples, "worker_rss_final_mb": final_rss,
           "rss_growth_last_3_min_mb": growth}
    print(f"{total} webhooks at {args.rate}/s in {sent_s:.0f} s; open when sending stopped: {queued_at_end}; "
          f"drained in {drain_s:.1f} s; done {done}, replies {replies}")
    print(f"ack p50 {out['ack_p50_ms']} ms, p99 {out['ack_p99_ms']} ms, max {out['ack_max_ms']} ms")
    print("worker RSS (MB) every 10 s: " + "  ".join(f"{s['t_s']}s:{'/'.join(map(str, s['rss_mb']))}"
                                                     for s in samples))
    print(f"RSS growth over the last 3 minutes of sending: {growth} MB; at the end {final_rss} MB")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
