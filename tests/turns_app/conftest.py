"""Turn record test fixtures: a fresh site store per test (its identity map must not outlive the test's
database), no price or provider settings from the environment, a fake OpenAI-compatible server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from chatflow_agent.pricing import PRICES_ENV
from sessions_app import runtime
from tests.chatflow_agent.provider_server import FakeProvider


@pytest.fixture(autouse=True)
def fresh_site_store():
    runtime.reset()
    yield
    runtime.reset()


@pytest.fixture(autouse=True)
def no_price_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PRICES_ENV, raising=False)
    for name in list(os.environ):
        if name.endswith(("_API_KEY", "_BASE_URL")):
            monkeypatch.delenv(name)


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake
