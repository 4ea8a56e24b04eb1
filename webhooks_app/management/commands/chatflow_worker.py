"""``manage.py chatflow_worker``: a standalone queue worker (run several on PostgreSQL).

SIGTERM/SIGINT: finish the deliveries in hand, then exit; a second signal cancels them (their turns
roll back and the deliveries go back to the queue). ``--drain`` exits once nothing is queued.
``--embedded``: started by an ASGI server as its embedded worker (``webhooks_app.embedded``): stdin
is the server's pipe — a byte wakes the worker, end of input (the server is gone) stops it like a
first signal, and a turn still running 60 s later is cancelled, as by any signal after it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
from collections.abc import Callable

from django.conf import settings
from django.core.management.base import BaseCommand

from sessions_app.live import flush_before_close
from webhooks_app import placement
from webhooks_app.costs import Costs
from webhooks_app.worker import Worker

PARENT_GONE_GRACE = 60.0


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's event loop when it is installed, else asyncio's: a worker's throughput is its CPU, and
    uvloop's callbacks, futures and thread wake-ups cost a fraction of asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class Command(BaseCommand):
    help = "Process webhook deliveries from the database queue."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--slots", type=int, default=None,
                            help="Deliveries played at once (default: CHATFLOW_WORKER_SLOTS, 4 unless set).")
        parser.add_argument("--poll", type=float, default=0.5, help="Seconds between polls when idle (default 0.5).")
        parser.add_argument("--drain", action="store_true", help="Exit when no delivery is queued or running.")
        parser.add_argument("--costs", action="store_true",
                            help="At exit, print where the time went: one line 'costs {json}' (webhooks_app.costs).")
        parser.add_argument("--embedded", action="store_true",
                            help="Run as an ASGI server's embedded worker: stdin is the server's pipe (a byte "
                                 "wakes the worker; end of input stops it).")

    def handle(self, *args, slots: int | None, poll: float, drain: bool, embedded: bool, costs: bool = False,
               **options) -> None:
        slots = settings.CHATFLOW_WORKER_SLOTS if slots is None else slots
        if slots < 1 or poll <= 0:
            self.stderr.write("--slots must be at least 1 and --poll positive")
            raise SystemExit(2)
        placed = placement.place()
        kept = Costs() if costs else None
        if kept is not None:
            kept.install()
        worker = Worker(slots=slots, poll=poll, costs=kept)
        self.stdout.write(f"chatflow_worker {worker.owner}: {slots} slot(s), {placed}, ready", ending="\n")
        self.stdout.flush()
        gc.freeze()  # Django and the apps stay for the process's life: keep full collections short (see asgi.py)
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            processed = runner.run(self._run(worker, drain, embedded))
        self.stdout.write(f"chatflow_worker {worker.owner}: stopped after {processed} deliveries")
        if kept is not None:
            self.stdout.write("costs " + json.dumps(kept.report()))

    async def _run(self, worker: Worker, drain: bool, embedded: bool) -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(worker.run(drain=drain))
        state = {"signals": 0, "server_gone": False}

        def on_signal() -> None:
            state["signals"] += 1
            # A signal after the server closed our stdin is its "stop now" (embedded.EmbeddedWorker.stop).
            worker.stop() if state["signals"] == 1 and not state["server_gone"] else task.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        if embedded:
            self._watch_server(loop, worker, task, state)
        try:
            return await task
        except asyncio.CancelledError:
            return worker.processed
        finally:
            await flush_before_close()

    def _watch_server(self, loop: asyncio.AbstractEventLoop, worker: Worker, task: asyncio.Future,
                      state: dict) -> None:
        fd = sys.stdin.fileno()
        os.set_blocking(fd, False)

        def on_stdin() -> None:
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                return
            if data:
                worker.wake()
                return
            loop.remove_reader(fd)  # end of input: the server exited or was killed
            state["server_gone"] = True
            self.stderr.write(f"chatflow_worker {worker.owner}: the server is gone; finishing and exiting")
            worker.stop()
            loop.call_later(PARENT_GONE_GRACE, task.cancel)

        loop.add_reader(fd, on_stdin)
