"""SQLiteSessionStore's lease TTL comes from its constructor; stale lease and waiter rows are purged."""

from __future__ import annotations

import sqlite3
import time

import pytest

from chatflow_agent import Agent, SessionBusyError, SQLiteSessionStore

BOT = Agent(name="Bot", instructions="x")


def rows(db: str, table: str) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [r[0] for r in conn.execute(f"SELECT owner FROM {table} ORDER BY owner")]  # noqa: S608


def test_the_lease_ttl_is_a_constructor_argument(tmp_path):
    assert SQLiteSessionStore(str(tmp_path / "a.db")).lease_ttl_seconds == 30.0
    store = SQLiteSessionStore(str(tmp_path / "b.db"), lease_ttl_seconds=0.5)
    assert store.lease_ttl_seconds == 0.5
    store.close()
    with pytest.raises(ValueError, match="lease_ttl_seconds"):
        SQLiteSessionStore(str(tmp_path / "c.db"), lease_ttl_seconds=0)


def test_a_lease_whose_renewals_stopped_blocks_only_for_its_ttl(tmp_path):
    db = str(tmp_path / "l.db")
    dead = SQLiteSessionStore(db, lease_ttl_seconds=0.3)
    held = dead.sync_turn("s", BOT)
    held.__enter__()
    dead.close()  # nothing renews its lease any more
    with sqlite3.connect(db) as conn:
        expires, acquired = conn.execute("SELECT expires_at, acquired_at FROM chatflow_session_leases").fetchone()
    assert 0 < expires - acquired <= 0.3
    live = SQLiteSessionStore(db)
    with pytest.raises(SessionBusyError), live.sync_turn("s", BOT, wait=False):
        pass
    deadline = time.monotonic() + 10
    while True:
        try:
            with live.sync_turn("s", BOT, wait=False):
                break
        except SessionBusyError:
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.02)
    live.close()
    with pytest.raises(SessionBusyError):  # the dead turn lost its lease: it cannot commit any more
        held.__exit__(None, None, None)
    dead.close()


def test_a_turn_purges_the_lease_and_waiter_rows_processes_left_behind(tmp_path):
    db = str(tmp_path / "p.db")
    SQLiteSessionStore(db).close()  # the schema
    now = time.time()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO chatflow_session_leases (session_id, owner, expires_at) VALUES "
                     "('killed', 'dead:1', ?), ('busy', 'alive:1', ?)", (now - 3600, now + 3600))
        conn.execute("INSERT INTO chatflow_session_waiters (session_id, owner, expires_at) VALUES "
                     "('killed', 'dead:2', ?), ('busy', 'alive:2', ?)", (now - 3600, now + 3600))
    store = SQLiteSessionStore(db)
    with store.sync_turn("other", BOT):
        pass
    assert rows(db, "chatflow_session_leases") == ["alive:1"]
    assert rows(db, "chatflow_session_waiters") == ["alive:2"]
    assert store.purge_expired_leases() == 0
    store.close()
