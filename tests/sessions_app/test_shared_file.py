"""Turns from several processes on one session: a bot on SQLiteSessionStore and the site on one SQLite
file, two site processes on that file, two site processes on PostgreSQL."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

from tests.processes import REPO, run_manage, site_env

pytestmark = pytest.mark.slow

TURNS = 25


def start(kind: str, db, tag: str, go):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.sessions_app._turns", kind, str(db), "shared", tag, str(TURNS), str(go)],
        cwd=REPO, env=site_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def play_together(kinds: dict[str, str], db, tmp_path) -> dict[str, list]:
    """Start one process per tag, wait until each has its store open, let them go; what each engine saw."""
    go = tmp_path / "go"
    procs = {tag: start(kind, db, tag, go) for tag, kind in kinds.items()}
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.{tag}").exists() for tag in procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    seen = {}
    for tag, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        seen[tag] = json.loads(out)
    return seen


def assert_strictly_alternating(history: list[tuple[str, str]], seen: dict[str, list]) -> None:
    assert len(history) == 2 * TURNS * len(seen)
    assert [role for role, _ in history] == ["user", "model"] * (TURNS * len(seen))
    contents = [content for _, content in history]
    for question, answer in zip(contents[::2], contents[1::2], strict=True):
        assert answer == "A" + question[1:]
    tags = [question.split(":")[1] for question in contents[::2]]
    assert sum(a != b for a, b in zip(tags, tags[1:], strict=False)) >= 5, tags  # the processes really contended
    for shown in [turn for turns in seen.values() for turn in turns]:
        # Every turn saw every turn committed before it, and nothing else: serialised across processes.
        position = len(shown) - 1
        assert shown == contents[:position] + [contents[position]]


def sqlite_history(db) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT role, content FROM chatflow_messages WHERE session_id = 'shared' ORDER BY id"))


@pytest.mark.parametrize(
    "kinds",
    [{"site": "django", "bot": "sqlite"}, {"site": "django", "site2": "django"}],
    ids=["site-and-bot", "two-sites"],
)
def test_turns_from_several_processes_on_one_sqlite_file_strictly_alternate(tmp_path, kinds):
    db = tmp_path / "shared.db"
    assert run_manage("migrate", "--noinput", env=site_env(DATABASE_URL=f"sqlite:///{db}")).returncode == 0

    seen = play_together(kinds, db, tmp_path)

    assert_strictly_alternating(sqlite_history(db), seen)


@pytest.mark.postgres
def test_turns_from_two_site_processes_on_postgresql_strictly_alternate(tmp_path, transactional_db):
    from django.db import connection

    from sessions_app.models import ChatMessage

    if connection.vendor != "postgresql":
        pytest.skip("runs in the PostgreSQL pass of dev.py test")
    s = connection.settings_dict
    url = f"postgres://{s['USER']}@{s['HOST']}:{s['PORT']}/{s['NAME']}"

    seen = play_together({"site": "django", "site2": "django"}, url, tmp_path)

    history = list(ChatMessage.objects.filter(session_id="shared").order_by("id").values_list("role", "content"))
    assert_strictly_alternating(history, seen)
