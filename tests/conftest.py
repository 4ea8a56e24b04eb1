"""Suite-wide configuration. pytest-django loads chatflow_site.settings (see pyproject.toml).

Run the suite with `python3 dev.py test` (SQLite, then PostgreSQL); a bare `pytest` uses whatever
DATABASE_URL says (default: SQLite; the test database is a per-process file in the temp dir).
"""

from __future__ import annotations

import pytest

from tests.processes import REPO


@pytest.fixture(scope="session")
def repo_root():
    """The repository checkout (manage.py lives here)."""
    return REPO


@pytest.fixture
def fast_password_hashing(settings):
    """MD5 hashing for tests that create many users (never used outside tests)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
