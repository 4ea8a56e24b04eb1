"""A queue worker process runs on one CPU and below the web processes' priority (CHATFLOW_WORKER_CPU,
CHATFLOW_WORKER_NICE), as the settings say; off leaves it where the scheduler puts it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.processes import stop
from tests.webhooks_app import servers as s

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs at least two CPUs to choose from")]


@pytest.fixture
def workers(tmp_path):
    """``start(**settings)`` starts a ``chatflow_worker`` (polling an empty queue) and returns its pid."""
    procs = []

    def start(**settings: str) -> int:
        log = tmp_path / f"worker-{len(procs)}.log"
        env = s.child_env("http://127.0.0.1:9", "http://127.0.0.1:9", tmp_path, **settings)
        procs.append(s.start_worker(env, log))
        return procs[-1].pid

    yield start
    for proc in procs:
        stop(proc)
        proc.stdout.close()


def nice_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[16])  # /proc/<pid>/stat's 19th field, counted after pid and comm


def test_by_default_a_worker_runs_on_one_cpu_at_nice_10(workers):
    pid = workers()
    cpus = os.sched_getaffinity(pid)
    assert len(cpus) == 1 and cpus <= os.sched_getaffinity(0)
    assert nice_of(pid) == os.nice(0) + 10


def test_by_default_workers_are_spread_over_the_cpus_by_pid(workers):
    ours = sorted(os.sched_getaffinity(0))
    pids = [workers(), workers()]
    assert [os.sched_getaffinity(pid) for pid in pids] == [{ours[pid % len(ours)]} for pid in pids]


def test_a_named_cpu_and_nice_are_applied_and_off_leaves_the_affinity_alone(workers):
    last = max(os.sched_getaffinity(0))
    named = workers(CHATFLOW_WORKER_CPU=str(last), CHATFLOW_WORKER_NICE="3")
    off = workers(CHATFLOW_WORKER_CPU="off", CHATFLOW_WORKER_NICE="0")
    assert os.sched_getaffinity(named) == {last} and nice_of(named) == os.nice(0) + 3
    assert os.sched_getaffinity(off) == os.sched_getaffinity(0) and nice_of(off) == os.nice(0)
