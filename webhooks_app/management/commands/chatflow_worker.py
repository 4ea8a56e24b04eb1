"""``manage.py chatflow_worker``: a standalone queue worker (run several on PostgreSQL).

SIGTERM/SIGINT: finish the deliveries in hand, then exit; a second signal cancels them (their turns
roll back and the deliveries go back to the queue). ``--drain`` exits once nothing is queued.
"""

from __future__ import annotations

import asyncio
import signal

from django.core.management.base import BaseCommand

from webhooks_app.worker import Worker


class Command(BaseCommand):
    help = "Process webhook deliveries from the database queue."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--slots", type=int, default=4, help="Deliveries played at once (default 4).")
        parser.add_argument("--poll", type=float, default=0.5, help="Seconds between polls when idle (default 0.5).")
        parser.add_argument("--drain", action="store_true", help="Exit when no delivery is queued or running.")

    def handle(self, *args, slots: int, poll: float, drain: bool, **options) -> None:
        if slots < 1 or poll <= 0:
            self.stderr.write("--slots must be at least 1 and --poll positive")
            raise SystemExit(2)
        worker = Worker(slots=slots, poll=poll)
        self.stdout.write(f"chatflow_worker {worker.owner}: {slots} slot(s), ready", ending="\n")
        self.stdout.flush()
        processed = asyncio.run(self._run(worker, drain))
        self.stdout.write(f"chatflow_worker {worker.owner}: stopped after {processed} deliveries")

    async def _run(self, worker: Worker, drain: bool) -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(worker.run(drain=drain))
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            worker.stop() if signals == 1 else task.cancel()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        try:
            return await task
        except asyncio.CancelledError:
            return worker.processed
