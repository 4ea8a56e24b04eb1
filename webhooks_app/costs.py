"""Where a queue worker's time goes, measured: ``chatflow_worker --costs`` prints it at exit.

A :class:`Costs` collects, for one process:

- wall time by stage of a delivery: ``claim``, ``turn`` (the runner's whole turn), ``reply send``,
  ``finish`` (the writes after the turn: ``finish``/``fail`` and ``complete``), timed by the worker;
  inside the turn, ``lease`` and ``load`` (the store's statements outside a transaction on the
  lease and waiter tables, and on the session tables) and ``commit`` (from the store's
  ``session_committing`` signal to the end of the commit's transaction, the durable commit included);
- database round trips and write transactions, by table group (``queue``: the deliveries, ``lease``,
  ``session``, ``other``), counted by a wrapper on every connection of the process
  (``connection.execute_wrappers``): each statement is a round trip, and each committed
  transaction adds its ``COMMIT`` (and its ``BEGIN`` on PostgreSQL, where the driver sends it
  apart); a write transaction is a writing statement in autocommit or a committed transaction that
  wrote;
- the process's CPU time (user + system, ``resource.getrusage``).

Off unless installed: the worker then only calls :meth:`stage`, which times nothing without it.
"""

from __future__ import annotations

import contextlib
import resource
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from django.db import connections, transaction
from django.db.backends.signals import connection_created

__all__ = ["Costs"]

_WRITES = ("insert", "update", "delete")


def _group(sql: str) -> str:
    if "chatflow_inbound_deliveries" in sql:
        return "queue"
    if "chatflow_session_leases" in sql or "chatflow_session_waiters" in sql:
        return "lease"
    if "chatflow_messages" in sql or "chatflow_sessions" in sql:
        return "session"
    return "other"


def _writes(sql: str) -> bool:
    head = sql.lstrip()[:16].lower()
    return head.startswith(_WRITES) or " for update" in sql.lower()


class Costs:
    """``Costs()``; :meth:`install` once per process, then :meth:`report` (a dict of plain numbers)."""

    def __init__(self) -> None:
        self.deliveries = 0
        self._mutex = threading.Lock()
        self._ms: dict[str, float] = defaultdict(float)
        self._round_trips: dict[str, int] = defaultdict(int)
        self._writes: dict[str, int] = defaultdict(int)
        self._local = threading.local()
        self._cpu0 = self._cpu()
        self._wall0 = time.perf_counter()

    @staticmethod
    def _cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    # ---- collecting ---------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap every database connection this process opens from now on, and time the store's commits."""
        from sessions_app.store import session_committing

        connection_created.connect(self._on_connection, weak=False)
        session_committing.connect(self._on_commit_start, weak=False)
        for conn in connections.all(initialized_only=True):
            self._on_connection(sender=None, connection=conn)

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

    def _on_connection(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if self._wrap not in connection.execute_wrappers:
            connection.execute_wrappers.append(self._wrap)

    def _on_commit_start(self, sender: Any, using: str = "default", **kwargs: Any) -> None:
        started = time.perf_counter()
        transaction.on_commit(lambda: self._add("commit", time.perf_counter() - started), using=using)

    def _wrap(self, execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        conn = context["connection"]
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = time.perf_counter() - started
            group, writes, atomic = _group(sql), _writes(sql), conn.in_atomic_block
            with self._mutex:
                self._round_trips[group] += 1
                if writes and not atomic:
                    self._writes[group] += 1
            if not atomic and group in ("lease", "session"):
                self._add("lease" if group == "lease" else "load", elapsed)
            if atomic:
                self._in_transaction(conn, group, writes)

    def _in_transaction(self, conn: Any, group: str, writes: bool) -> None:
        """Count the transaction's COMMIT (and BEGIN) once, when it commits; a write transaction if it wrote."""
        open_ = getattr(self._local, "open", None)
        if open_ is None:
            open_ = self._local.open = {}
        key = id(conn)
        if key not in open_:
            open_[key] = {"group": group, "writes": writes}
            extra = 2 if conn.vendor == "postgresql" else 1

            def committed() -> None:
                state = open_.pop(key, None) or {}
                with self._mutex:
                    self._round_trips[state.get("group", group)] += extra
                    if state.get("writes"):
                        self._writes[state.get("group", group)] += 1

            transaction.on_commit(committed, using=conn.alias)
        elif writes:
            open_[key]["writes"] = True
            if open_[key]["group"] == "other":
                open_[key]["group"] = group

    # ---- reporting ----------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Totals and per-delivery figures: ``{"deliveries", "wall_s", "cpu_s", "per_delivery": {…}}``."""
        n = max(self.deliveries, 1)
        with self._mutex:
            ms, trips, writes = dict(self._ms), dict(self._round_trips), dict(self._writes)
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
