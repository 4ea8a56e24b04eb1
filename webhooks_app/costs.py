"""Where a queue worker's time goes, measured: ``chatflow_worker --costs`` prints it at exit.

A :class:`Costs` collects, for one process:

- wall time by stage of a delivery: ``claim``, ``turn`` (the runner's whole turn), ``reply send``,
  ``finish`` (the writes after the turn: ``finish``/``fail`` and ``complete``), timed by the worker;
  inside the turn, ``lease`` and ``load`` (statements outside a transaction on the lease and waiter
  tables, and on the session tables) and ``commit`` (from the store's
  ``session_committing`` signal, sent after the turn's commit hooks, to the end of the commit's transaction,
  the durable commit included);
- database round trips and write transactions, by table group (``queue``: the deliveries, ``lease``,
  ``session``, ``other``), counted on the driver's connection under every Django connection of the
  process (``sessions_app.roundtrips``: the store's statements run on the driver's cursor, which
  Django's ``execute_wrappers`` never see);
- the process's CPU time (user + system, ``resource.getrusage``).

Off unless installed: the worker then only calls :meth:`stage`, which times nothing without it.
"""

from __future__ import annotations

import contextlib
import resource
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from django.db import transaction

from sessions_app.roundtrips import Counts, count_connections
from sessions_app.store import session_committing

__all__ = ["Costs"]


class Costs:
    """``Costs()``; :meth:`install` once per process, then :meth:`report` (a dict of plain numbers)."""

    def __init__(self) -> None:
        self.deliveries = 0
        self._mutex = threading.Lock()
        self._ms: dict[str, float] = defaultdict(float)
        self._counts = Counts()
        self._stop: Callable[[], None] = lambda: None
        self._cpu0 = self._cpu()
        self._wall0 = time.perf_counter()

    @staticmethod
    def _cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    # ---- collecting ---------------------------------------------------------------------------
    def install(self) -> None:
        """Count on every database connection this process opens from now on, and time the store's commits."""
        self._stop = count_connections(self._counts)
        session_committing.connect(self._on_commit_start, weak=False)

    def uninstall(self) -> None:
        """Stop counting on connections opened from now on and stop timing commits."""
        self._stop()
        session_committing.disconnect(self._on_commit_start)

    def _add(self, stage: str, seconds: float) -> None:
        with self._mutex:
            self._ms[stage] += seconds * 1000

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Add the time inside to stage ``name``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._add(name, time.perf_counter() - started)

    def _on_commit_start(self, sender: Any, using: str = "default", **kwargs: Any) -> None:
        started = time.perf_counter()
        transaction.on_commit(lambda: self._add("commit", time.perf_counter() - started), using=using)

    # ---- reporting ----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Totals and per-delivery figures: ``{"deliveries", "wall_s", "cpu_s", "per_delivery": {…}}``."""
        n = max(self.deliveries, 1)
        counts = self._counts
        with self._mutex, counts.lock:
            ms, trips, writes = dict(self._ms), dict(counts.by_group), dict(counts.writes_by_group)
            ms["lease"] = counts.autocommit_seconds["lease"] * 1000
            ms["load"] = counts.autocommit_seconds["session"] * 1000
        engine = ms.get("turn", 0.0) - ms.get("lease", 0.0) - ms.get("load", 0.0) - ms.get("commit", 0.0)
        stages = {k: round(v / n, 3) for k, v in ms.items()} | {"engine (rest of the turn)": round(engine / n, 3)}
        cpu = self._cpu() - self._cpu0
        return {
            "deliveries": self.deliveries, "wall_s": round(time.perf_counter() - self._wall0, 3),
            "cpu_s": round(cpu, 3),
            "per_delivery": {
                "cpu_ms": round(cpu * 1000 / n, 3),
                "round_trips": {k: round(v / n, 2) for k, v in trips.items()} | {
                    "total": round(sum(trips.values()) / n, 2)},
                "write_transactions": {k: round(v / n, 2) for k, v in writes.items()} | {
                    "total": round(sum(writes.values()) / n, 2)},
                "ms_by_stage": stages,
            },
        }
