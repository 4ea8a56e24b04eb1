"""Console test fixtures: a fresh site store per test (its identity map must not outlive the test's database)."""

from __future__ import annotations

import pytest

from sessions_app import actions


@pytest.fixture(autouse=True)
def fresh_site_store():
    actions.site_store.cache_clear()
    yield
    if actions.site_store.cache_info().currsize:
        actions.site_store().close()
    actions.site_store.cache_clear()
