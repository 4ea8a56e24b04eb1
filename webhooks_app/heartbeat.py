"""Worker heartbeats: ``start(worker)`` keeps the worker's ``WorkerHeartbeat`` row fresh while it runs.

The beat runs as its own task on the worker's event loop, with its own thread (and so its own database
connection), so it never waits behind a turn and a turn never waits behind it. Each beat is one
``UPDATE`` (an ``INSERT`` the first time) and, once a minute, the deletion of rows silent for a day, a
sample of the webhook queue's depth for the dashboard (``QueueSample``: one ``COUNT`` by status and one
``INSERT``; samples older than :data:`KEEP_SAMPLES` are deleted) and a fold of the ended turn records into
the dashboard's rollups (``turns_app.rollups.fold``, at most :data:`FOLD_BATCHES` batches a minute, so a
backlog is worked off over the next minutes rather than in one long pause of the beats). Every
:data:`RETENTION_EVERY` seconds it also applies the retention policy (``sessions_app.retention.sweep``, at most
:data:`RETENTION_BATCHES` batches, so a backlog is likewise worked off over several runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections
from django.utils import timezone

from sessions_app import retention
from sessions_app.store import reopen_if_dropped
from turns_app import rollups
from webhooks_app import taskqueue
from webhooks_app.models import QueueSample, WorkerHeartbeat

__all__ = ["start", "stop", "beat", "forget", "sample_queue", "apply_retention"]

logger = logging.getLogger("webhooks_app.heartbeat")

FORGET_AFTER = timedelta(days=1)
KEEP_SAMPLES = timedelta(days=2)
#: A queue sample newer than this makes a worker's minute skip its own (several workers, one sample).
SAMPLE_EVERY = timedelta(seconds=50)
_PURGE_EVERY = 60.0
#: Fold batches (``turns_app.rollups.BATCH`` records each) a worker runs per minute at most.
FOLD_BATCHES = 10
#: Seconds between two retention runs of a worker, and the batches (``retention.BATCH`` sessions each) of one.
RETENTION_EVERY = 300.0
RETENTION_BATCHES = 50


def beat(owner: str, started_at: Any, processed: int, purge: bool = False) -> None:
    """Write ``owner``'s row (this process's host and pid) with ``last_beat`` now; blocking ORM."""
    reopen_if_dropped()  # opened again if the server dropped it meanwhile
    now = timezone.now()
    fields = {"last_beat": now, "processed": processed}
    if not WorkerHeartbeat.objects.filter(pk=owner).update(**fields):
        WorkerHeartbeat.objects.update_or_create(
            pk=owner, defaults={**fields, "host": socket.gethostname(), "pid": os.getpid(), "started_at": started_at})
    if purge:
        WorkerHeartbeat.objects.filter(last_beat__lt=now - FORGET_AFTER).delete()
        sample_queue(now)
        try:
            rollups.fold(batches=FOLD_BATCHES)
        except DatabaseError:  # the beat and the purge are written; the next minute's fold tries again
            logger.warning("Worker %s: folding turn records into the dashboard's rollups failed", owner,
                           exc_info=True)


def apply_retention() -> retention.Report | None:
    """One bounded retention run (blocking ORM; None when the policy keeps every session)."""
    policy = retention.Policy.from_settings()
    if policy.keeps_all:
        return None
    reopen_if_dropped()
    return retention.sweep(policy=policy, max_batches=RETENTION_BATCHES, via="worker")


def sample_queue(now: Any) -> QueueSample | None:
    """Write the webhook queue's depth now (deliveries queued and running, the health page's counts) and
    forget old samples; None (nothing written) when another worker sampled it less than a minute ago:
    every worker beats, one sample a minute is enough for the site."""
    if QueueSample.objects.filter(at__gt=now - SAMPLE_EVERY).exists():
        return None
    rows = taskqueue.depth()
    QueueSample.objects.filter(at__lt=now - KEEP_SAMPLES).delete()
    return QueueSample.objects.create(at=now, queued=sum(r.queued for r in rows), running=sum(r.running for r in rows))


def forget(owner: str) -> None:
    """Delete ``owner``'s row (its worker stopped cleanly)."""
    WorkerHeartbeat.objects.filter(pk=owner).delete()


def start(worker: Any) -> asyncio.Task[None]:
    """Beat for ``worker`` (its public ``owner`` and ``processed``) until :func:`stop`, which deletes the
    row. Call from the worker's event loop."""
    return asyncio.ensure_future(_beating(worker))


async def stop(task: asyncio.Task[None]) -> None:
    """Cancel a ``start`` task and wait until its row is deleted."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _beating(worker: Any) -> None:
    loop = asyncio.get_running_loop()
    ex = ThreadPoolExecutor(1, thread_name_prefix="chatflow-heartbeat")
    started, last_purge = timezone.now(), 0.0
    last_retention: float | None = None
    try:
        while True:
            purge = time.monotonic() - last_purge > _PURGE_EVERY
            outage = getattr(worker, "outage", None)  # the worker's: one warning per database outage
            try:
                await loop.run_in_executor(ex, beat, worker.owner, started, worker.processed, purge)
                last_purge = time.monotonic() if purge else last_purge
            except DatabaseError as err:  # the next beat tries again, on a connection opened again if broken
                await loop.run_in_executor(ex, _close_if_broken)
                if outage is not None:
                    outage.failed(err)
                else:
                    logger.warning("Worker %s: the heartbeat failed: %s: %s", worker.owner, type(err).__name__, err)
            except Exception:  # noqa: BLE001 - the next beat tries again
                logger.warning("Worker %s: the heartbeat failed", worker.owner, exc_info=True)
            if last_retention is None or time.monotonic() - last_retention > RETENTION_EVERY:
                last_retention = time.monotonic()
                try:  # a failed run is tried again at the next one; what it deleted stays deleted
                    await loop.run_in_executor(ex, apply_retention)
                except Exception:  # noqa: BLE001 - the next run tries again
                    logger.warning("Worker %s: the retention run failed", worker.owner, exc_info=True)
            await asyncio.sleep(settings.CHATFLOW_HEARTBEAT_SECONDS)
    finally:
        with contextlib.suppress(Exception):  # stopping: a row left behind only shows as stale
            await asyncio.shield(loop.run_in_executor(ex, _forget_and_close, worker.owner))
        ex.shutdown(wait=False)


def _close_if_broken() -> None:
    """After a failed beat: close this thread's connections the server dropped (the next beat opens
    others). Django does this between requests; a worker's threads serve none."""
    for conn in connections.all(initialized_only=True):
        with contextlib.suppress(DatabaseError):
            reopen_if_dropped(conn.alias, failed=True)


def _forget_and_close(owner: str) -> None:
    try:
        forget(owner)
    finally:
        connections.close_all()
