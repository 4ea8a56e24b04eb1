"""The workers of this process: the embedded one (inside the ASGI server) and who to wake on enqueue.

In the embedded default (one daphne/uvicorn process, SQLite) a worker runs on its own thread and
event loop inside the server process, started from ``WebhooksAppConfig.ready`` only when the
process is an ASGI server (``CHATFLOW_EMBEDDED_WORKER=auto``), never in other management commands
or tests unless ``on``. ``manage.py chatflow_worker`` runs standalone workers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from webhooks_app.worker import Worker

__all__ = ["register", "unregister", "wake", "start_if_serving", "serving", "embedded_worker"]

logger = logging.getLogger("webhooks_app.worker")

_workers: set[Worker] = set()
_mutex = threading.Lock()
_embedded: dict[str, object] = {}
_SERVERS = {"daphne", "uvicorn", "hypercorn", "gunicorn", "granian"}


def register(worker: Worker) -> None:
    with _mutex:
        _workers.add(worker)


def unregister(worker: Worker) -> None:
    with _mutex:
        _workers.discard(worker)


def wake() -> None:
    """Tell this process's workers that a delivery was queued (others poll)."""
    with _mutex:
        workers = list(_workers)
    for worker in workers:
        worker.wake()


def serving(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> bool:
    """True when this process is an ASGI server: daphne/uvicorn/…, or runserver's serving child."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    if not argv:
        return False
    exe = Path(argv[0])
    if exe.name in _SERVERS or (exe.name == "__main__.py" and exe.parent.name in _SERVERS):
        return True
    if len(argv) > 1 and argv[1] == "runserver":
        return "--noreload" in argv or environ.get("RUN_MAIN") == "true"
    return False


def start_if_serving() -> Worker | None:
    mode = settings.CHATFLOW_EMBEDDED_WORKER
    if mode == "off" or (mode == "auto" and not serving()):
        return None
    return embedded_worker()


def embedded_worker() -> Worker:
    """Start (once) the embedded worker on a daemon thread with its own event loop; returns it."""
    from webhooks_app.worker import Worker

    with _mutex:
        worker = _embedded.get("worker")
        if worker is None:
            worker = _embedded["worker"] = Worker()
            thread = threading.Thread(target=_run, args=(worker,), name="chatflow-embedded-worker", daemon=True)
            _embedded["thread"] = thread
            thread.start()
    return worker  # type: ignore[return-value]


def _run(worker: Worker) -> None:
    try:
        asyncio.run(worker.run())
    except Exception:
        logger.exception("The embedded queue worker stopped")
