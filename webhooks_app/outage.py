"""A queue worker's view of its database: one warning when it stops answering, one line when it is back.

A server restart (or an administrator's ``pg_terminate_backend``) drops the worker's connections: the
next statement on each fails. The worker then waits (:meth:`DatabaseOutage.failed` gives the back-off,
doubling from :data:`FIRST_DELAY` to :data:`MAX_DELAY`) and claims again; every connection of the
process is checked before its next statement (``sessions_app.store.recheck_connections``) and opened
again when broken. Its heartbeat stops meanwhile, so the health page shows it stale.
"""

from __future__ import annotations

import logging
import threading
import time

from sessions_app.store import recheck_connections

__all__ = ["DatabaseOutage", "FIRST_DELAY", "MAX_DELAY"]

logger = logging.getLogger("webhooks_app.worker")

#: Seconds before the first attempt after a failed statement, and the most between two attempts.
FIRST_DELAY, MAX_DELAY = 0.5, 10.0


class DatabaseOutage:
    """Thread-safe: ``failed(err)`` returns the seconds to wait before trying again and logs the first
    failure of an outage (the error, not a traceback); ``answered()`` ends the outage with one INFO line."""

    def __init__(self, who: str) -> None:
        self.who = who
        self._lock = threading.Lock()
        self._since: float | None = None
        self._delay = FIRST_DELAY

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, err: BaseException) -> float:
        recheck_connections()
        with self._lock:
            first = self._since is None
            if first:
                self._since, self._delay = time.monotonic(), FIRST_DELAY
            delay, self._delay = self._delay, min(self._delay * 2, MAX_DELAY)
        if first:
            logger.warning("%s: the database is unreachable (%s: %s); trying again with back-off up to %.0f s",
                           self.who, type(err).__name__, str(err).strip().splitlines()[0] if str(err).strip() else "",
                           MAX_DELAY)
        return delay

    def answered(self) -> None:
        if self._since is None:
            return
        with self._lock:
            if self._since is None:
                return
            seconds, self._since = time.monotonic() - self._since, None
        logger.info("%s: the database answers again after %.1f s; processing deliveries", self.who, seconds)
