"""Suite-wide configuration. pytest-django loads chatflow_site.settings (see pyproject.toml).

Run the suite with `python3 dev.py test` (every test on SQLite and, side by side, the tests that use
Django's test database on PostgreSQL); a bare `pytest` uses whatever DATABASE_URL says (default: SQLite;
the test database is a per-process file in the temp dir).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections, transaction
from django.test import TransactionTestCase

from tests.browser_sites import chromium, sites  # noqa: F401  (one of each per pytest process)
from tests.processes import REPO

# pytest-django's fixtures that give a test Django's test database (the others that do request one of these).
DATABASE_FIXTURES = frozenset({"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback",
                               "live_server"})


#: Test modules (node id prefixes) that use no test database yet run in ``dev.py test``'s PostgreSQL pass instead
#: of its SQLite pass, which runs every other such test: so the two passes, side by side, take about as long.
#: Runtime tests only (no browser, no server process: those would contend with the SQLite pass's).
EVENED_OUT: tuple[str, ...] = ("tests/chatflow_agent/test_store_contract.py", "tests/chatflow_agent/test_package.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database-tests-only", action="store_true",
        help="run only the tests that use Django's test database, and the modules of EVENED_OUT "
             "(dev.py test's pass on another database)",
    )
    parser.addoption(
        "--not-evened-out", action="store_true",
        help="leave out the modules of EVENED_OUT (dev.py test's SQLite pass: the other pass runs them)",
    )


def evened_out(item: pytest.Item) -> bool:
    """True when the test belongs to a module of :data:`EVENED_OUT`."""
    return item.nodeid.startswith(EVENED_OUT)


def uses_the_database(item: pytest.Item) -> bool:
    """True when the test gets Django's test database: the django_db mark, or a fixture that needs it."""
    if item.get_closest_marker("django_db") is not None:
        return True
    return not DATABASE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--database-tests-only"):
        keep = lambda item: uses_the_database(item) or evened_out(item)  # noqa: E731
    elif config.getoption("--not-evened-out"):
        keep = lambda item: not evened_out(item)  # noqa: E731
    else:
        return
    kept = [item for item in items if keep(item)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if not keep(item)])
        items[:] = kept


# Per database alias: the rows of the test database right after it was migrated, as
# ``[(table, columns, rows)]`` (the content types, permissions and groups post_migrate wrote).
_MIGRATED_ROWS: dict[str, list[tuple[str, list[str], list[tuple[Any, ...]]]]] = {}


def _migrated_rows(alias: str) -> list[tuple[str, list[str], list[tuple[Any, ...]]]]:
    connection = connections[alias]
    quote = connection.ops.quote_name
    tables = []
    with connection.cursor() as cursor:
        for table in connection.introspection.django_table_names(only_existing=True, include_views=False):
            cursor.execute(f"SELECT * FROM {quote(table)}")  # noqa: S608 - Django's own table names
            rows = [tuple(row) for row in cursor.fetchall()]
            if rows:
                tables.append((table, [column[0] for column in cursor.description], rows))
    return tables


def _restore_migrated_rows(alias: str) -> None:
    connection = connections[alias]
    quote = connection.ops.quote_name
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        for table, columns, rows in _MIGRATED_ROWS[alias]:
            cursor.executemany(
                f"INSERT INTO {quote(table)} ({', '.join(map(quote, columns))}) "  # noqa: S608 - as above
                f"VALUES ({', '.join(['%s'] * len(columns))})", rows)
    from django.contrib.contenttypes.models import ContentType

    ContentType.objects.clear_cache()


_flush_and_migrate = TransactionTestCase._fixture_teardown


def _flush_and_restore(self: TransactionTestCase) -> None:
    """A transactional test's teardown: flush every table, then write back the rows the database
    held after its migration, instead of running every post_migrate handler again after each test."""
    aliases = list(self._databases_names(include_mirrors=False))
    if self.available_apps is not None or self.serialized_rollback or any(a not in _MIGRATED_ROWS for a in aliases):
        _flush_and_migrate(self)
        return
    for alias in aliases:
        call_command("flush", verbosity=0, interactive=False, database=alias, reset_sequences=False,
                     inhibit_post_migrate=True)
        _restore_migrated_rows(alias)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test databases, their migrated rows kept for the transactional tests' teardown."""
    with django_db_blocker.unblock():
        for alias in connections:
            _MIGRATED_ROWS[alias] = _migrated_rows(alias)
    TransactionTestCase._fixture_teardown = _flush_and_restore  # type: ignore[method-assign]
    yield
    TransactionTestCase._fixture_teardown = _flush_and_migrate  # type: ignore[method-assign]


@pytest.fixture(scope="session")
def repo_root():
    """The repository checkout (manage.py lives here)."""
    return REPO


@pytest.fixture
def fast_password_hashing(settings):
    """MD5 hashing for tests that create many users (never used outside tests)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
