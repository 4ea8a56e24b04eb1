"""The workers of this process, and the embedded worker: a child process of the ASGI server.

In the embedded default (one daphne/uvicorn process, SQLite) the server starts one queue worker —
``manage.py chatflow_worker --embedded``, the same code as a standalone worker — as a CHILD process,
from ``WebhooksAppConfig.ready`` only when the process is an ASGI server
(``CHATFLOW_EMBEDDED_WORKER=auto``), never in other management commands or tests unless ``on``.
A child, not a thread: a demo turn costs ~12 ms of CPU, and on the server's GIL every webhook
acknowledgement waited behind the turns (p99 100–300 ms); in a process of its own the operating
system schedules the two fairly (docs/performance.md).

The child and the server are tied by two pipes:

* the child's stdin: the server writes a byte after each enqueue (:func:`wake`: the child looks at
  the queue now instead of at its next poll) and never closes it; end of input means the server is
  gone (exited, or killed with ``-9``), and the child finishes the deliveries it holds and exits;
* with the in-memory channel layer, a relay pipe: the child's ``group_send`` calls come back to the
  server and go out on its layer, so webhook turns are live in the console (:mod:`webhooks_app.relay`).
  With Redis (``REDIS_URL``) the child publishes to Redis itself.

A child that dies is logged as an error and started again (1 s, doubling to 30 s between attempts);
what it held comes back through the queue's visibility timeout. At exit the server closes the
child's stdin and waits for it; after 10 s a SIGTERM cancels what it still holds (the turns roll back,
the deliveries are queued again), and 5 s later a SIGKILL ends it (the visibility timeout then).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from sessions_app.live import layer_is_in_memory
from webhooks_app import relay

if TYPE_CHECKING:
    from webhooks_app.worker import Worker

__all__ = ["register", "unregister", "wake", "start_if_serving", "serving", "embedded_worker", "EmbeddedWorker"]

logger = logging.getLogger("webhooks_app.worker")

_workers: set[Worker] = set()
_mutex = threading.Lock()
_embedded: dict[str, EmbeddedWorker] = {}
_SERVERS = {"daphne", "uvicorn", "hypercorn", "gunicorn", "granian"}
RELAY_FD_VARIABLE = "CHATFLOW_LIVE_RELAY_FD"
_RESTART_FIRST, _RESTART_MAX, _STOP_GRACE = 1.0, 30.0, 10.0


def register(worker: Worker) -> None:
    with _mutex:
        _workers.add(worker)


def unregister(worker: Worker) -> None:
    with _mutex:
        _workers.discard(worker)


def wake() -> None:
    """Tell this process's workers, and its embedded worker process, that a delivery was queued."""
    with _mutex:
        workers = list(_workers)
        child = _embedded.get("worker")
    for worker in workers:
        worker.wake()
    if child is not None:
        child.wake()


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


def start_if_serving() -> EmbeddedWorker | None:
    mode = settings.CHATFLOW_EMBEDDED_WORKER
    if mode == "off" or (mode == "auto" and not serving()):
        return None
    return embedded_worker()


def embedded_worker() -> EmbeddedWorker:
    """Start (once) the embedded worker process and its supervisor thread; returns its handle."""
    with _mutex:
        child = _embedded.get("worker")
        if child is None:
            relay.remember_loop()
            child = _embedded["worker"] = EmbeddedWorker()
            child.start()
            atexit.register(child.stop)
    return child


class EmbeddedWorker:
    """The server's handle on its worker process: start, wake, supervise (restart), stop."""

    def __init__(self) -> None:
        self.relayed = layer_is_in_memory()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._supervise, name="chatflow-embedded-worker", daemon=True)

    @property
    def pid(self) -> int | None:
        proc = self.proc
        return proc.pid if proc is not None else None

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def _spawn(self) -> None:
        cmd = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "chatflow_worker", "--embedded"]
        env = {**os.environ, "CHATFLOW_EMBEDDED_WORKER": "off"}
        env.pop(RELAY_FD_VARIABLE, None)
        read_fd = write_fd = None
        if self.relayed:
            read_fd, write_fd = os.pipe()
            env[RELAY_FD_VARIABLE] = str(write_fd)
        try:
            fds = () if write_fd is None else (write_fd,)
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, pass_fds=fds)
        finally:
            if write_fd is not None:
                os.close(write_fd)  # the child holds the only write end: its exit is the reader's EOF
        assert proc.stdin is not None
        os.set_blocking(proc.stdin.fileno(), False)  # wake() never blocks a webhook
        with self._lock:
            self.proc = proc
        if read_fd is not None:
            threading.Thread(target=relay.forward, args=(read_fd, proc.pid), name=f"chatflow-live-relay-{proc.pid}",
                             daemon=True).start()
        logger.info("Embedded queue worker started: pid %s%s", proc.pid, " (live updates relayed)" * self.relayed)

    def _supervise(self) -> None:
        delay = _RESTART_FIRST
        while True:
            proc = self.proc
            assert proc is not None
            started = time.monotonic()
            code = proc.wait()
            if self._stopping.is_set():
                return
            logger.error("The embedded queue worker (pid %s) exited with status %s; starting a new one in %.0f s. "
                         "Its deliveries are played again once their lease (CHATFLOW_LEASE_SECONDS) "
                         "expires.", proc.pid, code, delay)
            if self._stopping.wait(delay):
                return
            delay = _RESTART_FIRST if time.monotonic() - started > 60 else min(delay * 2, _RESTART_MAX)
            try:
                self._spawn()
                self.restarts += 1
            except OSError:  # the old, dead process stays in self.proc: logged and retried after the delay
                logger.exception("Could not start the embedded queue worker")

    def wake(self) -> None:
        """Thread-safe and non-blocking: one byte on the child's stdin (a full pipe already means 'look')."""
        proc = self.proc
        if proc is None or proc.stdin is None or self._stopping.is_set():
            return
        try:
            os.write(proc.stdin.fileno(), b"w")
        except (OSError, ValueError):  # BlockingIOError, BrokenPipeError; ValueError: stdin closed
            pass  # full: wakes are pending; broken/closed: the supervisor restarts it

    def stop(self, grace: float = _STOP_GRACE) -> None:
        """Close the child's stdin (it finishes what it holds and exits); after ``grace`` s SIGTERM (it
        cancels what it holds), after 5 s more SIGKILL."""
        self._stopping.set()
        with self._lock:
            proc = self.proc
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and proc.poll() is None:
                proc.send_signal(sig)
            try:
                proc.wait(grace if sig is None else 5)
                return
            except subprocess.TimeoutExpired:
                continue
