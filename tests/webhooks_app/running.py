"""A queue worker running in the test process, on a thread of its own, as the embedded worker runs beside a
server: ``?wait=true`` requests wait for it to play their turns."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from webhooks_app.worker import Worker


@contextlib.contextmanager
def running_worker(slots: int = 2) -> Iterator[Worker]:
    """A ``Worker`` (woken by the inbox's enqueue, like any worker of this process) until the block ends."""
    worker = Worker(slots=slots, poll=0.05)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(worker.run())
        except BaseException as err:  # noqa: BLE001 - raised in the test below
            failed.append(err)

    thread = threading.Thread(target=run, name="test-queue-worker")
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive() and not failed, failed
