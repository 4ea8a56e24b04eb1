"""Real processes for webhook tests: daphne with its embedded worker, and standalone chatflow_worker."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.db import connection

from tests.processes import REPO, free_port, site_env, wait_for_http
from tests.webhooks_app import payloads as p


def database_url() -> str:
    """The URL of the database this test uses (the test database), for child processes."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    return f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def child_env(wa_base: str, tg_base: str, tmp: Path, **extra: str) -> dict[str, str]:
    return site_env(
        DATABASE_URL=database_url(), CHATFLOW_AGENTS="tests.webhooks_app.agents.build",
        WHATSAPP_API_BASE=wa_base, TELEGRAM_API_BASE=tg_base,
        CHATFLOW_TEST_ENGINE_LOG=str(tmp / "engine.log"), CHATFLOW_TEST_BLOCK_FILE=str(tmp / "block"),
        **{k: v for k, v in p.SETTINGS.items()}, **extra,
    )


def start_daphne(env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "chatflow_site.asgi:application"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    wait_for_http(f"{base}/healthz/", timeout=30, proc=proc)
    return proc, base


def start_worker(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "chatflow_worker", "--poll", "0.05", *args],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True, text=True,
        )
    line = proc.stdout.readline() if proc.stdout else ""
    assert "ready" in line, f"the worker did not start: {line!r}; see {log}"
    return proc


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any, float]:
    """POST; returns (status, body bytes, seconds taken)."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), time.perf_counter() - started
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read(), time.perf_counter() - started


def wa_headers(body: bytes) -> dict[str, str]:
    return {"X-Hub-Signature-256": p.sign(body, p.WA_SECRET)}


def tg_headers() -> dict[str, str]:
    return {"X-Telegram-Bot-Api-Secret-Token": p.TG_SECRET}


def engine_calls(tmp: Path) -> list[str]:
    log = tmp / "engine.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
