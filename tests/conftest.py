"""Suite-wide configuration. pytest-django loads chatflow_site.settings (see pyproject.toml).

Run the suite with `python3 dev.py test` (every test on SQLite and, side by side, the tests that use
Django's test database on PostgreSQL); a bare `pytest` uses whatever DATABASE_URL says (default: SQLite;
the test database is a per-process file in the temp dir).
"""

from __future__ import annotations

import pytest

from tests.browser_sites import chromium, sites  # noqa: F401  (one of each per pytest process)
from tests.processes import REPO

# pytest-django's fixtures that give a test Django's test database (the others that do request one of these).
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                               "live_server"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database-tests-only", action="store_true",
        help="run only the tests that use Django's test database (dev.py test's pass on another database)",
    )


def uses_the_database(item: pytest.Item) -> bool:
    """True when the test gets Django's test database: the django_db mark, or a fixture that needs it."""
    if item.get_closest_marker("django_db") is not None:
        return True
    return not DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--database-tests-only"):
        return
    kept = [item for item in items if uses_the_database(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not uses_the_database(item)])
        items[:] = kept


@pytest.fixture(scope="session")
def repo_root():
    """The repository checkout (manage.py lives here)."""
    return REPO


@pytest.fixture
def fast_password_hashing(settings):
    """MD5 hashing for tests that create many users (never used outside tests)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
