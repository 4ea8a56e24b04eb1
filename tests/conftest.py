"""Suite-wide configuration. pytest-django loads chatflow_site.settings (see pyproject.toml).

Run the suite with `python3 dev.py test` (a pass on SQLite and, side by side, one on PostgreSQL: both run
the tests that use Django's test database, and each a share of the others); a bare `pytest` runs every test
on whatever DATABASE_URL says (default: SQLite; the test database is a per-process file in the temp dir).
"""

from __future__ import annotations

import pytest

from tests import shares
from tests.processes import REPO

# pytest-django's fixtures that give a test Django's test database (the others that do request one of these).
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                               "live_server"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database-tests-only", action="store_true",
        help="run only the tests that use Django's test database (dev.py test's pass on another database)",
    )
    parser.addoption(
        "--non-database-share", metavar="K/N",
        help="run every test that uses Django's test database, and of the others only those in share K of N "
             "(a whole module a share: tests/shares.py, weights in tests/non_database_weights.toml; K may list "
             "several shares, 1,2,3/5). Passes that take every K of one N run each such test exactly once.",
    )


def pytest_configure(config: pytest.Config) -> None:
    share = config.getoption("--non-database-share")
    if share is not None:
        try:
            shares.parse_share(share)
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None


def uses_the_database(item: pytest.Item) -> bool:
    """True when the test gets Django's test database: the django_db mark, or a fixture that needs it."""
    if item.get_closest_marker("django_db") is not None:
        return True
    return not DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def module_of(item: pytest.Item) -> str:
    """The test's module as a path relative to the rootdir (``tests/sessions_app/test_x.py``)."""
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--database-tests-only"):
        def keep(item: pytest.Item) -> bool:
            return uses_the_database(item)
    elif (share := config.getoption("--non-database-share")) is not None:
        taken, count = shares.parse_share(share)
        dealt = shares.deal(shares.load_weights(), count)

        def keep(item: pytest.Item) -> bool:
            return uses_the_database(item) or shares.share_of(module_of(item), count, dealt) in taken
    else:
        return
    kept = [item for item in items if keep(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not keep(item)])
        items[:] = kept


@pytest.fixture(scope="session")
def repo_root():
    """The repository checkout (manage.py lives here)."""
    return REPO


@pytest.fixture
def fast_password_hashing(settings):
    """MD5 hashing for tests that create many users (never used outside tests)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
