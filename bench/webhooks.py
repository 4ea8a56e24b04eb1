"""Webhook queue throughput and acknowledgement latency, on SQLite and PostgreSQL, A/B against other checkouts.

    python bench/webhooks.py                                  # this checkout alone, both databases
    python bench/webhooks.py --vs /work/base607 --rounds 3    # and another checkout, interleaved
    python bench/webhooks.py --db postgres --modes draining --turns 600 --vs ../other

Run it under the shared lock (``flock /tmp/bench.lock python bench/webhooks.py …``): other benchmarks on
the machine move every figure. Every tree (this checkout, and each ``--vs DIR``, another checkout of this
project) runs its own processes — ``python`` is this one (``sys.executable``), the working directory that
tree's — on databases migrated with its own ``manage.py``: once per database kind into a template, then a
fresh copy for every measurement, so each starts from the same state. Replies go to a fake Graph API.

1. **Queue throughput, A/B.** Configurations: SQLite 1 worker × 8 slots, PostgreSQL 1 × 8 and 4 × 8. For each
   of ``--rounds`` rounds (default 3), each configuration is measured for every tree in turn (A B A B …): a
   daphne of that tree (embedded worker off) accepts ``--turns`` signed webhooks (plus 10 % redeliveries;
   ``--turns 600`` queues 601 deliveries), is stopped, then ``manage.py chatflow_worker --drain --slots 8
   --poll 0.05`` processes drain the backlog, without instrumentation. Turns/s run from the first worker's
   "ready" line (Django set up) to the last worker's exit, replies included. Each drain prints its turns
   (queued before it), deliveries done after it and replies the fake Graph API received (all three should
   match), and the CPU per delivery over the same window, measured from outside: the whole machine
   (``/proc/stat``), the PostgreSQL server (``utime + stime`` of the live ``postgres`` processes plus the
   postmaster's ``cutime + cstime``, so backends that exit count), the workers (each one's CPU at its exit,
   from ``os.wait4``, minus its CPU at its "ready" line, from ``/proc/<pid>/stat``) and the fake Graph API;
   "rest" is the machine less those three (this script, the kernel, anyone else's processes: ~0 on a quiet
   machine; slightly negative is accounting noise, ``/proc/stat`` being sampled per tick). "spread" is how
   long after the first worker the last one was ready (inside the timed window, as start-up contends).
   Summary per configuration: the median turns/s of each tree and the median of the per-round ratios
   (this / vs); on PostgreSQL, for each tree, the median of the per-round ratios 4 workers / 1 worker.
2. **Cost breakdown** (this checkout only): one more drain per database (1 × 8) with ``chatflow_worker
   --costs`` — database round trips and write transactions by table group, ms by stage (wall, summed over
   the slots), worker CPU — per delivery. Its instrumentation slows the worker: its turns/s are not
   compared. A tree whose worker has no ``--costs`` (found from its ``--help``) gets none.
3. **Acknowledgement latency** (``--modes``, default all four). ``--requests`` webhooks (one text message
   each, from 200 senders, 10 % redeliveries) sent open-loop at ``--rate`` per second by this process
   (httpx); p50/p90/p99/max of the request round trip.
   - ``draining`` (every tree, every round): a backlog of ``--turns`` deliveries, then ONE ``chatflow_worker
     --drain`` (8 slots); from its "ready" line until it exits, the open-loop webhooks go to the same
     daphne (so at most ``--requests``; the drain's length and turns/s are printed beside them). The window
     lasts until the worker has caught up with the backlog and the new webhooks: a few seconds for a fast
     tree (a p99 of a few hundred acks), all ``--requests`` for one slower than ``--rate``; a larger
     ``--turns`` lengthens it.
   - ``embedded``, ``worker process``, ``no turns`` (this checkout, once): daphne with its embedded worker;
     a ``chatflow_worker`` process beside daphne; no worker at all. Each followed by a closed-loop
     saturation run over ``--concurrency`` connections (acks/s, its p99).
   The floor — the load generator alone, the same open-loop run against the fake Graph API — is measured
   at the start and again at the end; ratios use the worse (higher p99) of the two.
4. **The fake Graph API**: a stdlib asyncio server in a process of its own (``bench/_webhooks_rig.py``)
   that parses each request, counts it and answers one 200 JSON body with keep-alive; its CPU per reply
   over the whole run is printed (it shares the two cores with everything measured).

Targets (issue 15), printed per database against the first ``--vs`` tree: this tree's turns/s ≥ 5× the vs
tree's; PostgreSQL 4 workers ≥ 1.5× one; acknowledgement p99 while draining ≤ 3× the floor. Prints tables
and one JSON line; docs/performance.md records the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from _webhooks_rig import (
    PG,
    REPO,
    SECRET,
    FakeGraph,
    Tree,
    Workers,
    count,
    env_for,
    load_average,
    merge_costs,
    start_daphne,
    stop,
)

__all__ = ["PG", "REPO", "FakeGraph", "count", "env_for", "payload", "signed", "start_daphne", "stop"]  # soak.py

MODES = ("draining", "embedded", "worker process", "no turns")
CONFIGS = {"sqlite": (1,), "postgres": (1, 4)}
TARGETS = {"speedup": 5.0, "scaling": 1.5, "ack_over_floor": 3.0}


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


def message_number(i: int) -> int:
    return i - 7 if i % 10 == 9 else i  # every tenth request redelivers an earlier message


async def load(base: str, requests: int, concurrency: int, tag: str, rate: float = 0.0,
               until: Callable[[], bool] | None = None) -> list[float]:
    """Send ``requests`` webhooks; open loop at ``rate`` per second when given (the latency a provider
    sees at that arrival rate; no more once ``until()`` is true), else closed loop over ``concurrency``
    connections (saturation). Returns each request's round trip in seconds."""
    numbers = map(message_number, range(requests))
    bodies = [payload(f"wamid.{tag}.{n}", n % 200, f"Where is order {n}?") for n in numbers]
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
            start, tasks = time.perf_counter(), []
            for i, body in enumerate(bodies):
                if (delay := start + i / rate - time.perf_counter()) > 0:
                    await asyncio.sleep(delay)
                if until is not None and until():
                    break
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
    """The ``q``-th percentile in ms, interpolated inside the samples (never above the maximum)."""
    if len(values) < 2:
        return values[0] * 1000
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1] * 1000


def latency(values: list[float]) -> dict:
    return {"acks": len(values), "p50_ms": round(pct(values, 50), 1), "p90_ms": round(pct(values, 90), 1),
            "p99_ms": round(pct(values, 99), 1), "max_ms": round(max(values) * 1000, 1)}


def backlog_requests(turns: int) -> int:
    return turns * 10 // 9 + 1  # with every tenth a redelivery: turns + 1 unique messages


@contextlib.contextmanager
def serving(tree: Tree, env: dict[str, str]) -> Iterator[str]:
    """A daphne of ``tree`` while inside (its base URL)."""
    server, base = start_daphne(env, tree.root)
    try:
        yield base
    finally:
        stop(server)


def drain(tree: Tree, kind: str, workers: int, graph: FakeGraph, args: argparse.Namespace,
          costs: bool = False) -> dict:
    """One throughput measurement on a fresh database of ``tree``: fill, then ``workers`` × 8 slots drain."""
    with tree.fresh_db(kind) as db_url:
        env = env_for(db_url, graph.base, "off")
        with serving(tree, env) as base:
            asyncio.run(load(base, backlog_requests(args.turns), args.concurrency, "fill"))
        queued = count(db_url, "queued")
        crew = Workers(tree.root, env, workers, graph, costs=costs)
        window = crew.join()
        done = count(db_url, "done")
    out = {"tree": tree.label, "db": kind, "workers": workers, "slots": 8, "instrumented": costs,
           "turns": queued, "done": done, "replies": window.pop("replies"), "ready_spread_s": window["ready_spread_s"]}
    out |= crew.per_delivery(window, queued)
    return out | ({"costs": merge_costs(crew.reports)} if costs else {})


def draining_run(tree: Tree, kind: str, graph: FakeGraph, args: argparse.Namespace) -> dict:
    """Acknowledgement latency at ``--rate`` while one worker drains a backlog of ``--turns`` deliveries."""
    with tree.fresh_db(kind) as db_url:
        env = env_for(db_url, graph.base, "off")
        with serving(tree, env) as base:
            asyncio.run(load(base, backlog_requests(args.turns), args.concurrency, "fill"))
            queued = count(db_url, "queued")
            crew = Workers(tree.root, env, 1, graph)
            crew.wait_first_ready()
            lat = asyncio.run(load(base, args.requests, args.concurrency, "ack", rate=args.rate, until=crew.exited))
            window = crew.join()
        done = count(db_url, "done")
    return {"tree": tree.label, "db": kind, "backlog": queued, "done": done, "replies": window["replies"],
            "drain_s": round(window["elapsed_s"], 1), "drain_turns_per_s": round(done / window["elapsed_s"], 1)
            } | latency(lat)


def ack_run(tree: Tree, kind: str, graph: FakeGraph, args: argparse.Namespace, mode: str) -> dict:
    """Open-loop latency at ``--rate`` while turns run (or none), then a closed-loop saturation run."""
    embedded, turns = mode == "embedded", mode != "no turns"
    with tree.fresh_db(kind) as db_url:
        env = env_for(db_url, graph.base, "on" if embedded else "off")
        crew = None if embedded or not turns else Workers(tree.root, env, 1, graph, drain=False)

        def drained(total: int) -> None:
            started = time.perf_counter()
            while turns and count(db_url, "done") < total and time.perf_counter() - started < 600:
                time.sleep(0.5)

        try:
            with serving(tree, env) as base:
                asyncio.run(load(base, 50, 4, "warm"))  # warm-up: imports, connections, first turns
                drained(45)
                before, started = count(db_url, "done"), time.perf_counter()
                lat = asyncio.run(load(base, args.requests, args.concurrency, "load", rate=args.rate))
                elapsed, during = time.perf_counter() - started, count(db_url, "done") - before
                drained(before + len(set(map(message_number, range(args.requests)))))
                sat = asyncio.run(load(base, args.requests // 2, args.concurrency, "sat"))
        finally:
            if crew is not None:
                crew.stop()
    return {"tree": tree.label, "db": kind, "mode": mode, "rate_per_s": args.rate,
            "achieved_per_s": round(args.requests / elapsed), **latency(lat), "turns_during_load": during,
            "saturation_acks_per_s": round(len(sat) * args.concurrency / sum(sat)),
            "saturation_p99_ms": round(pct(sat, 99), 1)}


def run_rounds(trees: list[Tree], kinds: list[str], graph: FakeGraph, args: argparse.Namespace) -> dict:
    """Every measurement, in order: interleaved rounds, then the instrumented drains, then the other modes."""
    drains: list[dict] = []
    draining: list[dict] = []
    for n in range(args.rounds):
        for kind in kinds:
            for workers in () if args.no_throughput else CONFIGS[kind]:
                for tree in trees:
                    drains.append(drain(tree, kind, workers, graph, args) | {"round": n + 1})
                    progress(drains[-1])
            for tree in trees if "draining" in args.modes else ():
                draining.append(draining_run(tree, kind, graph, args) | {"round": n + 1})
                progress(draining[-1])
    costs = [drain(trees[0], kind, 1, graph, args, costs=True) for kind in kinds
             if trees[0].has_costs and not args.no_throughput]
    ack = [ack_run(trees[0], kind, graph, args, mode) for kind in kinds for mode in args.modes if mode != "draining"]
    return {"drains": drains, "draining": draining, "instrumented": costs, "ack": ack}


def progress(row: dict) -> None:
    what = f"{row['workers']}×{row['slots']} {row['turns_per_s']} turns/s" if "workers" in row else \
        f"draining p99 {row['p99_ms']} ms"
    print(f"  round {row['round']} {row['db']} {row['tree']}: {what}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--vs", action="append", default=[], metavar="DIR", type=Path,
                        help="another checkout of this project to measure in the same run (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the A/B measurements")
    parser.add_argument("--requests", type=int, default=2000, help="webhooks in an open-loop latency run (at most)")
    parser.add_argument("--rate", type=float, default=50.0, help="webhooks per second in the latency runs")
    parser.add_argument("--concurrency", type=int, default=16, help="connections filling a backlog and saturating")
    parser.add_argument("--turns", type=int, default=1000, help="backlog drained in a throughput or draining run")
    parser.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES),
                        help="which acknowledgement runs (default: all four; none: throughput only)")
    parser.add_argument("--no-throughput", action="store_true", help="skip the queue throughput runs")
    args = parser.parse_args()
    graph = FakeGraph()
    started_load = load_average()
    trees = [Tree(REPO, "this", "t0")] + [Tree(d, str(d), f"t{i + 1}") for i, d in enumerate(args.vs)]
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    try:
        floors = [floor(graph, args)] if args.modes else []
        results = run_rounds(trees, kinds, graph, args)
        floors += [floor(graph, args)] if args.modes else []
    finally:
        for tree in trees:
            tree.close()
    print(f"\nload average at the start {started_load}, at the end {load_average()} (2 cores: above 2, something"
          " else ran too)")
    report(trees, results, floors, graph)


def floor(graph: FakeGraph, args: argparse.Namespace) -> dict:
    """The load generator's own share of every round trip: the open-loop run against the fake Graph API
    (after a warm-up: the first requests of a client pay its connections and imports)."""
    asyncio.run(load(graph.base, 50, 4, "floorwarm"))
    return latency(asyncio.run(load(graph.base, args.requests, args.concurrency, "floor", rate=args.rate)))


# ---- the report -------------------------------------------------------------------------------
def median_of(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def summarize(trees: list[Tree], results: dict, floors: list[dict]) -> dict:
    """Medians over the rounds, per-round ratios and their medians, the floor the ack ratios use."""
    labels = [t.label for t in trees]
    tps = {(d["round"], d["db"], d["workers"], d["tree"]): d["turns_per_s"] for d in results["drains"]}
    rounds = sorted({d["round"] for d in results["drains"]})
    configs = sorted({(d["db"], d["workers"]) for d in results["drains"]}, key=lambda c: (c[0] != "sqlite", c[1]))

    def ratios(a: tuple, b: tuple) -> list[float]:
        return [tps[(r, *a)] / tps[(r, *b)] for r in rounds if tps.get((r, *a)) and tps.get((r, *b))]

    throughput = [{"db": k, "workers": w,
                   "median_turns_per_s": {t: median_of([tps[(r, k, w, t)] for r in rounds]) for t in labels},
                   "median_ratio_vs": {t: median_of(ratios((k, w, labels[0]), (k, w, t))) for t in labels[1:]}}
                  for k, w in configs]
    scaling = {t: median_of(ratios(("postgres", 4, t), ("postgres", 1, t))) for t in labels}
    floor = max(floors, key=lambda f: f["p99_ms"]) if floors else None
    draining = [{"db": k, "tree": t} | draining_medians([a["p99_ms"] for a in results["draining"]
                                                         if (a["db"], a["tree"]) == (k, t)], floor)
                for k in dict.fromkeys(a["db"] for a in results["draining"]) for t in labels]
    return {"throughput": throughput, "postgres_4_over_1": scaling, "floor_used": floor, "draining": draining}


def draining_medians(p99s: list[float], floor: dict | None) -> dict:
    """Median ack p99 of the rounds, and the median of each round's p99 over the (worse) floor's."""
    over = [p / floor["p99_ms"] for p in p99s] if floor else []
    return {"median_p99_ms": median_of(p99s), "median_p99_over_floor": median_of(over)}


def print_acks(results: dict, floors: list[dict]) -> None:
    if not floors:
        return
    print(f"{'db':<9}{'tree':<18}{'turns run in':<16}{'rnd':>4}{'acks':>6}{'p50 ms':>8}{'p90 ms':>8}{'p99 ms':>8}"
          f"{'max ms':>8}{'  beside':<10}")
    for a in results["draining"]:
        print(f"{a['db']:<9}{a['tree'][-17:]:<18}{'draining':<16}{a['round']:>4}{a['acks']:>6}{a['p50_ms']:>8}"
              f"{a['p90_ms']:>8}{a['p99_ms']:>8}{a['max_ms']:>8}  drain {a['drain_s']} s, {a['drain_turns_per_s']} "
              f"turns/s ({a['done']} done: {a['backlog']} queued + the acks; {a['replies']} replies)")
    for a in results["ack"]:
        print(f"{a['db']:<9}{a['tree'][-17:]:<18}{a['mode']:<16}{'':>4}{a['acks']:>6}{a['p50_ms']:>8}{a['p90_ms']:>8}"
              f"{a['p99_ms']:>8}{a['max_ms']:>8}  at {a['achieved_per_s']}/s, {a['turns_during_load']} turns during;"
              f" saturation "
              f"{a['saturation_acks_per_s']} acks/s, p99 {a['saturation_p99_ms']} ms")
    for name, f in zip(("at the start", "at the end"), floors, strict=False):
        print(f"{'(load generator alone, no-op server, ' + name + ')':<53}{f['acks']:>6}{f['p50_ms']:>8}"
              f"{f['p90_ms']:>8}{f['p99_ms']:>8}{f['max_ms']:>8}")
    print(f"  ack ratios use the worse floor: p99 {max(f['p99_ms'] for f in floors)} ms")
    if any(a["acks"] < 1000 for a in results["draining"]):
        print("  (a p99 of n acks is about their (n/100)-th largest: under ~1,000 acks one stall moves it; the"
              " draining window lasts until the worker has caught up, so a larger --turns lengthens it)")


def print_drains(drains: list[dict]) -> None:
    if not drains:
        return
    print(f"\n{'db':<9}{'w×slots':>8}{'rnd':>4}  {'tree':<18}{'turns':>6}{'done':>6}{'replies':>8}{'turns/s':>9}"
          f"{'spread':>7}   CPU ms per delivery: {'machine':>7}{'postgres':>9}{'workers':>8}{'graph':>6}{'rest':>6}"
          f"{'busy':>6}")
    for d in drains:
        cpu = d["cpu_ms_per_delivery"]
        rnd = "cost" if d["instrumented"] else d["round"]
        print(f"{d['db']:<9}{str(d['workers']) + '×' + str(d['slots']):>8}{rnd:>4}  {d['tree'][-17:]:<18}"
              f"{d['turns']:>6}{d['done']:>6}{d['replies']:>8}{d['turns_per_s']:>9}{d['ready_spread_s']:>7}"
              f"{'':>24}{cpu['machine']:>7}"
              f"{cpu['postgres']:>9}{cpu['workers']:>8}{cpu['graph']:>6}{cpu['rest']:>6}{d['machine_busy']:>6.0%}")
    print("  (spread: seconds from the first worker's \"ready\" to the last's, inside the timed window; rest: the"
          " machine less the three before it — this script, the kernel, other users' processes; busy: the machine's"
          " share of its cores in the window; rnd cost: the instrumented drain, --costs, not compared)")


def print_summary(summary: dict) -> None:
    for row in summary["throughput"]:
        medians = ", ".join(f"{t} {v}" for t, v in row["median_turns_per_s"].items())
        ratios = ", ".join(f"this / {t} {v}×" for t, v in row["median_ratio_vs"].items())
        print(f"{row['db']} {row['workers']}×8 median turns/s: {medians}" + (f"; median of per-round {ratios}"
                                                                               if ratios else ""))
    if any(row["db"] == "postgres" for row in summary["throughput"]):
        print("postgres 4 workers / 1, median of per-round ratios: "
              + ", ".join(f"{t} {v}×" for t, v in summary["postgres_4_over_1"].items()))
    for row in summary["draining"]:
        print(f"{row['db']} ack p99 while draining, median: {row['tree']} {row['median_p99_ms']} ms "
              f"= {row['median_p99_over_floor']}× the floor")


def print_costs(instrumented: list[dict]) -> None:
    """Per delivery, as the workers measured it (``chatflow_worker --costs``)."""
    for d in instrumented:
        c = d.get("costs")
        if not c:
            continue
        print(f"\n{d['db']} {d['workers']}×{d['slots']}, this tree, per delivery ({c['deliveries']} deliveries, "
              f"instrumented: {d['turns_per_s']} turns/s): worker CPU {c['worker_cpu_ms']} ms")
        for what in ("round_trips", "write_transactions", "ms_by_stage"):
            print(f"  {what.replace('_', ' '):<20}" + "  ".join(f"{k} {v}" for k, v in c[what].items()))
    if instrumented:
        print("  (stages: claim, turn = lease + load + commit + engine, reply send, finish; wall time per delivery,"
              " summed over concurrent slots)")


def target_line(name: str, ratio: float | None, target: float, at_most: bool = False) -> str:
    if ratio is None:
        return f"{name} n/a"
    met = ratio <= target if at_most else ratio >= target
    return f"{name} {ratio}× ({'≤' if at_most else '≥'} {target:g}×: {'met' if met else 'NOT met'})"


def print_targets(trees: list[Tree], summary: dict) -> None:
    vs = trees[1].label if len(trees) > 1 else None
    if not summary["throughput"] and not summary["draining"]:
        return
    print(f"\nTargets (issue 15), this tree{' against ' + vs if vs else ''}:")
    for kind in dict.fromkeys([r["db"] for r in summary["throughput"]] + [r["db"] for r in summary["draining"]]):
        parts = [target_line(f"turns/s {r['workers']}×8 / vs", r["median_ratio_vs"].get(vs), TARGETS["speedup"])
                 for r in summary["throughput"] if r["db"] == kind and vs]
        if kind == "postgres" and summary["postgres_4_over_1"]:
            parts.append(target_line("4 workers / 1", summary["postgres_4_over_1"][trees[0].label],
                                     TARGETS["scaling"]))
        parts += [target_line("ack p99 draining / floor", r["median_p99_over_floor"], TARGETS["ack_over_floor"], True)
                  for r in summary["draining"] if r["db"] == kind and r["tree"] == trees[0].label]
        print(f"  {kind:<9}" + "; ".join(parts))


def report(trees: list[Tree], results: dict, floors: list[dict], graph: FakeGraph) -> None:
    summary = summarize(trees, results, floors)
    print()
    print_acks(results, floors)
    print_drains(results["drains"] + results["instrumented"])
    print()
    print_summary(summary)
    print_costs(results["instrumented"])
    graph_ms = round((graph.cpu_s() - graph.started_cpu_s) * 1000 / max(graph.count, 1), 3)
    print(f"\nfake Graph API: {graph.count} requests answered, {graph_ms} ms CPU per reply (whole run, after start-up)")
    print_targets(trees, summary)
    trees_out = [{"label": t.label, "root": str(t.root), "has_costs": t.has_costs} for t in trees]
    print(json.dumps({"trees": trees_out, "floors": floors, "graph_cpu_ms_per_reply": graph_ms, "summary": summary}
                     | results))


if __name__ == "__main__":
    main()
