"""Takeover tests: the echo agent of tests/webhooks_app (its engine logs every call), fake provider APIs;
every test gets a fresh site store (as the console's tests have)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sessions_app import runtime
from sessions_app.models import ChatMessage, SessionLease
from tests.webhooks_app import payloads as p
from tests.webhooks_app.fakes import FakeProviderAPI
from tests.webhooks_app.test_endpoints import post_wa
from webhooks_app import inbox
from webhooks_app.worker import Worker


class Env:
    def __init__(self, wa: FakeProviderAPI, tg: FakeProviderAPI, tmp: Path) -> None:
        self.wa, self.tg, self.tmp = wa, tg, tmp
        self.log, self.block = tmp / "engine.log", tmp / "block"

    def engine_calls(self) -> list[str]:
        """The user texts the engine was called with, in order (one line per model call)."""
        if not self.log.exists():
            return []
        return [line.split("\t", 1)[1] for line in self.log.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def env(settings, tmp_path, monkeypatch):
    monkeypatch.setattr(inbox, "use_inbox_threads", False)  # accept on the test's thread, as webhooks tests do
    for name, value in p.SETTINGS.items():
        setattr(settings, name, value)
    runtime.reset()
    monkeypatch.setenv("CHATFLOW_TEST_ENGINE_LOG", str(tmp_path / "engine.log"))
    monkeypatch.setenv("CHATFLOW_TEST_BLOCK_FILE", str(tmp_path / "block"))
    monkeypatch.setenv("CHATFLOW_TEST_DOWN_FILE", str(tmp_path / "down"))
    settings.CHATFLOW_AGENTS = "tests.webhooks_app.agents.build"
    with FakeProviderAPI() as wa, FakeProviderAPI() as tg:
        settings.WHATSAPP_API_BASE = wa.base
        settings.TELEGRAM_API_BASE = tg.base
        yield Env(wa, tg, tmp_path)
    runtime.reset()


def drain(slots: int = 2) -> int:
    return asyncio.run(Worker(slots=slots, poll=0.05).run(drain=True))


def wa_message(client: Any, wamid: str, text: str) -> None:
    response = post_wa(client, p.whatsapp(p.wa_text(wamid, text)))
    assert response.status_code == 200, response.content


def texts(session_id: str) -> list[tuple[str, str]]:
    return list(ChatMessage.objects.filter(session_id=session_id).order_by("id").values_list("role", "content"))


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class BackgroundTurn(threading.Thread):
    """A turn played on the site's Runner in a thread of its own (its own event loop), as a bot process does."""

    def __init__(self, session_id: str, text: str) -> None:
        super().__init__(daemon=True)
        self.session_id, self.text = session_id, text
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connections

        try:
            self.result = asyncio.run(runtime.site_runner().run_async(self.session_id, self.text))
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            self.error = err
        finally:
            connections.close_all()

    def start_and_wait_for_lease(self) -> BackgroundTurn:
        self.start()
        wait_until(lambda: SessionLease.objects.filter(session_id=self.session_id).exists(), "the turn's lease")
        return self


@pytest.fixture(autouse=True)
def fresh_site_store():
    runtime.reset()
    yield
    runtime.reset()
