"""Console test fixtures: a fresh site store per test (its identity map must not outlive the test's database)."""

from __future__ import annotations

import pytest

from sessions_app import runtime


@pytest.fixture(autouse=True)
def fresh_site_store():
    runtime.reset()
    yield
    runtime.reset()
