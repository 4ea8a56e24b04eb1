"""Helpers for tests that run the site as a separate process (manage.py, daphne, dev.py)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.settings_reads import SETTINGS, variables_read

REPO = Path(__file__).resolve().parent.parent

# Every variable settings.py reads (and the settings module's); a child process starts from none of them unless a
# test sets it.
SITE_VARIABLES = frozenset(variables_read(SETTINGS.read_text(encoding="utf-8"))) | {"DJANGO_SETTINGS_MODULE"}


def redis_databases(listed: str, worker: str) -> tuple[int, int, int]:
    """This test process's three local Redis databases: the ``worker``-th three of ``listed``.

    ``listed`` is a comma-separated list of database numbers (CHATFLOW_TEST_REDIS_DBS, set per pass by
    ``dev.py test`` so that passes running at once never share one); ``worker`` is pytest-xdist's worker
    name (``gw0``, ``gw1``, …) or empty outside xdist. ``ValueError`` when the list is too short.
    """
    numbers = [int(n) for n in listed.split(",") if n.strip()]
    index = int(worker.removeprefix("gw") or 0)
    mine = numbers[3 * index:3 * index + 3]
    if len(mine) != 3:
        raise ValueError(f"CHATFLOW_TEST_REDIS_DBS={listed!r} holds no three Redis databases for worker {index}")
    return mine[0], mine[1], mine[2]


_OWN, _BROWSER, _LAYER = redis_databases(os.environ.get("CHATFLOW_TEST_REDIS_DBS", "11,3,4,12,5,6"),
                                         os.environ.get("PYTEST_XDIST_WORKER", ""))
# The tests' own database of the local Redis, flushed by nothing else.
TEST_REDIS_URL = f"redis://127.0.0.1:6379/{_OWN}"
# The live tests' Redis channel layer: one for the browser tests' daphne, one for in-process consumers.
BROWSER_REDIS_URL = f"redis://127.0.0.1:6379/{_BROWSER}"
LAYER_REDIS_URL = f"redis://127.0.0.1:6379/{_LAYER}"


def redis_up() -> bool:
    """True when a Redis server answers on 127.0.0.1:6379 (tests that need one skip otherwise)."""
    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
        return True
    except OSError:
        return False


def site_env(**overrides: str) -> dict[str, str]:
    """The current environment without the site's variables (and no .env file), plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in SITE_VARIABLES}
    env["CHATFLOW_ENV_FILE"] = ""
    env["PYTHONWARNINGS"] = "error"
    env.update(overrides)
    return env


def run_manage(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python manage.py *args`` in the repository with this interpreter; output captured as text."""
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> bytes:
    """GET ``url`` until it answers 200 (or ``timeout`` seconds pass, or ``proc`` exits); returns the body."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read()
        except OSError as err:
            last = err
            time.sleep(0.25)
    raise AssertionError(f"{url} did not answer within {timeout}s: {last}")


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Stop a server started with ``start_new_session=True``: SIGTERM to its process group, then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout)


@contextlib.contextmanager
def redis_server(port: int, timeout: float = 15) -> Iterator[subprocess.Popen]:
    """A throwaway ``redis-server`` on 127.0.0.1:``port`` (no persistence) while the block runs."""
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--daemonize", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"redis-server did not listen on port {port}") from None
                time.sleep(0.05)
        yield proc
    finally:
        stop(proc)
