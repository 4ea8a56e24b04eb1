"""The pipeline's queue samples and delivery traces became webhooks_app's models (they were health_app's): on a
database migrated before the move, their content types move with them, so the permissions a group was granted
stay the same rows, and no second content type is made."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.processes import run_manage, site_env

MOVED = ("queuesample", "deliverytrace")


def _migrate(db: Path, *target: str) -> None:
    result = run_manage("migrate", "--noinput", *target, env=site_env(DATABASE_URL=f"sqlite:///{db}"))
    assert result.returncode == 0, result.stderr


def test_a_database_from_before_the_move_keeps_the_content_types_and_their_grants(tmp_path):
    db = tmp_path / "before.sqlite3"
    _migrate(db, "auth")
    _migrate(db, "webhooks_app", "0005_reply_held")
    _migrate(db, "health_app", "0003_queue_samples")
    with sqlite3.connect(db) as conn:
        # What the code before the move left: its content types and permissions under health_app, one granted.
        moved = "SELECT id FROM django_content_type WHERE model IN (?, ?)"
        conn.execute(f"DELETE FROM auth_permission WHERE content_type_id IN ({moved})", MOVED)
        conn.execute("DELETE FROM django_content_type WHERE model IN (?, ?)", MOVED)
        conn.executemany("INSERT INTO django_content_type (app_label, model) VALUES ('health_app', ?)",
                         [(m,) for m in MOVED])
        conn.execute("INSERT INTO auth_permission (name, content_type_id, codename) SELECT 'Can view queue sample', "
                     "id, 'view_queuesample' FROM django_content_type WHERE model = 'queuesample'")
        conn.execute("INSERT INTO auth_group (name) VALUES ('Watchers')")
        conn.execute("INSERT INTO auth_group_permissions (group_id, permission_id) SELECT g.id, p.id "
                     "FROM auth_group g, auth_permission p WHERE p.codename = 'view_queuesample'")
        before = dict(conn.execute("SELECT model, id FROM django_content_type WHERE model IN (?, ?)", MOVED))

    _migrate(db)

    with sqlite3.connect(db) as conn:
        after = conn.execute("SELECT app_label, model, id FROM django_content_type WHERE model IN (?, ?) "
                             "ORDER BY model", MOVED).fetchall()
        granted = conn.execute("SELECT ct.app_label, p.codename FROM auth_group_permissions gp "
                               "JOIN auth_permission p ON p.id = gp.permission_id "
                               "JOIN django_content_type ct ON ct.id = p.content_type_id "
                               "JOIN auth_group g ON g.id = gp.group_id WHERE g.name = 'Watchers'").fetchall()
    assert after == [("webhooks_app", "deliverytrace", before["deliverytrace"]),
                     ("webhooks_app", "queuesample", before["queuesample"])]
    assert granted == [("webhooks_app", "view_queuesample")]
