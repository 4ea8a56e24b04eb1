"""The database connection the site opens: SQLite in WAL with a busy timeout and IMMEDIATE transactions."""

import pytest
from django.db import connection


@pytest.mark.django_db
def test_sqlite_connections_use_wal_and_wait_for_locks():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-only connection options")
    with connection.cursor() as cursor:
        assert cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert cursor.execute("PRAGMA busy_timeout").fetchone()[0] == 20000
        assert cursor.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert connection.transaction_mode == "IMMEDIATE"


@pytest.mark.django_db
def test_timestamps_are_time_zone_aware_utc():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    from django.conf import settings

    assert settings.USE_TZ is True
    assert settings.TIME_ZONE == "UTC"
