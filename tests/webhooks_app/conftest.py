"""Webhook test fixtures: provider secrets in settings, and a fresh site store per test."""

from __future__ import annotations

import pytest

from sessions_app import runtime
from tests.webhooks_app import payloads
from webhooks_app import inbox


@pytest.fixture(autouse=True)
def webhook_settings(settings, monkeypatch):
    # In process, accept on the test's thread (its transaction); the processes tests use the inbox threads.
    monkeypatch.setattr(inbox, "use_inbox_threads", False)
    for name, value in payloads.SETTINGS.items():
        setattr(settings, name, value)
    runtime.reset()
    yield settings
    runtime.reset()
