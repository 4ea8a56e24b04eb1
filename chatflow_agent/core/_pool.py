"""The store's private pool of threads for blocking database work (chatflow-agent 0.4.0rc1).

A fixed set of daemon threads, each with its own job queue, running blocking calls for event
loops; a call with a key (a session id) always runs on the thread the key maps to, so the hops of
one turn use one connection whose page cache is still warm. Results go back to the awaiting loop
with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["BlockingPool"]


def _deliver(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class BlockingPool:
    """A fixed set of daemon threads running blocking calls for event loops; a call with a key
    always runs on the thread the key maps to, calls without one go round the threads."""

    def __init__(self, workers: int) -> None:
        self._queues: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(workers)]
        self._next = itertools.count()
        self._threads = [
            threading.Thread(target=self._work, args=(q,), name=f"chatflow-db-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for t in self._threads:
            t.start()

    def submit(self, key: str | None, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[Any],
               fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        index = hash(key) if key is not None else next(self._next)
        self._queues[index % len(self._queues)].put((loop, fut, fn, args))

    @staticmethod
    def _work(jobs: queue.SimpleQueue[Any]) -> None:
        while (item := jobs.get()) is not None:
            loop, fut, fn, args = item
            try:
                ok, value = True, fn(*args)
            except BaseException as err:  # noqa: BLE001 - handed to the awaiting task
                ok, value = False, err
            try:
                loop.call_soon_threadsafe(_deliver, fut, ok, value)
            except RuntimeError:  # the loop closed while we worked
                pass

    def shutdown(self) -> None:
        for jobs in self._queues:
            jobs.put(None)
        for t in self._threads:
            t.join()
