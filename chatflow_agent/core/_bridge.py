"""The persistent stores' sync bridge: blocking backend work dispatched from event loops."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

from chatflow_agent.core._pool import BlockingPool

__all__ = ["BlockingBridge"]

_T = TypeVar("_T")


class BlockingBridge:
    """Runs blocking calls for event loops on a private ``BlockingPool`` of ``workers`` threads
    (started on first use), or on the calling thread when ``inline`` (an in-memory database).

    Work for one key (a session id) always runs on the same thread, so on the same connection,
    whose page cache is then still warm for the next hop of the turn. A plain queue and
    ``call_soon_threadsafe`` instead of ``run_in_executor``: a cheaper hand-off (figures in docs/performance.md).
    """

    def __init__(self, inline: bool, workers: int) -> None:
        self.inline = inline
        self.workers = workers
        self._pool: BlockingPool | None = None
        self._mutex = threading.Lock()

    @property
    def started(self) -> bool:
        """True once a pool thread was started (never when ``inline``)."""
        return self._pool is not None

    async def run(self, key: str | None, fn: Callable[..., _T], *args: Any) -> _T:
        if self.inline:
            return fn(*args)
        return await self.submit(key, fn, args)

    def submit(self, key: str | None, fn: Callable[..., _T], args: tuple[Any, ...]) -> asyncio.Future[_T]:
        """Queue ``fn(*args)`` on ``key``'s thread (also when ``inline``); a future of its result."""
        pool = self._pool
        if pool is None:
            with self._mutex:
                if self._pool is None:
                    self._pool = BlockingPool(self.workers)
                pool = self._pool
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        pool.submit(key, loop, fut, fn, args)
        return fut

    async def finish(self, key: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, bool]:
        """Like :meth:`run`, for work whose outcome the caller must know: ``(result, cancelled)``.

        A thread cannot be stopped, so a cancellation that arrives while ``fn`` runs does not
        abandon it: this waits for ``fn`` to finish — as long as the write takes, up to the
        database's lock timeout; further cancellations meanwhile are absorbed — and reports the
        cancellation as ``cancelled``, for the caller to re-raise once it has applied the result
        (a commit that was written must stay in memory, invariant 4). If ``fn`` raised, that error
        is raised (after a cancellation: ``CancelledError`` from it). The common, uncancelled path
        costs what :meth:`run` costs (a shield would add a turn of the event loop).
        """
        if self.inline:
            return fn(*args), False
        outcome: list[tuple[bool, Any]] = []

        def job() -> Any:
            try:
                value = fn(*args)
            except BaseException as exc:
                outcome.append((False, exc))
                raise
            outcome.append((True, value))
            return value

        try:
            return await self.submit(key, job, ()), False
        except asyncio.CancelledError:
            pass
        while not outcome:  # the job still runs on its thread: poll for its end (a rare path)
            with suppress(asyncio.CancelledError):
                await asyncio.sleep(0.002)
        ok, value = outcome[0]
        if not ok:
            raise asyncio.CancelledError() from value
        return value, True

    def close(self) -> None:
        """Stop the pool's threads (a later call starts a new pool)."""
        with self._mutex:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
