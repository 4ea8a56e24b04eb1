"""Where a queue worker process runs: on one CPU, and below the web processes' priority.

A worker is one Python process (one interpreter lock) that hands every delivery's work to its database
threads and back several times (the claim, the session's lease, the turn gate, the commit, the finish and
the complete); a hand-off between threads on two CPUs costs a wake-up of the other CPU, which on a VM's
virtual CPUs is dear (docs/performance.md has the figures). Kept on one CPU, the threads
hand work to each other without it. Webhook acknowledgements are answered by the web processes while the
workers drain the queue: a worker runs at a lower priority (a higher nice value), so an acknowledgement
never waits behind a turn for a CPU.

``CHATFLOW_WORKER_CPU``: ``auto`` (one of the CPUs the process may run on, chosen by its pid, so workers
started one after another alternate between CPUs), ``off`` (the scheduler's choice, any CPU), or a CPU
number. ``CHATFLOW_WORKER_NICE``: the nice value added at start (0 keeps the parent's).
"""

from __future__ import annotations

import logging
import os

from django.conf import settings

__all__ = ["place"]

logger = logging.getLogger("webhooks_app.placement")


def place() -> str:
    """Apply the settings to this process; returns what was done, in words (for the worker's log line).
    A CPU the process may not run on, or a platform without affinity, is logged and left alone."""
    done = []
    cpu = _cpu(settings.CHATFLOW_WORKER_CPU)
    if cpu is not None:
        try:
            os.sched_setaffinity(0, {cpu})
        except OSError as err:
            logger.warning("chatflow_worker: cannot run on CPU %s only (%s); running on any CPU", cpu, err)
        else:
            done.append(f"on CPU {cpu}")
    if settings.CHATFLOW_WORKER_NICE:
        done.append(f"nice {os.nice(settings.CHATFLOW_WORKER_NICE)}")
    return ", ".join(done) or "as started"


def _cpu(setting: str) -> int | None:
    if setting == "off" or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if setting == "auto":
        return None if len(allowed) < 2 else allowed[os.getpid() % len(allowed)]
    return int(setting)
