"""Webhook test fixtures: provider secrets in settings, and a fresh site store per test."""

from __future__ import annotations

import pytest

from agents_app import runtime
from tests.webhooks_app import payloads


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    for name, value in payloads.SETTINGS.items():
        setattr(settings, name, value)
    runtime.reset()
    yield settings
    runtime.reset()
